"""Test-only callbacks that signal their own process (or another), to interrupt a run as a crash, a preemption or a
lost server would, or hold it at a known point while the test changes the world around it.

A process signals itself with `signal.raise_signal`, which the process gets before the call returns: in a process
the tests' preloaded Python forked for a launcher (tests/preloaded_python.py), `os.getpid()` is its stand-in's.
"""

import os
import signal
import time
from pathlib import Path

import lightning as L


class KillAtEpochStart(L.Callback):
    """SIGKILLs the process when epoch `epoch` starts: epochs before it are complete and checkpointed.

    `rank`: only the process of that global rank dies (the others are left to notice); `attempt`: only in that
    torchrun attempt (TORCHELASTIC_RESTART_COUNT), so that the restarted processes run on.
    """

    def __init__(self, epoch: int, rank: int | None = None, attempt: int | None = None) -> None:
        self.epoch, self.rank, self.attempt = epoch, rank, attempt

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch != self.epoch or self.rank not in (None, trainer.global_rank):
            return
        if self.attempt is None or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == self.attempt:
            signal.raise_signal(signal.SIGKILL)


class SignalAtStep(L.Callback):
    """Sends `signal` (a name: SIGKILL, SIGTERM) to its own process once optimizer step `step` has finished.

    `rank`: only the process of that global rank sends it; `restart`: only in that Slurm attempt
    (SLURM_RESTART_COUNT), so that a requeued job runs on.
    """

    def __init__(self, step: int, signal: str, rank: int | None = 0, restart: int | None = None) -> None:
        self.step, self.signal, self.rank, self.restart = step, signal, rank, restart

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        if trainer.global_step != self.step or self.rank not in (None, trainer.global_rank):
            return
        if self.restart is None or int(os.environ.get("SLURM_RESTART_COUNT", "0")) == self.restart:
            signal.raise_signal(getattr(signal, self.signal))


class SignalInValidation(L.Callback):
    """Sends `signal` to its own process as the first validation batch of epoch `epoch`'s end starts (during fit)."""

    def __init__(self, epoch: int, signal: str) -> None:
        self.epoch, self.signal = epoch, signal

    def on_validation_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx, *args):
        if trainer.state.fn == "fit" and trainer.current_epoch == self.epoch and batch_idx == 0:
            signal.raise_signal(getattr(signal, self.signal))


class SignalAtBatch(L.Callback):
    """Sends `signal` to its own process as training batch `batch` of the run (counted from 1) starts, so that it
    arrives while that batch trains: unlike `SignalAtStep`, inside a gradient-accumulation window too."""

    def __init__(self, batch: int, signal: str) -> None:
        self.batch, self.signal, self.seen = batch, signal, 0

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx) -> None:
        self.seen += 1
        if self.seen == self.batch:
            signal.raise_signal(getattr(signal, self.signal))


class KillProcessGroupAtStep(L.Callback):
    """SIGKILLs the process group `pgid` (a server the run talks to, say) once optimizer step `step` has finished."""

    def __init__(self, step: int, pgid: int) -> None:
        self.step, self.pgid = step, pgid

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step and trainer.global_rank == 0:
            os.killpg(self.pgid, signal.SIGKILL)


class HoldAtEpochEnd(L.Callback):
    """At the end of training epoch `epoch`, before its checkpoint is written (Lightning calls checkpoint callbacks
    last), creates `ready` and waits until `go` exists: the test acts between the two, at a point it knows.

    Waits at most `patience` seconds, then goes on, so a test that never says go cannot hang the run forever.
    """

    def __init__(self, epoch: int, ready: str, go: str, patience: float = 600) -> None:
        self.epoch, self.ready, self.go, self.patience = epoch, Path(ready), Path(go), patience

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch != self.epoch:
            return
        self.ready.touch()
        deadline = time.monotonic() + self.patience
        while not self.go.exists() and time.monotonic() < deadline:
            time.sleep(0.01)


class HoldAtStep(L.Callback):
    """Sleeps `seconds` once optimizer step `step` has finished: a `trainer.max_time` shorter than that ends the run
    there, part-way through an epoch, as a time limit does."""

    def __init__(self, step: int, seconds: float) -> None:
        self.step, self.seconds = step, seconds

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: object) -> None:
        if trainer.global_step == self.step:
            time.sleep(self.seconds)


class RaiseAtEpochStart(L.Callback):
    """Raises a KeyError (a bug) when epoch `epoch` starts, in the process of global rank `rank` alone: the others go
    on into the epoch's first collective."""

    def __init__(self, epoch: int, rank: int) -> None:
        self.epoch, self.rank = epoch, rank

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch == self.epoch and trainer.global_rank == self.rank:
            raise KeyError(f"a bug of rank {self.rank}'s")
