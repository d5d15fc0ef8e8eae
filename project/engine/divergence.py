"""A run whose training diverges (a loss or gradient that is NaN or infinite) stops, instead of training on to
weights of NaN and results that look like a success.

`DivergenceWatch` notes, on the training device and without waiting for it, the first optimizer step whose
gradients or loss are not finite, and whether that step's batch held non-finite inputs. It is read (`check`) only
where the host waits for the device anyway: every `log_every_n_steps` steps (Lightning writes its logged values
then), at each epoch's end, and before any checkpoint is written, so no checkpoint of diverged weights replaces the
last finite one. Gradients are read after DDP has averaged them, and under DDP the ranks agree at each check (one
small all-gather there, none per step), so all stop together at the same step. The run then ends in one line (exit
status 2) naming the step, its loss, and what to change.

Both paths use it: the Lightning path through `DivergenceGuard` (added by `project.engine.build.build`), the reference
loop directly; `stop_when_diverged=false` (conf/train.yaml) turns it off. Under float16 autocast with a gradient
scaler, infinite gradients are the scaler's business (it skips the step and lowers the scale): only the loss counts.
"""

from collections.abc import Iterable

import lightning as L
import torch
import torch.distributed as dist
from torch import Tensor

from project.engine.errors import UserError
from project.engine.history import training_loss


class DivergenceWatch:
    """The first non-finite step, kept on the device as tensors (−1 while every step was finite)."""

    def __init__(self) -> None:
        self.first_step: Tensor | None = None
        self.loss: Tensor | None = None  # the loss of that step
        self.bad_inputs: Tensor | None = None  # whether that step's batch held NaN or infinite values

    def _note(self, step: int, bad: Tensor) -> None:
        if self.first_step is None:
            self.first_step = torch.full((), -1, dtype=torch.long, device=bad.device)
            self.loss = torch.full((), float("nan"), device=bad.device)
            self.bad_inputs = torch.zeros((), dtype=torch.bool, device=bad.device)
        self.first_step = torch.where(bad & (self.first_step < 0), step, self.first_step)

    def observe_gradients(self, step: int, parameters: Iterable[torch.nn.Parameter]) -> None:
        """After the backward pass (and DDP's averaging) of optimizer step `step` (counted from 1)."""
        gradients = [p.grad for p in parameters if p.grad is not None]
        if gradients:
            norms = torch._foreach_norm(gradients)
            self._note(step, ~torch.stack([norm.float() for norm in norms]).isfinite().all())

    def observe_step(self, step: int, loss: Tensor | None, batch: object) -> None:
        """After optimizer step `step`: its loss (None: the module returned none), and its batch's inputs."""
        if loss is not None:
            loss = loss.detach().float()
            self._note(step, ~loss.isfinite())
            this_step = self.first_step == step
            self.loss = torch.where(this_step, loss, self.loss)
            self.bad_inputs = torch.where(this_step, holds_non_finite(batch, loss.device), self.bad_inputs)

    def check(self, learning_rate: float | None) -> None:
        """Raise `Diverged` if some step so far was not finite (waits for the device: call it where it waits anyway).

        Under DDP every rank must call it at the same point: the ranks then agree on the first such step of any
        rank, its loss averaged over them, and all raise the same error together.
        """
        noted = self.first_step is not None and int(self.first_step) >= 0
        step, loss, bad_inputs = (
            (int(self.first_step), float(self.loss), bool(self.bad_inputs)) if noted else (-1, 0, 0)
        )
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


class Diverged(UserError):
    """Training produced a NaN or infinite loss or gradient."""


def holds_non_finite(batch: object, device: torch.device) -> Tensor:
    """Whether any floating-point tensor of `batch` (a tensor, or a tuple, list or dict of them) holds NaN or inf,
    as a tensor on `device`."""
    if isinstance(batch, Tensor) and batch.is_floating_point():
        return (~batch.isfinite().all()).to(device)
    parts = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    flags = [holds_non_finite(part, device) for part in parts]
    return torch.stack(flags).any() if flags else torch.zeros((), dtype=torch.bool, device=device)


def first_learning_rate(optimizers: list[torch.optim.Optimizer]) -> float | None:
    return optimizers[0].param_groups[0]["lr"] if optimizers and optimizers[0].param_groups else None


class DivergenceGuard(L.Callback):
    """`DivergenceWatch` on Lightning's training loop, for any module (see the module docstring)."""

    def __init__(self) -> None:
        self.watch = DivergenceWatch()

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        if getattr(trainer.precision_plugin, "scaler", None) is None:
            self.watch.observe_gradients(trainer.global_step + 1, pl_module.parameters())

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        self.watch.observe_step(trainer.global_step, training_loss(outputs), batch)
        if trainer.global_step % max(1, trainer.log_every_n_steps) == 0:
            self._check(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._check(trainer)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        self._check(trainer)

    def _check(self, trainer: L.Trainer) -> None:
        self.watch.check(first_learning_rate(trainer.optimizers))
