"""The run's whole resolved config, stored in every checkpoint the run writes, whatever its LightningModule.

`project.evaluate`, `project.predict` and resuming rebuild a run from `checkpoint["config"]` alone (its model, its
data); a DDP run's ranks compare it to find a rank that composed another config. The entry point adds this
callback to every run, so a module of the user's own needs no hook of its own for it.
"""

import lightning as L


class RunConfigCallback(L.Callback):
    """Writes `config` into every checkpoint as `checkpoint["config"]`."""

    def __init__(self, config: dict) -> None:
        self.config = config

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        checkpoint["config"] = self.config


def run_config_of(trainer: L.Trainer) -> dict | None:
    """The config the run's `RunConfigCallback` stores, or None for a Trainer built without one."""
    return next((callback.config for callback in trainer.callbacks if isinstance(callback, RunConfigCallback)), None)
