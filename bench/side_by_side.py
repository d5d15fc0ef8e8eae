"""A sweep of 4 toy jobs run one at a time (Hydra's own launcher), 2 at once (`hydra/launcher=parallel`) and all at
once (`hydra/launcher=submitit_local`, submitit's local executor, which the slurm part's package brings), at two job
lengths: short jobs (about a second of training each) and long ones (about 30 s; `--quick`: a few seconds).

One at a time, the jobs share the sweep process's imports; side by side, each job is a Python of its own and pays
its imports (seconds) before it trains. The wall times at the two lengths give each launcher a line, wall = a + b ×
(a job's training seconds), and where the lines of one at a time and 2 at once cross: the job length from which
running side by side pays (`crossover_s`). Each sweep runs once (the long one takes minutes); the ratio's spread is
not measured.
"""

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.report import Row
from bench.settings import Settings

REPO = Path(__file__).resolve().parents[1]
JOBS = 4
LAUNCHERS = {
    "one at a time": (),
    "2 at once": ("hydra/launcher=parallel", "hydra.launcher.jobs_at_once=2"),
    "submitit_local": ("hydra/launcher=submitit_local",),
}
# Toy epochs of a short and a long job (about 1 s and 30 s of training on the 2-core machine of the first results).
EPOCHS = {"short": 100, "long": 2700}
QUICK_EPOCHS = {"short": 50, "long": 500}


def sweep(launcher: tuple[str, ...], epochs: int, sweep_dir: Path) -> dict:
    """Run the sweep; its wall seconds and its jobs' mean training seconds (their results.json's `fit_seconds`)."""
    command = [
        sys.executable,
        "-m",
        "project.train",
        "-m",
        f"seed=range(1,{JOBS + 1})",
        "logger=none",
        f"trainer.max_epochs={epochs}",
        *launcher,
        f"hydra.sweep.dir={sweep_dir}",
    ]
    started = time.perf_counter()
    with (sweep_dir.parent / f"{sweep_dir.name}.log").open("w") as log:
        subprocess.run(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, check=True)
    wall = time.perf_counter() - started
    fits = [json.loads((sweep_dir / str(job) / "results.json").read_text())["fit_seconds"] for job in range(JOBS)]
    return {"wall_s": wall, "job_fit_s": statistics.fmean(fits)}


def line(short: dict, long: dict) -> tuple[float, float]:
    """(a, b) of wall = a + b × job training seconds, through the short and the long sweep."""
    slope = (long["wall_s"] - short["wall_s"]) / (long["job_fit_s"] - short["job_fit_s"])
    return short["wall_s"] - slope * short["job_fit_s"], slope


def run(settings: Settings, recipe: list[str], scratch: Path) -> dict:
    """(The toy default: `recipe` is not used.)"""
    epochs = QUICK_EPOCHS if settings.quick else EPOCHS
    sweeps = {
        name: {
            length: sweep(launcher, count, scratch / f"{name.replace(' ', '_')}-{length}")
            for length, count in epochs.items()
        }
        for name, launcher in LAUNCHERS.items()
    }
    (a_one, b_one), (a_two, b_two) = line(**sweeps["one at a time"]), line(**sweeps["2 at once"])
    crossover = (a_two - a_one) / (b_one - b_two) if b_one > b_two else None
    return {"jobs": JOBS, "epochs": epochs, "sweeps": sweeps, "crossover_s": crossover}


def rows(result: dict) -> list[Row]:
    sweeps = result["sweeps"]
    one = sweeps["one at a time"]
    found = []
    for name in ("2 at once", "submitit_local"):
        for length in ("long", "short"):
            ratio = sweeps[name][length]["wall_s"] / one[length]["wall_s"]
            note = (
                f"{result['jobs']} toy jobs of {one[length]['job_fit_s']:.1f} s of training: "
                f"{sweeps[name][length]['wall_s']:.0f} s against {one[length]['wall_s']:.0f} s one at a time"
            )
            found.append((f"sweep {name} / one at a time ({length} jobs)", f"{ratio:.2f}x", note))
    crossover = result["crossover_s"]
    pays = f"from jobs of about {crossover:.1f} s of training" if crossover is not None else "never, here"
    found.append(("sweep side by side pays", pays, "where the lines through the short and long sweeps cross"))
    return found
