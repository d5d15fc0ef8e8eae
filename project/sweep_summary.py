"""The table printed at the end of every `-m` sweep: one line per job, its overrides, its metric, its dir.

It reads what each job left in its directory (`results.json`, `.hydra/overrides.yaml`) rather than what the jobs
returned, so it works the same whichever launcher ran them (in this process, or as Slurm jobs via submitit).
"""

import json
import math
from pathlib import Path
from typing import Any

import yaml
from hydra.experimental.callback import Callback
from omegaconf import DictConfig


def job_rows(sweep_dir: Path, metric: str) -> list[tuple[str, str, float, str]]:
    """(job, overrides, metric, dir) for each job directory of the sweep, in job order; NaN where a job failed."""
    rows = []
    job_dirs = [path for path in sweep_dir.iterdir() if (path / ".hydra" / "overrides.yaml").is_file()]
    for job_dir in sorted(job_dirs, key=lambda path: (len(path.name), path.name)):
        overrides = " ".join(yaml.safe_load((job_dir / ".hydra" / "overrides.yaml").read_text()) or [])
        results_file = job_dir / "results.json"
        value = json.loads(results_file.read_text()).get(metric, math.nan) if results_file.is_file() else math.nan
        rows.append((job_dir.name, overrides, value, str(job_dir)))
    return rows


def format_sweep_table(rows: list[tuple[str, str, float, str]], metric: str) -> str:
    width = max([len("overrides"), *(len(overrides) for _, overrides, _, _ in rows)])
    lines = [f"{'job':<5}{'overrides':<{width + 2}}{metric:>12}  dir"]
    lines += [f"{job:<5}{overrides:<{width + 2}}{value:>12.4f}  {path}" for job, overrides, value, path in rows]
    rule = "-" * max(len(line) for line in lines)
    return "\n".join([rule, f"Sweep: {len(rows)} job(s)", rule, *lines, rule])


class SweepSummaryCallback(Callback):
    """Prints the sweep's table once all its jobs have ended (Hydra calls it in the launching process)."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if sweep_dir.is_dir():
            rows = job_rows(sweep_dir, config.optimized_metric)
            print(format_sweep_table(rows, config.optimized_metric), flush=True)
