"""A learning-rate schedule of fixed length (torch's `OneCycleLR`, `total_steps`) shorter than the run, refused
before the first step instead of torch's ValueError when the run steps past its end.

That happens to any module's schedule, the user's own too, when a run is resumed with a larger `trainer.max_epochs`
than the schedule was sized for: Lightning loads the checkpoint's scheduler state over the one
`configure_optimizers` built, so the stored length wins even where the module sizes it from
`trainer.estimated_stepping_batches`. Checked when training starts, after Lightning has restored the checkpoint.
"""

import math

import lightning as L

from project.errors import UserError


def steps_taken(trainer: L.Trainer, interval: str, frequency: int) -> float:
    """How many times Lightning steps a schedule of this `interval` and `frequency` over the whole run."""
    if interval == "epoch":
        return trainer.max_epochs // frequency if trainer.max_epochs and trainer.max_epochs > 0 else math.inf
    return trainer.estimated_stepping_batches // frequency


class ScheduleLengthCheck(L.Callback):
    """Refuses a run longer than a fixed-length schedule of its module, naming both lengths."""

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for config in trainer.lr_scheduler_configs:
            length = getattr(config.scheduler, "total_steps", None)
            needed = steps_taken(trainer, config.interval, config.frequency)
            if not isinstance(length, int) or needed <= length:
                continue
            resumed = " (the checkpoint's length: it was sized for a shorter run)" if trainer.ckpt_path else ""
            times = f"{needed} times" if math.isfinite(needed) else "without end"
            raise UserError(
                f"the learning-rate schedule {type(config.scheduler).__name__} ends after {length} steps{resumed}, "
                f"and this run steps it {times}: resume with the trainer.max_epochs it was sized for, or size "
                "it from the run's length (trainer.estimated_stepping_batches) and start a new run"
            )
