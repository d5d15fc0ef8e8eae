"""Logs the learning rate each step as `train/lr`, with whatever logger the run has (or none).

Lightning's `LearningRateMonitor` refuses to run without a logger, which would make `logger=none` fail; logging
through `LightningModule.log` works with every logger choice.
"""

import lightning as L


class LearningRateCallback(L.Callback):
    """`train/lr`: the first parameter group's learning rate of the first optimizer, before each step."""

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        learning_rate = trainer.optimizers[0].param_groups[0]["lr"]
        pl_module.log("train/lr", learning_rate, on_step=True, on_epoch=False, batch_size=1)
