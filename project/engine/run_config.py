"""The run's whole resolved config, stored in every checkpoint the run writes, whatever its LightningModule.

`project.evaluate`, `project.predict` and resuming rebuild a run from `checkpoint["config"]` alone (its model, its
data); a DDP run's ranks compare it to find a rank that composed another config. The entry point adds this
callback to every run, so a module of the user's own needs no hook of its own for it. The overrides it was
composed from are read as given (`command_line_overrides`), for the processes it starts to compose it alike.
"""

import lightning as L
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf


class RunConfigCallback(L.Callback):
    """Writes `config` into every checkpoint as `checkpoint["config"]`."""

    def __init__(self, config: dict) -> None:
        self.config = config

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        checkpoint["config"] = self.config


def run_config_of(trainer: L.Trainer) -> dict | None:
    """The config the run's `RunConfigCallback` stores, or None for a Trainer built without one."""
    return next((callback.config for callback in trainer.callbacks if isinstance(callback, RunConfigCallback)), None)


def command_line_overrides() -> list[str]:
    """The command line's overrides as given: a `${...}` in one is its value's, not to be resolved in Hydra's config."""
    return OmegaConf.to_container(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def overridden_key(override: str) -> str:
    """The key an override sets: `+model.optimizer.lr=0.1` sets `model.optimizer.lr`, `~callbacks.history` removes
    `callbacks.history`."""
    return override.lstrip("+~").split("=", 1)[0]


def config_source_arguments() -> list[str]:
    """`--config-name` and any `--config-dir` this process was started with: a process it starts composes from the
    same config files."""
    hydra = HydraConfig.get()
    config_dirs = [source.path for source in hydra.runtime.config_sources if source.provider == "command-line"]
    return [f"--config-name={hydra.job.config_name}", *(f"--config-dir={path}" for path in config_dirs)]
