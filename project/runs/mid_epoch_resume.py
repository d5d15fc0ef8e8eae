"""A run resumed from a checkpoint written inside an epoch must be able to continue that epoch's data where it was.

The classifier's data modules save their training order's position in every checkpoint (`state_dict`), so such a
run trains exactly the batches it would have trained. A data module of the user's own that keeps no such state
would start the epoch's data again from its first batch while Lightning counts on from the saved step: some
samples twice, others never, silently (Lightning only warns). That resume is refused in one line; resuming from
an epoch's end needs nothing of the data module.
"""

import math

import lightning as L

from project.errors import UserError


class MidEpochResumeCheck(L.Callback):
    """Refuses, before the first step, a mid-epoch resume whose data module cannot restore its position."""

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.ckpt_path is None or math.isinf(trainer.num_training_batches) or trainer.datamodule is None:
            return
        steps_per_epoch = math.ceil(trainer.num_training_batches / trainer.accumulate_grad_batches)
        if trainer.global_step % steps_per_epoch == 0 or keeps_its_position(trainer.datamodule):
            return
        raise UserError(
            f"ckpt_path={trainer.ckpt_path} was written inside an epoch (step {trainer.global_step}), and "
            f"{type(trainer.datamodule).__name__} cannot say where in an epoch its data stood (it defines no "
            "state_dict/load_state_dict), so the epoch would restart its batches: resume from a checkpoint written "
            "at an epoch's end, or give the data module state_dict and load_state_dict (see the classifier's "
            "project/data/datamodule.py)"
        )


def keeps_its_position(datamodule: L.LightningDataModule) -> bool:
    """Whether the data module saves and restores state of its own (Lightning's defaults save nothing)."""
    kind = type(datamodule)
    return (
        kind.state_dict is not L.LightningDataModule.state_dict
        and kind.load_state_dict is not L.LightningDataModule.load_state_dict
    )
