"""W&B's offline runs read back with wandb's own reader, `wandb leet inspect` (its records and its summary as JSON)."""

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass
class OfflineRun:
    """One offline run: the summary `wandb leet inspect --summary` prints (state, name, config, last values) and
    the records of its .wandb file."""

    summary: dict
    records: list[dict]

    @property
    def config(self) -> dict:
        return self.summary["config"]

    @property
    def group(self) -> str | None:
        (run,) = [record["run"] for record in self.records if record["type"] == "run"]
        return run.get("run_group")

    def history(self, metric: str) -> list[tuple[int, float]]:
        """(trainer/global_step, value) of each logged `metric`, in order."""
        items = [record["history"]["item"] for record in self.records if record["type"] == "history"]
        return [(item["trainer/global_step"], item[metric]) for item in items if metric in item]

    def metric_names(self) -> set[str]:
        items = [record["history"]["item"] for record in self.records if record["type"] == "history"]
        return {name for item in items for name in item if not name.startswith("_")}


def inspect(path: Path, *flags: str) -> str:
    command = [sys.executable, "-m", "wandb", "leet", "inspect", *flags, "--json", str(path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def offline_runs(run_dir: Path) -> list[OfflineRun]:
    """The offline W&B runs in `run_dir` (its wandb/offline-run-*/ folders), oldest first."""
    runs = []
    for path in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb")):
        records = [json.loads(line) for line in inspect(path).splitlines()]
        runs.append(OfflineRun(json.loads(inspect(path, "--summary")), records))
    return runs
