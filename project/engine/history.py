"""What each process saw in training (`history.rank<N>.json`: per-step losses, samples per epoch, time), and the stop
of a run whose loss or gradients turn NaN or infinite: one line, before any checkpoint of such weights is written."""

import dataclasses
import json
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import lightning as L
import torch
import torch.distributed as dist
from torch import Tensor

from project.engine.errors import UserError


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
    fit_seconds: float = 0.0  # of every start that carried this history on
    # The optimizer steps at which a later start of the run, resumed in its own dir, carried this history on.
    resumed_at_steps: list[int] = field(default_factory=list)

    def end_epoch(self, losses: list[Tensor], samples: int | None) -> None:
        """Close an epoch: `losses` are its per-step losses, kept as tensors until now to avoid a sync per step."""
        values = torch.stack(losses).tolist() if losses else []
        self.step_losses.extend(values)
        self.epoch_losses.append(sum(values) / len(values) if values else float("nan"))
        self.epoch_samples.append(samples)

    def run_summary(self, run_dir: str | Path) -> dict:
        """The run's size, speed (all ranks' samples; None if a batch's size is unknown) and place, for results.json."""
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


def batch_size_of(batch: object) -> int | None:
    """The samples in a batch of any structure (tensors in tuples, lists, dicts, dataclasses): the first dimension
    every tensor in it shares, or None where there is none or they disagree."""
    sizes = {tensor.shape[0] for tensor in tensors_in(batch) if tensor.ndim > 0}
    return sizes.pop() if len(sizes) == 1 else None


def tensors_in(batch: object) -> Iterator[Tensor]:
    if isinstance(batch, Tensor):
        yield batch
    elif isinstance(batch, Mapping):
        for value in batch.values():
            yield from tensors_in(value)
    elif isinstance(batch, Sequence) and not isinstance(batch, (str, bytes)):
        for value in batch:
            yield from tensors_in(value)
    elif dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        for item in dataclasses.fields(batch):
            yield from tensors_in(getattr(batch, item.name))


class HistoryCallback(L.Callback):
    """Fills a `TrainingHistory` from Lightning's training loop and saves it at the end of `fit`."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self.history = TrainingHistory()
        self.losses: list[Tensor] = []
        self.samples: int | None = 0
        self.started_at: float | None = None  # None until training starts: a finished run resumed never does

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # After a checkpoint was restored, so current_epoch and global_step are where training resumes.
        self.history = history_carried_on(self.run_dir, trainer)
        self.started_at = time.perf_counter()

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.losses, self.samples = [], 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = training_loss(outputs)
        if loss is not None:
            self.losses.append(loss.detach())
        size = batch_size_of(batch)
        self.samples = None if size is None or self.samples is None else self.samples + size

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.history.end_epoch(self.losses, self.samples)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.started_at is None:  # nothing was left to train: the run's epochs are the checkpoint's
            self.history = history_carried_on(self.run_dir, trainer)
        else:
            self.history.fit_seconds += time.perf_counter() - self.started_at
        Path(self.run_dir).mkdir(parents=True, exist_ok=True)
        self.history.save(self.run_dir)


def history_carried_on(run_dir: str, trainer: L.Trainer) -> TrainingHistory:
    """The history of this process's training from where the trainer stands (its restored epoch and step): the run
    dir's own history where it ends exactly there, so that a run resumed in its own directory from an epoch-end
    checkpoint keeps its whole history across resumes (project.verify compares every step); else a new one from there
    (another run's checkpoint, a mid-epoch one, another number of processes, or a start that saved none: a SIGTERM,
    a crash)."""
    rank, world_size, epoch, step = trainer.global_rank, trainer.world_size, trainer.current_epoch, trainer.global_step
    new = TrainingHistory(rank, world_size, first_epoch=epoch, first_step=step)
    path = Path(run_dir) / f"history.rank{rank}.json"
    if step == 0 or not path.is_file():
        return new
    try:
        earlier = TrainingHistory.load(path)
        if (
            (earlier.rank, earlier.world_size) == (rank, world_size)
            and earlier.first_step + len(earlier.step_losses) == step
            and earlier.first_epoch + len(earlier.epoch_samples) == epoch
        ):
            return dataclasses.replace(earlier, resumed_at_steps=[*earlier.resumed_at_steps, step])
    except (OSError, ValueError, TypeError):  # not a history this engine wrote whole: the run starts a new one
        return new
    return new


def summarise_history(run_dir: str, world_size: int, epochs: int) -> dict:
    """Epochs, time and speed from rank 0's history file (every strategy writes one); without it (callbacks=none),
    the trainer's `epochs` and no time or speed."""
    history_file = Path(run_dir) / "history.rank0.json"
    if not history_file.is_file():
        summary = TrainingHistory(world_size=world_size, fit_seconds=float("nan")).run_summary(run_dir)
        return summary | {"epochs": epochs, "samples_per_second": None}
    return TrainingHistory.load(history_file).run_summary(run_dir)


class Diverged(UserError):
    """Training produced a NaN or infinite loss or gradient."""


def holds_non_finite(batch: object, device: torch.device) -> Tensor:
    """Whether any floating-point tensor of `batch` holds NaN or inf, as a tensor on `device`."""
    flags = [(~tensor.isfinite().all()).to(device) for tensor in tensors_in(batch) if tensor.is_floating_point()]
    return torch.stack(flags).any() if flags else torch.zeros((), dtype=torch.bool, device=device)


class DivergenceWatch:
    """The first non-finite step, its loss and whether its batch held non-finite inputs, kept on the device as
    tensors (−1 while every step was finite) so that no step waits for it; `check` reads it."""

    def __init__(self) -> None:
        self.first_step: Tensor | None = None
        self.loss: Tensor | None = None  # the loss of that step
        self.bad_inputs: Tensor | None = None  # whether that step's batch held NaN or infinite values

    def note(self, step: int, bad: Tensor) -> None:
        if self.first_step is None:
            self.first_step = torch.full((), -1, dtype=torch.long, device=bad.device)
            self.loss = torch.full((), float("nan"), device=bad.device)
            self.bad_inputs = torch.zeros((), dtype=torch.bool, device=bad.device)
        self.first_step = torch.where(bad & (self.first_step < 0), step, self.first_step)

    def observe_gradients(self, step: int, parameters: Iterable[torch.nn.Parameter]) -> None:
        """After the backward pass (and DDP's averaging) of optimizer step `step` (counted from 1)."""
        gradients = [p.grad for p in parameters if p.grad is not None]
        if gradients:
            self.note(step, ~torch.nn.utils.get_total_norm(gradients).float().isfinite())

    def observe_step(self, step: int, loss: Tensor | None, batch: object) -> None:
        """After optimizer step `step`: its loss (None: the module returned none), and its batch's inputs."""
        if loss is not None:
            loss = loss.detach().float()
            self.note(step, ~loss.isfinite())
            this_step = self.first_step == step
            self.loss = torch.where(this_step, loss, self.loss)
            self.bad_inputs = torch.where(this_step, holds_non_finite(batch, loss.device), self.bad_inputs)

    def check(self, learning_rate: float | None) -> None:
        """Raise `Diverged` if some step so far was not finite; it waits for the device, so call it where the host
        waits anyway. Under DDP every rank calls it at the same point, and all raise the same error together."""
        step, loss, bad_inputs = -1, 0.0, False
        if self.first_step is not None and int(self.first_step) >= 0:
            step, loss, bad_inputs = int(self.first_step), float(self.loss), bool(self.bad_inputs)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            step, loss, bad_inputs = agreed(step, loss, bad_inputs)
        if step < 0:
            return
        if bad_inputs:
            advice = f"its batch held NaN or infinite inputs: check the data (the batch of step {step})"
        else:
            now = f" (now {learning_rate:g})" if learning_rate is not None else ""
            advice = (
                f"lower the learning rate{now}, or clip the gradients (trainer.gradient_clip_val=1.0), or check the "
                "data"
            )
        raise Diverged(
            f"training diverged at step {step} (loss {loss:.4g}): {advice}; the checkpoints written before it are kept "
            "(stop_when_diverged=false trains on regardless)"
        )


def agreed(step: int, loss: float, bad_inputs: bool) -> tuple[int, float, bool]:
    """The first non-finite step of any rank (−1: none), the mean loss of the ranks that stopped there, and whether
    any of their batches held non-finite inputs: one small all-gather, at a check only."""
    everyone: list[tuple[int, float, bool]] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (step, loss, bad_inputs))
    diverged = [entry for entry in everyone if entry[0] >= 0]
    if not diverged:
        return -1, 0.0, False
    first = min(entry[0] for entry in diverged)
    there = [entry for entry in diverged if entry[0] == first]
    return first, sum(entry[1] for entry in there) / len(there), any(entry[2] for entry in there)


def first_learning_rate(optimizers: list[torch.optim.Optimizer]) -> float | None:
    return optimizers[0].param_groups[0]["lr"] if optimizers and optimizers[0].param_groups else None


class DivergenceGuard(L.Callback):
    """`DivergenceWatch` on Lightning's training loop, checked every `log_every_n_steps` steps (when Lightning waits
    to log anyway), at each epoch's end and before each checkpoint is written."""

    def __init__(self) -> None:
        self.watch = DivergenceWatch()

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        # A float16 gradient scaler skips a step of infinite gradients itself: there, only the loss counts.
        if getattr(trainer.precision_plugin, "scaler", None) is None:
            self.watch.observe_gradients(trainer.global_step + 1, pl_module.parameters())

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        self.watch.observe_step(trainer.global_step, training_loss(outputs), batch)
        if trainer.global_step % max(1, trainer.log_every_n_steps) == 0:
            self.check(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.check(trainer)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        self.check(trainer)

    def check(self, trainer: L.Trainer) -> None:
        self.watch.check(first_learning_rate(trainer.optimizers))
