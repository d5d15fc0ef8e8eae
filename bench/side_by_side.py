"""The README's side-by-side sweep timed against the same jobs one at a time, with the threads each job trained with.

On the CPU the command is docs/parallel.md's, as a user types it, with its default logger and callbacks:
`python -m project.train -m trainer=cpu seed=1,2,3,4 hydra/launcher=parallel hydra.launcher.jobs_at_once=2`, and one
at a time the same without the launcher (Hydra's own runs the jobs in the sweep's process). Three workloads: the toy
at two job lengths (`trainer.max_epochs=300` and `1500`, about 3 s and 15 s of training alone on a 2-core machine) and
the `experiment=mnist` recipe (10 epochs) on generated MNIST files (`generated_mnist`: no download). `--quick`, a
smoke run, has 2 jobs, the toy at 5 and 30 epochs and the recipe for one epoch on 600 images.

Every job also records, from inside its training, what it trained with (`JobThreads`, one callback added to the
defaults): its cores, torch's intra-op and inter-op threads, OpenMP's own count and its device; the table prints
them beside each sweep's time, so a ratio is never read without the conditions that made it. One at a time, the jobs
share the sweep process's imports; side by side, each slot's worker is a Python of its own and pays its imports
(seconds) before its first job trains. The toy's two lengths give each launcher a line, wall = a + b × (a job's
epochs), and where the lines of one at a time and 2 at once cross: the job length from which running side by side
pays (`crossover_s`, in one at a time's training seconds; 0 where side by side wins at any length, None where it
never does). Each sweep runs once (the long ones take minutes); the ratio's spread is not measured.

The GPU variant (`--gpu`, bench/gpu.sh) runs 8 one-GPU jobs of the `experiment=mnist` recipe (one epoch each), one at a
time and with `hydra/launcher=parallel` (a GPU per job, as many at once as the machine has GPUs).
"""

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import numpy as np
import torch

from bench.dataset import FILES, write_idx
from bench.report import Row
from bench.settings import Settings
from project.optional.parallel.worker import openmp_threads

REPO = Path(__file__).resolve().parents[1]
JOBS = 4
LAUNCHERS = {"one at a time": (), "2 at once": ("hydra/launcher=parallel", "hydra.launcher.jobs_at_once=2")}
# The toy's epochs per job: about 3 s and 15 s of training alone on the 2-core machine the issue was found on.
TOY_EPOCHS = {"short": 300, "long": 1500}
QUICK_TOY_EPOCHS = {"short": 5, "long": 30}
# MNIST's sizes (train, test), and the quick run's.
MNIST_IMAGES = {"train": 60_000, "test": 10_000}
QUICK_MNIST_IMAGES = {"train": 600, "test": 100}
# Issue 57's goal: 4 jobs of at least 10 s of training each, 2 at once on 2 cores, in at most 0.6 of the time.
GOAL, GOAL_FROM_S = 0.6, 10.0
PROBE = f"+callbacks.job_threads._target_={__name__}.JobThreads"
THREADS_FILE = "threads.json"


class JobThreads(L.Callback):
    """Writes `threads.json` into the job's dir after its first training step: what rank 0 trains with."""

    def __init__(self) -> None:
        self.written = False

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        if self.written or trainer.global_rank != 0:
            return
        seen = {
            "cores": len(os.sched_getaffinity(0)),
            "intra_op": torch.get_num_threads(),
            "inter_op": torch.get_num_interop_threads(),
            "openmp": openmp_threads(),
            "device": str(pl_module.device),
        }
        Path(trainer.default_root_dir, THREADS_FILE).write_text(json.dumps(seen))
        self.written = True


def generated_mnist(root: Path, sizes: dict[str, int]) -> Path:
    """`root` holding MNIST's four IDX files of learnable images, as tests/idx_files.py writes them (class c lights
    rows 2c+4 and 2c+5 over noise), so that the recipe trains on MNIST's sizes without a download."""
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    generator = np.random.default_rng(0)
    for split, (images_name, labels_name) in FILES.items():
        labels = generator.integers(0, 10, sizes[split], dtype=np.uint8)
        images = generator.integers(0, 60, (sizes[split], 28, 28), dtype=np.uint8)
        for label in range(10):
            images[labels == label, 2 * label + 4 : 2 * label + 6, 4:24] = 250
        write_idx(raw / images_name, images)
        write_idx(raw / labels_name, labels)
    return root


def sweep(overrides: tuple[str, ...], sweep_dir: Path, jobs: int) -> dict:
    """Run `python -m project.train -m <overrides>` on `jobs` seeds: its wall seconds, its jobs' mean training
    seconds (their results.json's `fit_seconds`) and what each job trained with (`JobThreads`)."""
    seeds = f"seed={','.join(str(seed) for seed in range(1, jobs + 1))}"
    command = [sys.executable, "-m", "project.train", "-m", *overrides, seeds, PROBE, f"hydra.sweep.dir={sweep_dir}"]
    started = time.perf_counter()
    with (sweep_dir.parent / f"{sweep_dir.name}.log").open("w") as log:
        subprocess.run(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, check=True)
    wall = time.perf_counter() - started
    job_dirs = [sweep_dir / str(job) for job in range(jobs)]
    fits = [json.loads((job_dir / "results.json").read_text())["fit_seconds"] for job_dir in job_dirs]
    seen = [json.loads((job_dir / THREADS_FILE).read_text()) for job_dir in job_dirs]
    return {"wall_s": wall, "job_fit_s": statistics.fmean(fits), "job_threads": seen}


def toy(epochs: int) -> str:
    return f"toy {epochs} epochs"


def workloads(settings: Settings, scratch: Path) -> dict[str, tuple[str, ...]]:
    """The CPU sweeps' workloads, by name: the toy at its two lengths, and the MNIST recipe."""
    root = generated_mnist(scratch / "mnist", QUICK_MNIST_IMAGES if settings.quick else MNIST_IMAGES)
    recipe = ("experiment=mnist", f"data.root={root}", "data.download=false")
    quick_recipe = ("trainer.max_epochs=1", "data.val_size=100") if settings.quick else ()
    toy_epochs = QUICK_TOY_EPOCHS if settings.quick else TOY_EPOCHS
    return {toy(epochs): (f"trainer.max_epochs={epochs}",) for epochs in toy_epochs.values()} | {
        "mnist recipe": (*recipe, *quick_recipe)
    }


def line(short: dict, long: dict, epochs: dict) -> tuple[float, float]:
    """(a, b) of wall = a + b × a job's epochs, through the short and the long sweep (in epochs, the same for every
    launcher: a job's training seconds are longer where jobs share the cores)."""
    slope = (long["wall_s"] - short["wall_s"]) / (epochs["long"] - epochs["short"])
    return short["wall_s"] - slope * epochs["short"], slope


def crossover(sweeps: dict, epochs: dict[str, int]) -> float | None:
    """The toy job's training seconds (one at a time's) from which 2 at once is the faster sweep."""
    (a_one, b_one), (a_two, b_two) = (
        line(sweeps[name][toy(epochs["short"])], sweeps[name][toy(epochs["long"])], epochs) for name in LAUNCHERS
    )
    seconds_per_epoch = sweeps["one at a time"][toy(epochs["long"])]["job_fit_s"] / epochs["long"]
    if b_one > b_two:
        return max(0.0, (a_two - a_one) / (b_one - b_two)) * seconds_per_epoch
    return 0.0 if a_two < a_one else None


GPU_JOBS = 8


def run_gpu(settings: Settings, recipe: list[str], scratch: Path) -> dict:
    """8 one-GPU jobs (2 in a smoke run; `--device cpu`, which checks the code, trains them on the CPU)."""
    jobs = 2 if settings.quick else GPU_JOBS
    command = (settings.trainer_override(), "trainer.max_epochs=1", "logger=none", *recipe)
    sweeps = {
        name: sweep(launcher + command, scratch / name.replace(" ", "_"), jobs=jobs)
        for name, launcher in (("one at a time", ()), ("side by side", ("hydra/launcher=parallel",)))
    }
    return {"jobs": jobs, "gpus": torch.cuda.device_count(), "sweeps": sweeps}


def run(settings: Settings, recipe: list[str], scratch: Path) -> dict:
    """(On the CPU the recipe runs on generated MNIST files: `recipe`, the bench's Fashion-MNIST, is the GPU
    variant's.)"""
    if settings.gpu_variant:
        return run_gpu(settings, recipe, scratch)
    jobs = 2 if settings.quick else JOBS
    loads = workloads(settings, scratch)
    sweeps = {
        name: {
            load: sweep(("trainer=cpu", *launcher, *overrides), scratch / f"{name.replace(' ', '_')}-{index}", jobs)
            for index, (load, overrides) in enumerate(loads.items())
        }
        for name, launcher in LAUNCHERS.items()
    }
    epochs = QUICK_TOY_EPOCHS if settings.quick else TOY_EPOCHS
    return {"jobs": jobs, "epochs": epochs, "sweeps": sweeps, "crossover_s": crossover(sweeps, epochs)}


def conditions(job_threads: list[dict]) -> str:
    """What a sweep's jobs trained with, each different condition once: `1 core: 1 intra-op, 1 inter-op, 1 OpenMP
    thread(s), cpu (jobs 0, 1)`."""
    jobs_of: dict[str, list[str]] = {}
    for job, seen in enumerate(job_threads):
        text = (
            f"{seen['cores']} core(s): {seen['intra_op']} intra-op, {seen['inter_op']} inter-op, {seen['openmp']} "
            f"OpenMP thread(s), {seen['device']}"
        )
        jobs_of.setdefault(text, []).append(str(job))
    return "; ".join(f"{text} (job {', '.join(jobs)})" for text, jobs in jobs_of.items())


def rows(result: dict) -> list[Row]:
    sweeps = result["sweeps"]
    if "gpus" in result:
        one, two = sweeps["one at a time"], sweeps["side by side"]
        note = (
            f"{result['jobs']} one-GPU jobs on {result['gpus']} GPU(s), {one['job_fit_s']:.1f} s of training each: "
            f"{two['wall_s']:.0f} s against {one['wall_s']:.0f} s one at a time"
        )
        return [("sweep side by side / one at a time", f"{two['wall_s'] / one['wall_s']:.2f}x", note)]
    one, two = sweeps["one at a time"], sweeps["2 at once"]
    found = []
    for load in one:
        note = (
            f"{result['jobs']} jobs of {one[load]['job_fit_s']:.1f} s of training alone: {two[load]['wall_s']:.0f} s "
            f"against {one[load]['wall_s']:.0f} s one at a time"
        )
        if one[load]["job_fit_s"] >= GOAL_FROM_S:
            note += f", goal <= {GOAL:.2f}"
        found.append(
            (f"sweep 2 at once / one at a time, {load}", f"{two[load]['wall_s'] / one[load]['wall_s']:.2f}x", note)
        )
    pays = f"{result['crossover_s']:.1f} s" if result["crossover_s"] is not None else "never"
    found.append(
        ("sweep 2 at once pays from toy jobs of", pays, "of training: where its line and one at a time's cross")
    )
    return found


def details(result: dict) -> list[str]:
    """Under the table: what each sweep's jobs trained with (cores, threads, device)."""
    sweeps = result["sweeps"]
    if "gpus" in result:
        return [f"  {name}: {conditions(timed['job_threads'])}" for name, timed in sweeps.items()]
    return [
        f"  {load}, {name}: {conditions(sweeps[name][load]['job_threads'])}"
        for load in sweeps["one at a time"]
        for name in sweeps
    ]
