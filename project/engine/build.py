"""What a run is made of: a config checked, then its data module, module, callbacks, loggers and Trainer built, in the
order a hand-written loop would (seed, data, network), whatever the module and data module are (no data module with
`data=none`: the module's own dataloaders serve).

`project.train` builds its run here; so do the benchmarks and tests, which add their probes as extra callbacks.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ModelCheckpoint, ProgressBar
from omegaconf import DictConfig, OmegaConf

from project.engine.checkpoints import PartWayResumeCheck, ResumedWeightsCheck, check_checkpoint_dirs, resume_path
from project.engine.checks import check_config, check_launched_on_every_node, mistyped_value
from project.engine.data_sources import check_data_for
from project.engine.divergence import DivergenceGuard
from project.engine.errors import CONSTRUCTOR_ERRORS, UserError, find_user_error, in_sweep_job
from project.engine.hints import give_hints
from project.engine.hydra_versions import execution_whitelist
from project.engine.job import TrainingStarts
from project.engine.networks import CompileNetworks
from project.engine.run_config import RunConfigCallback, command_line_overrides, overridden_key
from project.engine.schedules import ScheduleLengthCheck
from project.engine.trusted_targets import composed_targets


@dataclass
class TrainingSetup:
    """What `build` makes of a config: the pieces `trainer.fit` takes, and the checkpoint to resume from."""

    datamodule: L.LightningDataModule | None
    module: L.LightningModule
    trainer: L.Trainer
    ckpt_path: str | None


def build(cfg: DictConfig, outputs_dir: Path, extra_callbacks: Sequence[L.Callback] = ()) -> TrainingSetup:
    """Check `cfg`, then seed and instantiate everything a run needs, in the order the reference path does.

    The benchmarks and tests build through here too, adding their probes as `extra_callbacks`. `cfg.ckpt_path`
    is resolved here to the file itself (`last`: the run dir's own `last.ckpt`, or the newest earlier run's of the
    same model and data under `outputs_dir`; a sweep's job carries on from its own), so the stored config says which
    file a run resumed from and every rank resumes from the same. Every checkpoint stores the whole config
    (`RunConfigCallback`), whatever the module. A checkpoint dir that cannot be written is refused here, before the
    first epoch trains.
    """
    check_config(cfg)
    give_hints(cfg)
    run_config = OmegaConf.to_container(cfg, resolve=True)
    sweep_dir = Path(HydraConfig.get().sweep.dir) if in_sweep_job() else None
    cfg.ckpt_path = resume_path(cfg.ckpt_path, Path(cfg.run_dir), outputs_dir, run_config, sweep_dir)
    run_config["ckpt_path"] = cfg.ckpt_path
    L.seed_everything(cfg.seed, workers=True)
    datamodule = instantiate_group("data", cfg.data) if cfg.data else None  # data=none: an empty config
    module: L.LightningModule = instantiate_group("model", cfg.model)
    check_data_for("train", module, datamodule, "project.train")
    callbacks = configured_callbacks(cfg.callbacks)
    callbacks += [RunConfigCallback(run_config), ScheduleLengthCheck(), PartWayResumeCheck()]
    callbacks += [ResumedWeightsCheck(cfg.ckpt_path), TrainingStarts()]
    callbacks += extra_callbacks
    if cfg.get("compile"):
        callbacks.append(CompileNetworks())
    check_checkpoint_dirs(callbacks)
    if cfg.get("stop_when_diverged", True):
        callbacks.insert(0, DivergenceGuard())  # first: it checks before any checkpoint callback writes
    loggers = [instantiate_group("logger", logger) for logger in cfg.logger.values()]
    # Checkpoints come from conf/callbacks/ alone: with none there (callbacks=none) Lightning would add its own.
    checkpointing = any(isinstance(callback, ModelCheckpoint) for callback in callbacks)
    trainer: L.Trainer = instantiate_group(
        "trainer",
        cfg.trainer,
        callbacks=callbacks,
        logger=loggers or False,
        enable_checkpointing=checkpointing,
        **progress_bar_switch(callbacks),
    )
    check_launched_on_every_node(trainer)
    return TrainingSetup(datamodule, module, trainer, cfg.ckpt_path)


def instantiate_group(group: str, node: DictConfig, **kwargs: Any) -> Any:
    """`instantiate(node)`, where a constructor that rejects a value of the config is the user's error.

    Lightning's Trainer, for one, checks `precision` and `devices` with a ValueError or TypeError (one of
    `CONSTRUCTOR_ERRORS`); the message already names the value, so it becomes one line naming the config group.
    `node` is of the composed config: on Hydra 1.4 its own targets are the execution whitelist.
    """
    try:
        with execution_whitelist(composed_targets(node)):  # the composed config's own, which the user chose
            return instantiate(node, **kwargs)
    except CONSTRUCTOR_ERRORS as error:
        user_error = find_user_error(error)
        cause = error.__cause__ if isinstance(error, InstantiationException) else error
        if user_error is not None:  # a constructor's own refusal, worded already
            raise user_error from None
        if isinstance(cause, (TypeError, ValueError)):
            mistyped = mistyped_value(node, group)
            raise UserError(mistyped or f"{group}{overrides_of(group)}: {cause}") from None
        raise


def configured_callbacks(callbacks: DictConfig) -> list[L.Callback]:
    """The callbacks of conf/callbacks/ that `callbacks` switches on (`switched_on`), built."""
    return [instantiate_group("callbacks", node) for node in switched_on(callbacks)]


def progress_bar_switch(callbacks: Sequence[L.Callback]) -> dict[str, bool]:
    """The Trainer's keyword that leaves progress to conf/callbacks/ alone: with no bar among `callbacks`
    (callbacks=none) Lightning would add its own, whose redraws a log file or a pipe keeps (`project.engine.progress`).
    Used by project.train, project.evaluate and project.predict alike."""
    return {} if any(isinstance(callback, ProgressBar) for callback in callbacks) else {"enable_progress_bar": False}


def switched_on(callbacks: DictConfig) -> list[DictConfig]:
    """The configs of `callbacks` to build: those not null and not switched off by an `enabled: false` of theirs, a
    key any callback may have (conf/callbacks/default.yaml's early stopping is off until callbacks.early_stopping.
    enabled=true), which is the config's, not the callback's argument."""
    configs = []
    for name, node in callbacks.items():
        if isinstance(node, DictConfig) and "_target_" not in node:
            chosen = HydraConfig.get().runtime.choices.get("callbacks") if HydraConfig.initialized() else None
            raise UserError(
                f"callbacks.{name} has no _target_: callbacks={chosen} defines no {name} for its keys to set; "
                f"use callbacks=default, or give callbacks.{name}._target_"
            )
        if node is not None and node.get("enabled", True):
            arguments = OmegaConf.to_container(node, resolve=True)
            arguments.pop("enabled", None)
            configs.append(OmegaConf.create(arguments))
    return configs


def overrides_of(group: str) -> str:
    """ " (your overrides: trainer.devices=abc)": the command line's choices for `group`, where the fault must be."""
    mine = [o for o in command_line_overrides() if overridden_key(o).split(".")[0] == group]
    return f" (your overrides: {' '.join(mine)})" if mine else ""
