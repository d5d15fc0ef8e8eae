"""A sweep of 4 toy jobs run one at a time (Hydra's own launcher), 2 at once (`hydra/launcher=parallel`) and all at
once (`hydra/launcher=submitit_local`, submitit's local executor, which the slurm part's package brings), at two job
lengths: short jobs (about a second of training each) and long ones (about 30 s). `--quick`, a smoke run, has 2 jobs
of a fraction of a second and a second, and leaves submitit out (a minute even for such jobs); so does a tree without
the slurm part.

One at a time, the jobs share the sweep process's imports; side by side, each slot's worker is a Python of its own
and pays its imports (seconds) before its first job trains. The wall times at the two lengths give each launcher a
line, wall = a + b × (a job's epochs), and where the lines of one at a time and 2 at once cross: the job length from
which running side by side pays (`crossover_s`, in one at a time's training seconds; 0 where side by side wins at any
length, None where it never does). Each sweep runs once (the long one takes minutes); the
ratio's spread is not measured.

The GPU variant (`--gpu`, bench/gpu.sh) runs 8 one-GPU jobs of the `experiment=mnist` recipe (one epoch each), one at a
time and with `hydra/launcher=parallel` (a GPU per job, as many at once as the machine has GPUs).
"""

import importlib.util
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
SUBMITIT = "hydra_plugins.hydra_submitit_launcher"
# Toy epochs of a short and a long job (about 1 s and 30 s of training on the 2-core machine of the first results).
EPOCHS = {"short": 100, "long": 2700}
QUICK_EPOCHS = {"short": 5, "long": 100}


def sweep(overrides: tuple[str, ...], epochs: int, sweep_dir: Path, jobs: int) -> dict:
    """Run the sweep (`epochs`: the toy's, or 0 where `overrides` say what to train); its wall seconds and its jobs'
    mean training seconds (their results.json's `fit_seconds`)."""
    toy = (f"seed=range(1,{jobs + 1})", "logger=none", f"trainer.max_epochs={epochs}") if epochs else ()
    command = [sys.executable, "-m", "project.train", "-m", *toy, *overrides, f"hydra.sweep.dir={sweep_dir}"]
    started = time.perf_counter()
    with (sweep_dir.parent / f"{sweep_dir.name}.log").open("w") as log:
        subprocess.run(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, check=True)
    wall = time.perf_counter() - started
    fits = [json.loads((sweep_dir / str(job) / "results.json").read_text())["fit_seconds"] for job in range(jobs)]
    return {"wall_s": wall, "job_fit_s": statistics.fmean(fits)}


def line(short: dict, long: dict, epochs: dict) -> tuple[float, float]:
    """(a, b) of wall = a + b × a job's epochs, through the short and the long sweep (in epochs, the same for every
    launcher: a job's training seconds are longer where jobs share the cores)."""
    slope = (long["wall_s"] - short["wall_s"]) / (epochs["long"] - epochs["short"])
    return short["wall_s"] - slope * epochs["short"], slope


GPU_JOBS = 8


def run_gpu(settings: Settings, recipe: list[str], scratch: Path) -> dict:
    """8 one-GPU jobs (2 in a smoke run; `--device cpu`, which checks the code, trains them on the CPU)."""
    import torch

    jobs = 2 if settings.quick else GPU_JOBS
    trainer = "trainer=gpu" if settings.device == "cuda" else "trainer=cpu"
    command = (f"seed=range(1,{jobs + 1})", trainer, "trainer.max_epochs=1", "logger=none", *recipe)
    sweeps = {
        name: sweep(launcher + command, 0, scratch / name.replace(" ", "_"), jobs=jobs)
        for name, launcher in (("one at a time", ()), ("side by side", ("hydra/launcher=parallel",)))
    }
    return {"jobs": jobs, "gpus": torch.cuda.device_count(), "sweeps": sweeps}


def compared(quick: bool) -> dict[str, tuple[str, ...]]:
    """The launchers to time: submitit's where its package is here (the slurm part's), and not in a smoke run (a
    minute even for short jobs)."""
    with_submitit = not quick and importlib.util.find_spec(SUBMITIT) is not None
    return {name: launcher for name, launcher in LAUNCHERS.items() if with_submitit or name != "submitit_local"}


def run(settings: Settings, recipe: list[str], scratch: Path) -> dict:
    """(The toy default on the CPU: `recipe` is not used there.)"""
    if settings.gpu_variant:
        return run_gpu(settings, recipe, scratch)
    epochs = QUICK_EPOCHS if settings.quick else EPOCHS
    jobs = 2 if settings.quick else JOBS
    sweeps = {
        name: {
            length: sweep(launcher, count, scratch / f"{name.replace(' ', '_')}-{length}", jobs)
            for length, count in epochs.items()
        }
        for name, launcher in compared(settings.quick).items()
    }
    (a_one, b_one), (a_two, b_two) = (line(**sweeps[name], epochs=epochs) for name in ("one at a time", "2 at once"))
    seconds_per_epoch = sweeps["one at a time"]["long"]["job_fit_s"] / epochs["long"]
    if b_one > b_two:
        crossover = max(0.0, (a_two - a_one) / (b_one - b_two)) * seconds_per_epoch
    else:
        crossover = 0.0 if a_two < a_one else None
    return {"jobs": jobs, "epochs": epochs, "sweeps": sweeps, "crossover_s": crossover}


def rows(result: dict) -> list[Row]:
    sweeps = result["sweeps"]
    if "gpus" in result:
        one, two = sweeps["one at a time"], sweeps["side by side"]
        note = (
            f"{result['jobs']} one-GPU jobs on {result['gpus']} GPU(s), {one['job_fit_s']:.1f} s of training each: "
            f"{two['wall_s']:.0f} s against {one['wall_s']:.0f} s one at a time"
        )
        return [("sweep side by side / one at a time", f"{two['wall_s'] / one['wall_s']:.2f}x", note)]
    one = sweeps["one at a time"]
    found = []
    for name in [name for name in sweeps if name != "one at a time"]:
        for length in ("long", "short"):
            ratio = sweeps[name][length]["wall_s"] / one[length]["wall_s"]
            note = (
                f"{result['jobs']} toy jobs of {one[length]['job_fit_s']:.1f} s of training: "
                f"{sweeps[name][length]['wall_s']:.0f} s against {one[length]['wall_s']:.0f} s one at a time"
            )
            found.append((f"sweep {name}, {length} jobs", f"{ratio:.2f}x", note))
    crossover = result["crossover_s"]
    pays = f"{crossover:.1f} s" if crossover is not None else "never"
    found.append(("sweep 2 at once pays from jobs of", pays, "of training: where its line and one at a time's cross"))
    return found
