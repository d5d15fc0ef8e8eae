"""What one process saw during training, written as `history.rank<N>.json` in the run dir: per-step losses, samples
per epoch, time.

`HistoryCallback` records it for any module; a hand-written loop can fill a `TrainingHistory` itself. The results
table takes the run's size and speed from rank 0's file, and tests read every rank's back, to compare runs step by
step and to check that each rank of a distributed run saw its share of the data.
"""

import dataclasses
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import lightning as L
import torch
from torch import Tensor


@dataclass
class TrainingHistory:
    """Per-step losses and per-epoch sample counts of one process (`rank` of `world_size`)."""

    rank: int = 0
    world_size: int = 1
    first_epoch: int = 0  # > 0 when training resumed from a checkpoint
    first_step: int = 0  # the optimizer steps before the first of `step_losses` (a resumed run's checkpoint's)
    step_losses: list[float] = field(default_factory=list)
    epoch_losses: list[float] = field(default_factory=list)
    epoch_samples: list[int | None] = field(default_factory=list)  # None: some batch's size could not be read
    fit_seconds: float = 0.0

    def end_epoch(self, losses: list[Tensor], samples: int | None) -> None:
        """Close an epoch: `losses` are its per-step losses, kept as tensors until now to avoid a sync per step."""
        values = torch.stack(losses).tolist() if losses else []
        self.step_losses.extend(values)
        self.epoch_losses.append(sum(values) / len(values) if values else float("nan"))
        self.epoch_samples.append(samples)

    def run_summary(self, run_dir: str | Path) -> dict:
        """The size, speed and place of the run, as both paths' results.json state them (samples of all ranks).

        `samples_per_second` is None where some batch's size could not be read (`batch_size_of`).
        """
        speed = None
        if None not in self.epoch_samples:
            samples = sum(self.epoch_samples) * self.world_size
            speed = samples / self.fit_seconds if self.fit_seconds else float("nan")
        return {
            "epochs": self.first_epoch + len(self.epoch_samples),
            "world_size": self.world_size,
            "fit_seconds": self.fit_seconds,
            "samples_per_second": speed,
            "run_dir": str(run_dir),
        }

    def save(self, run_dir: str | Path) -> Path:
        path = Path(run_dir) / f"history.rank{self.rank}.json"
        path.write_text(json.dumps(asdict(self), indent=1))
        return path

    @classmethod
    def load(cls, path: str | Path) -> "TrainingHistory":
        return cls(**json.loads(Path(path).read_text()))


def training_loss(outputs: object) -> Tensor | None:
    """The loss a `training_step` returned: a tensor, or a dict's "loss" (None where it returned nothing to step)."""
    if isinstance(outputs, Tensor):
        return outputs
    if isinstance(outputs, dict) and isinstance(outputs.get("loss"), Tensor):
        return outputs["loss"]
    return None


class HistoryCallback(L.Callback):
    """Fills a `TrainingHistory` from Lightning's training loop and saves it at the end of `fit`."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self.history = TrainingHistory()
        self._losses: list[Tensor] = []
        self._samples: int | None = 0
        self._start: float | None = None  # None until training starts: a finished run resumed never does

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # After a checkpoint was restored, so current_epoch and global_step are where training resumes.
        self.history = TrainingHistory(
            trainer.global_rank, trainer.world_size, first_epoch=trainer.current_epoch, first_step=trainer.global_step
        )
        self._start = time.perf_counter()

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._losses, self._samples = [], 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = training_loss(outputs)
        if loss is not None:
            self._losses.append(loss.detach())
        size = batch_size_of(batch)
        self._samples = None if size is None or self._samples is None else self._samples + size

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.history.end_epoch(self._losses, self._samples)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._start is None:  # nothing was left to train: the run's epochs are the checkpoint's
            self.history = TrainingHistory(trainer.global_rank, trainer.world_size, first_epoch=trainer.current_epoch)
        else:
            self.history.fit_seconds = time.perf_counter() - self._start
        Path(self.run_dir).mkdir(parents=True, exist_ok=True)
        self.history.save(self.run_dir)


def batch_size_of(batch: object) -> int | None:
    """The number of samples in a batch of any structure (a tensor, a tuple or list, a dict, a dataclass of them): the
    first dimension shared by every tensor in it, or None where there is none or they disagree."""
    sizes = set(first_dimensions(batch))
    return sizes.pop() if len(sizes) == 1 else None


def first_dimensions(batch: object) -> Iterator[int]:
    if isinstance(batch, Tensor):
        if batch.ndim > 0:
            yield batch.shape[0]
    elif isinstance(batch, Mapping):
        for value in batch.values():
            yield from first_dimensions(value)
    elif isinstance(batch, Sequence) and not isinstance(batch, (str, bytes)):
        for value in batch:
            yield from first_dimensions(value)
    elif dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        for item in dataclasses.fields(batch):
            yield from first_dimensions(getattr(batch, item.name))


def summarise_history(run_dir: str, world_size: int, epochs: int) -> dict:
    """Epochs, time and speed from rank 0's history file (written by every strategy, spawned workers included); where
    there is none (callbacks=none records no history), `epochs` (the trainer's count), and no time or speed."""
    history_file = Path(run_dir) / "history.rank0.json"
    if not history_file.is_file():
        summary = TrainingHistory(world_size=world_size, fit_seconds=float("nan")).run_summary(run_dir)
        return summary | {"epochs": epochs, "samples_per_second": None}
    return TrainingHistory.load(history_file).run_summary(run_dir)
