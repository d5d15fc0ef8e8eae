"""A sweep that stopped part-way (SIGTERM, Ctrl-C, a node lost) is carried on by the same command with its
`hydra.sweep.dir`, which its stop names (`continue_hint`):
- a job that finished there (its results.json) is not run again: its results stand as they were;
- the job that stopped resumes from its own checkpoints/last.ckpt (`project.runs.checkpoints.resume_path`);
- the jobs it had not reached run afresh.
Job N of the same sweep is the same job (the same overrides in the same order), so a sweep dir whose sweep had other
overrides is refused before any job runs (`check_same_sweep`). An Optuna search numbers its trials on by itself
(hydra_plugins/resumable_optuna_sweeper), so its finished jobs are never met again.
"""

import json
import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from project.runs.run_log import report

# What Hydra's sweepers write into the sweep dir as the sweep starts: its config, the command's overrides included.
SWEEP_CONFIG = "multirun.yaml"


def check_same_sweep(config: DictConfig) -> None:
    """Before the first job: a sweep dir that holds an earlier sweep holds this one; otherwise the sweep ends in one
    line. (An Optuna search's sweeper checks its own database.)"""
    sweep_dir = Path(config.hydra.sweep.dir)
    stored = sweep_dir / SWEEP_CONFIG
    if not stored.is_file():
        return
    theirs, mine = (OmegaConf.to_container(c.hydra.overrides.task) for c in (OmegaConf.load(stored), config))
    if theirs != mine:
        refuse(
            f"hydra.sweep.dir={sweep_dir} holds another sweep ({' '.join(theirs) or 'no overrides'}; this one: "
            f"{' '.join(mine) or 'no overrides'}), whose jobs this one would mix with its own: give a new "
            "hydra.sweep.dir, or carry that sweep on with its own command"
        )
    report(f"carrying on the sweep in {sweep_dir}: its finished jobs are not run again, a stopped one resumes")


def refuse(line: str) -> None:
    """End the sweep in one line before any job (in a Hydra callback or sweeper, where an exception would be Hydra's
    traceback)."""
    print(f"error: {line}", file=sys.stderr, flush=True)
    sys.exit(2)


def finished_results(run_dir: str | Path) -> dict | None:
    """The results this sweep job left when an earlier run of its sweep finished it, if it did."""
    results_file = Path(run_dir) / "results.json"
    return json.loads(results_file.read_text()) if results_file.is_file() else None


def continue_hint() -> str:
    """How to carry on the sweep this job belongs to."""
    hydra = HydraConfig.get()
    given = any(override.startswith("hydra.sweep.dir=") for override in hydra.overrides.hydra)
    where = "" if given else f" plus hydra.sweep.dir={Path(hydra.sweep.dir).resolve()}"
    return f"carry the sweep on with the same command{where} (its finished jobs are not run again)"
