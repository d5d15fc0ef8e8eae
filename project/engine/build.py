"""What a run is made of (`build`): its config checked, then its data module, module, callbacks, loggers and Trainer
built; with the checks that a stage has data to run on, and `compile=true`: `torch.compile` of the module's networks."""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ModelCheckpoint, ProgressBar
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.model_helpers import is_overridden
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torchmetrics import Metric

from project.engine.checkpoints import (
    RestoredStateCheck,
    TrainingOrder,
    check_checkpoint_dirs,
    freeze_parameters,
    refuse_two_starts,
    resume_path,
    start_from_weights,
)
from project.engine.config import (
    RunConfigCallback,
    check_config,
    check_launched_on_every_node,
    command_line_overrides,
    give_hints,
    mistyped_value,
    overridden_key,
    switched_on,
)
from project.engine.ddp import evaluated_once
from project.engine.errors import CONSTRUCTOR_ERRORS, UserError, find_user_error, in_sweep_job
from project.engine.history import DivergenceGuard
from project.engine.job import TrainingStarts
from project.engine.schedules import ScheduleLengthCheck
from project.engine.trusted_targets import composed_targets
from project.engine.upstream import execution_whitelist


def networks_of(module: nn.Module) -> dict[str, nn.Module]:
    """`module`'s networks, by attribute name, in the order it registered them: its direct submodules that hold
    parameters, not its metrics (what `compile=true` compiles, and what trainer=fsdp shards)."""
    return {
        name: child
        for name, child in module.named_children()
        if not isinstance(child, Metric) and next(child.parameters(), None) is not None
    }


def compile_networks(module: nn.Module) -> list[str]:
    """Compile each of `module`'s networks in place; return their names."""
    networks = networks_of(module)
    for network in networks.values():
        network.compile()
    if not networks:
        raise UserError(
            f"compile=true compiles the submodules of the model that hold parameters, and {type(module).__name__} "
            "has none (its layers are not nn.Module attributes of it): set compile=false, or keep the network in "
            "an attribute (self.network = ...)"
        )
    return list(networks)


class CompileNetworks(L.Callback):
    """Compiles the LightningModule's networks in place as the first stage sets up, in the process that trains (a
    module pickled to trainer=ddp_spawn's processes arrives without its compiled code)."""

    def __init__(self) -> None:
        self.compiled: nn.Module | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.compiled is pl_module:  # fit, then test: compiled once
            return
        self.compiled = pl_module
        names = compile_networks(pl_module)
        rank_zero_info(f"compile=true: torch.compile of {', '.join(names)} (the first steps wait for the compiler)")


def serves(stage: str, module: L.LightningModule, datamodule: L.LightningDataModule | None) -> bool:
    """Whether `module` or `datamodule` (None: `data=none`) defines `stage`'s dataloader."""
    hook = f"{stage}_dataloader"
    in_data = datamodule is not None and is_overridden(hook, datamodule, L.LightningDataModule)
    return in_data or is_overridden(hook, module, L.LightningModule)


def why_no_test(module: L.LightningModule, datamodule: L.LightningDataModule | None) -> str | None:
    """Why `project.train` tests nothing after training, if it does not: the module defines no `test_step`, or
    nothing defines a `test_dataloader` (training needs neither)."""
    name = type(module).__name__
    if not is_overridden("test_step", module, L.LightningModule):
        return f"{name} defines no test_step"
    if not serves("test", module, datamodule):
        where = "" if datamodule is None else f" nor {type(datamodule).__name__}"
        return f"neither {name}{where} defines a test_dataloader"
    return None


def check_data_for(
    stage: str, module: L.LightningModule, datamodule: L.LightningDataModule | None, program: str
) -> None:
    """Refuse `program`'s `stage` where neither `module` nor `datamodule` (None: `data=none`) defines its dataloader,
    or, for a test, where the module defines no `test_step` (a prediction falls back on `forward`)."""
    name = type(module).__name__
    if stage == "test" and not is_overridden("test_step", module, L.LightningModule):
        raise UserError(f"{program} runs the module's test_step, which {name} does not define: define test_step in it")
    if serves(stage, module, datamodule):
        return
    hook = f"{stage}_dataloader"
    if datamodule is None:
        raise UserError(
            f"{program} needs a {hook}, and {name} defines none while data=none gives it no data module: define "
            f"{hook} in {name}, or choose a data module (data=<option>)"
        )
    raise UserError(
        f"{program} needs a {hook}, which neither {name} nor {type(datamodule).__name__} defines: define "
        f"{hook} in one of them"
    )


class ServedByTheEngine:
    """A data hook (`train_dataloader`, `val_dataloader`, `test_dataloader`) of one data module (or module), its
    loader served through the engine: the training loader in the seeded order a resume continues
    (`TrainingOrder.training_loader`), the validation and test loaders with every sample counted once however many
    processes share them (`ddp.evaluated_once`).

    An object rather than a closure, so that `trainer=ddp_spawn` can pickle the data module that holds it; it calls
    the class's own hook (`__wrapped__`, which Lightning's `is_overridden` reads).
    """

    def __init__(self, data: Any, stage: str, order: TrainingOrder) -> None:
        self.data, self.stage, self.order = data, stage, order
        self.__wrapped__ = getattr(type(data), f"{stage}_dataloader")

    def __call__(self) -> Any:
        loader = self.__wrapped__(self.data)
        if self.stage == "train":
            return self.order.training_loader(self.data, loader)
        return evaluated_once(loader, self.data.trainer, "validation" if self.stage == "val" else self.stage)


def serve_through_the_engine(data: Any, order: TrainingOrder) -> None:
    """Have `data` (the data module, or the module under `data=none`) serve its loaders through the engine
    (`ServedByTheEngine`). Lightning asks for loaders through the hook methods and offers no hook after them, so the
    hooks are wrapped on this instance (its class is untouched)."""
    for stage in ("train", "val", "test"):
        hook = getattr(type(data), f"{stage}_dataloader", None)
        if hook is not None and not isinstance(getattr(data, f"{stage}_dataloader"), ServedByTheEngine):
            setattr(data, f"{stage}_dataloader", ServedByTheEngine(data, stage, order))


def instantiate_group(group: str, node: DictConfig, **kwargs: Any) -> Any:
    """`instantiate(node)`, where a constructor that rejects a value of the config (a TypeError or ValueError, as the
    Trainer's for `precision`) ends in one line naming the config `group`."""
    try:
        with execution_whitelist(composed_targets(node)):  # the composed config's own, which the user chose
            return instantiate(node, **kwargs)
    except CONSTRUCTOR_ERRORS as error:
        user_error = find_user_error(error)
        cause = error.__cause__ if isinstance(error, InstantiationException) else error
        if user_error is not None:  # a constructor's own refusal, worded already
            raise user_error from None
        if isinstance(cause, (TypeError, ValueError)):
            overridden = [o for o in command_line_overrides() if overridden_key(o).split(".")[0] == group]
            yours = f" (your overrides: {' '.join(overridden)})" if overridden else ""
            raise UserError(mistyped_value(node, group) or f"{group}{yours}: {cause}") from None
        raise


def configured_callbacks(callbacks: DictConfig) -> list[L.Callback]:
    """The callbacks of conf/callbacks/ built, leaving out those null or switched off by `enabled: false` (a key of
    the config, not an argument of the callback, so it is dropped)."""
    configs = []
    for name, node in callbacks.items():
        if isinstance(node, DictConfig) and "_target_" not in node:
            chosen = HydraConfig.get().runtime.choices.get("callbacks") if HydraConfig.initialized() else None
            raise UserError(
                f"callbacks.{name} has no _target_: callbacks={chosen} defines no {name} for its keys to set; "
                f"use callbacks=default, or give callbacks.{name}._target_"
            )
        if switched_on(node):
            arguments = OmegaConf.to_container(node, resolve=True)
            arguments.pop("enabled", None)
            configs.append(OmegaConf.create(arguments))
    return [instantiate_group("callbacks", node) for node in configs]


def progress_bar_switch(callbacks: Sequence[L.Callback]) -> dict[str, bool]:
    """The Trainer's keyword that leaves progress bars to conf/callbacks/ alone: with none among `callbacks`
    (callbacks=none) Lightning would add its own."""
    return {} if any(isinstance(callback, ProgressBar) for callback in callbacks) else {"enable_progress_bar": False}


@dataclass
class TrainingSetup:
    """What `build` makes of a config: the pieces `trainer.fit` takes, and the checkpoint to resume from."""

    datamodule: L.LightningDataModule | None
    module: L.LightningModule
    trainer: L.Trainer
    ckpt_path: str | None


def build(cfg: DictConfig, outputs_dir: Path, extra_callbacks: Sequence[L.Callback] = ()) -> TrainingSetup:
    """Check `cfg`, then seed and build what a run needs, in the order a hand-written loop would (seed, data, network);
    `cfg.ckpt_path` becomes the file itself. The benchmarks and tests add their probes as `extra_callbacks`."""
    check_config(cfg)
    give_hints(cfg)
    refuse_two_starts(cfg.ckpt_path, cfg.get("init_from"))
    run_config = OmegaConf.to_container(cfg, resolve=True)
    sweep_dir = Path(HydraConfig.get().sweep.dir) if in_sweep_job() else None
    cfg.ckpt_path = resume_path(cfg.ckpt_path, Path(cfg.run_dir), outputs_dir, run_config, sweep_dir)
    run_config["ckpt_path"] = cfg.ckpt_path
    L.seed_everything(cfg.seed, workers=True)
    datamodule = instantiate_group("data", cfg.data) if cfg.data else None  # data=none: an empty config
    module: L.LightningModule = instantiate_group("model", cfg.model)
    start_from_weights(module, cfg.get("init_from"), cfg.get("init_into"), resumes=cfg.ckpt_path)
    freeze_parameters(module, cfg.get("freeze"))  # before the optimizer is made, in fit
    check_data_for("train", module, datamodule, "project.train")
    callbacks = configured_callbacks(cfg.callbacks)
    order = TrainingOrder(cfg.seed)
    serve_through_the_engine(datamodule if datamodule is not None else module, order)
    callbacks += [RunConfigCallback(run_config), ScheduleLengthCheck(), order]
    callbacks += [RestoredStateCheck(cfg.ckpt_path), TrainingStarts()]
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
