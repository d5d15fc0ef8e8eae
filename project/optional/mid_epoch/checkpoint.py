"""`last.ckpt` written inside an epoch too, so a preempted or killed run loses minutes, not an epoch.

`conf/callbacks/default.yaml`'s `last_checkpoint` writes `last.ckpt` at every epoch's end; this callback writes the
same file between those: every `every_n_steps` optimizer steps and/or every `every_n_minutes` (its keys in
conf/callbacks/mid_epoch_checkpoint.yaml, `callbacks.mid_epoch_checkpoint.*`: off for the toy, on in
`experiment=mnist_slurm`), and once when SIGTERM stops the run (Slurm's time limit and preemption, Kubernetes,
`timeout`), whatever the keys say.

The SIGTERM checkpoint is written after the signal, never inside its handler: Lightning's handler only notes it (under
DDP the ranks agree on it, `project.engine.ddp`), every rank stops after the same step, and Lightning then calls
`on_exception` on every rank together, which is where this writes. The file is renamed into place
(`AtomicCheckpointIO`), so a kill during the write keeps the previous one. A SIGTERM inside a gradient-accumulation
window (`trainer.accumulate_grad_batches`) stops the run at the window's last batch: a checkpoint inside the window
would leave its accumulated gradients behind, and the resumed run would step on part of them.

Resuming such a checkpoint trains exactly the batches the run would have trained next: the engine keeps where training
stands in any training loader with torch's own sampler (`project.engine.checkpoints.TrainingOrder`), and a data module
with a sampler of its own keeps it itself (`state_dict`/`load_state_dict`: the classifier's data modules save their
training order's position); the resume of one that keeps no such place is refused in one line.
"""

import time
from pathlib import Path

import lightning as L
from lightning.pytorch.utilities.exceptions import SIGTERMException

from project.engine.checkpoints import batches_done
from project.engine.ddp import DeferredAgreement
from project.engine.errors import UserError


class MidEpochCheckpoint(L.Callback):
    """Writes `<dirpath>/last.ckpt` every `every_n_steps` steps, every `every_n_minutes`, and when SIGTERM stops it."""

    def __init__(self, dirpath: str, every_n_steps: int | None = None, every_n_minutes: float | None = None) -> None:
        if every_n_steps is not None and (type(every_n_steps) is not int or every_n_steps < 1):
            raise UserError(
                f"callbacks.mid_epoch_checkpoint.every_n_steps must be a positive integer or null, not {every_n_steps}"
            )
        if every_n_minutes is not None and not (type(every_n_minutes) in (int, float) and every_n_minutes > 0):
            raise UserError(
                "callbacks.mid_epoch_checkpoint.every_n_minutes must be a positive number or null, not "
                f"{every_n_minutes}"
            )
        self.path = Path(dirpath) / "last.ckpt"
        self.every_n_steps = every_n_steps
        self.every_n_minutes = every_n_minutes
        self._last_write = time.monotonic()
        self._held_sigterm = False
        # How the ranks agree on the clock (every_n_minutes with more than one rank).
        self._clock_agreement: DeferredAgreement | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_write = time.monotonic()
        if self.every_n_minutes is not None and trainer.world_size > 1 and self._clock_agreement is None:
            self._clock_agreement = DeferredAgreement(size=1)  # every rank is here at once

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        done = batches_done(trainer)
        self._hold_sigterm_to_the_windows_end(trainer, done)
        if done >= trainer.num_training_batches:
            return  # the epoch-end last.ckpt follows at once
        if done % trainer.accumulate_grad_batches:
            return  # gradients are accumulating: only a batch that stepped the optimizer is a place to resume from
        by_steps = self.every_n_steps is not None and trainer.global_step % self.every_n_steps == 0
        if self._clock_agreement is None:
            by_time = self._clock_says_write()
        else:
            # The ranks write together, one window after any rank's clock said so (clocks that disagreed would leave
            # ranks waiting for each other); each clock is read again after the write, which resets it.
            (by_time,) = self._clock_agreement.settle()
        if by_steps or by_time:
            self._write(trainer)
        if self._clock_agreement is not None:
            self._clock_agreement.start([self._clock_says_write()])

    def _clock_says_write(self) -> bool:
        return self.every_n_minutes is not None and time.monotonic() - self._last_write >= 60 * self.every_n_minutes

    def _hold_sigterm_to_the_windows_end(self, trainer: L.Trainer, done: int) -> None:
        """Hide a SIGTERM from Lightning's loop until the accumulation window's last batch has stepped.

        Lightning stops after the batch whose end finds its flag set (after this hook); under DDP the ranks set it
        together (`HydraDDPStrategy`), at the same batch, so they hold and release it together. The flag is on the
        Trainer's private signal connector, as there (see the `lightning<2.7` pin).
        """
        connector = trainer._signal_connector
        inside_a_window = done % trainer.accumulate_grad_batches and done < trainer.num_training_batches
        if connector.received_sigterm and inside_a_window:
            connector.received_sigterm, self._held_sigterm = False, True
        elif self._held_sigterm and not inside_a_window:
            connector.received_sigterm, self._held_sigterm = True, False

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        """On SIGTERM while an epoch is under way, write the step just finished (every rank is here).

        Under way includes the epoch's closing validation: Lightning stops a validation for SIGTERM, before the
        epoch-end `last.ckpt`, so without this write the whole epoch's training would be lost. Once the epoch has
        ended (Lightning also stops there), `last.ckpt` is that end's already.
        """
        epochs = trainer.fit_loop.epoch_progress.current
        epoch_under_way = epochs.processed < epochs.started and batches_done(trainer) > 0
        if isinstance(exception, SIGTERMException) and trainer.state.fn == "fit" and epoch_under_way:
            self._write(trainer)

    def _write(self, trainer: L.Trainer) -> None:
        trainer.save_checkpoint(self.path)
        self._last_write = time.monotonic()
