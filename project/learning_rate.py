"""Logs the learning rate as `train/lr`, at the Trainer's logging interval, straight to the run's loggers.

Lightning's `LearningRateMonitor` refuses to run without a logger (so `logger=none` would fail), and a
`LightningModule.log` call per step costs Lightning's bookkeeping time; writing to the loggers only on logging
steps costs nothing on the others.
"""

import lightning as L


class LearningRateCallback(L.Callback):
    """`train/lr`: the first optimizer's first parameter group, every `trainer.log_every_n_steps` steps."""

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        if not trainer.loggers or trainer.global_step % trainer.log_every_n_steps:
            return
        learning_rate = trainer.optimizers[0].param_groups[0]["lr"]
        for logger in trainer.loggers:
            logger.log_metrics({"train/lr": learning_rate}, step=trainer.global_step)
