"""What a preemption costs: the recipe on Fashion-MNIST (4 epochs) stopped by SIGTERM half-way through its third
epoch, as Slurm stops a job at its time limit, then resumed.

Measured: the seconds from SIGTERM to the process's exit (finishing the step, writing `last.ckpt`, tearing down),
where the checkpoint stood, and the training steps the resumed run does again: none, since it resumes at the step
it stopped after; with checkpoints at epoch ends only it would train the stopped epoch's batches again, whose time
is given from the resumed run's own seconds per step.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from bench.report import Row
from bench.settings import Settings

REPO = Path(__file__).resolve().parents[1]
EPOCHS = 4
# `--quick`'s epochs last a fraction of a second, so a signal a busy machine delivers late could miss a 4-epoch run;
# with 20 the stop still lands inside training, and the resumed run's rest is still quick.
QUICK_EPOCHS = 20
STOPPED_BY_SIGTERM = 128 + signal.SIGTERM
# The mid-epoch checkpoint (the optional part mid_epoch), which writes last.ckpt when SIGTERM stops the run.
MID_EPOCH_ON = "callbacks.mid_epoch_checkpoint.enabled=true"


def train(overrides: list[str], run_dir: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "project.train", *overrides, "logger=none", f"hydra.run.dir={run_dir}"]
    return subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_for(condition, proc: subprocess.Popen, what: str, timeout: float = 600) -> None:
    """Poll `condition` until it holds, while the run goes on."""
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the run ended or took too long before {what} (exit {proc.returncode})")
        time.sleep(0.01)


def run(settings: Settings, recipe: list[str], scratch: Path) -> dict:
    epochs = QUICK_EPOCHS if settings.quick else EPOCHS
    overrides = [*recipe, settings.trainer_override(), f"trainer.max_epochs={epochs}", MID_EPOCH_ON]
    stopped_dir, resumed_dir = scratch / "stopped", scratch / "resumed"
    last = stopped_dir / "checkpoints" / "last.ckpt"
    proc = train(overrides, stopped_dir)
    # last.ckpt is rewritten at each epoch's end: the second epoch's length is the time between the first two.
    wait_for(last.exists, proc, "the first epoch's end")
    first = last.stat().st_mtime
    wait_for(lambda: last.stat().st_mtime > first, proc, "the second epoch's end")
    time.sleep((last.stat().st_mtime - first) / 2)
    proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    status = proc.wait(timeout=600)
    stop_seconds = time.monotonic() - sent
    if status != STOPPED_BY_SIGTERM:
        raise RuntimeError(f"the run was to stop on SIGTERM (exit {STOPPED_BY_SIGTERM}), it exited {status}")
    checkpoint = torch.load(last, map_location="cpu", weights_only=True)
    position = next(value for key, value in checkpoint.items() if key.endswith("DataModule"))["position"]

    resumed = train([*overrides, f"ckpt_path={last}"], resumed_dir)
    if resumed.wait(timeout=1200) != 0:
        raise RuntimeError(f"the resumed run failed (exit {resumed.returncode})")
    history = json.loads((resumed_dir / "history.rank0.json").read_text())
    seconds_per_step = history["fit_seconds"] / len(history["step_losses"])
    steps_per_epoch = (checkpoint["global_step"] - position["batches_done"]) // position["epoch"]
    return {
        "overrides": overrides,
        "exit_status": status,
        "stop_seconds": stop_seconds,
        "checkpoint_mb": os.path.getsize(last) / 2**20,
        "stopped_after_step": checkpoint["global_step"],
        "epoch": position["epoch"],
        "batches_done": position["batches_done"],
        "steps_per_epoch": steps_per_epoch,
        "resumed_at_step": history["first_step"],
        "steps_trained_again": checkpoint["global_step"] - history["first_step"],
        "steps_trained_again_with_epoch_end_checkpoints_only": position["batches_done"],
        "seconds_per_step": seconds_per_step,
        "seconds_trained_again_with_epoch_end_checkpoints_only": position["batches_done"] * seconds_per_step,
    }


def rows(result: dict) -> list[Row]:
    where = (
        f"step {result['stopped_after_step']}: epoch {result['epoch']}, batch {result['batches_done']} "
        f"of {result['steps_per_epoch']}; last.ckpt {result['checkpoint_mb']:.1f} MB"
    )
    again = result["steps_trained_again_with_epoch_end_checkpoints_only"]
    seconds = result["seconds_trained_again_with_epoch_end_checkpoints_only"]
    return [
        ("preemption: SIGTERM to exit, checkpoint written", f"{result['stop_seconds']:6.2f} s", where),
        (
            "preemption: steps the resumed run trains again",
            f"{result['steps_trained_again']:6d}",
            f"with epoch-end checkpoints only: {again} ({seconds:.1f} s)",
        ),
    ]
