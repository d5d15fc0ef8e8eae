"""The Lightning path: `python -m project.train [overrides]` composes conf/, trains, tests, prints the results.

Every strategy is a `trainer=` config; nothing here branches on it. Whatever the number of processes, the run
writes into one Hydra run dir (`run_dir`); rank 0 alone writes results. `main` returns the `optimized_metric`
so Hydra sweepers can optimise it (None where it is not a finite number).
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
import lightning as L
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.utils import get_original_cwd, instantiate
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import MLFlowLogger, TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from project.engine.checkpoints import check_checkpoint_dirs, resume_path
from project.engine.checks import check_config, mistyped_value
from project.engine.divergence import DivergenceGuard
from project.engine.errors import UserError, exit_on_user_error, find_user_error, in_sweep_job, run_hydra_app
from project.engine.hints import give_network_hints
from project.engine.history import TrainingHistory
from project.engine.hparams import log_to_tensorboard
from project.engine.job import isolated_job, stop_if_signalled
from project.engine.networks import CompileNetworks
from project.engine.results import format_results_table, logged_metrics, save_results
from project.engine.run_config import RunConfigCallback, command_line_overrides, overridden_key
from project.engine.run_log import capture_logs, report
from project.engine.schedules import ScheduleLengthCheck
from project.engine.sweeps import finished_results
from project.optional.optuna.pruning import trial_pruning


@dataclass
class TrainingSetup:
    """What `build` makes of a config: the pieces `trainer.fit` takes, and the checkpoint to resume from."""

    datamodule: L.LightningDataModule
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
    give_network_hints(cfg)
    run_config = OmegaConf.to_container(cfg, resolve=True)
    sweep_dir = Path(HydraConfig.get().sweep.dir) if in_sweep_job() else None
    cfg.ckpt_path = resume_path(cfg.ckpt_path, Path(cfg.run_dir), outputs_dir, run_config, sweep_dir)
    run_config["ckpt_path"] = cfg.ckpt_path
    L.seed_everything(cfg.seed, workers=True)
    datamodule: L.LightningDataModule = instantiate_group("data", cfg.data)
    module: L.LightningModule = instantiate_group("model", cfg.model)
    callbacks = [instantiate_group("callbacks", callback) for callback in switched_on(cfg.callbacks)]
    callbacks += [RunConfigCallback(run_config), ScheduleLengthCheck(), *trial_pruning(cfg)]
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
        "trainer", cfg.trainer, callbacks=callbacks, logger=loggers or False, enable_checkpointing=checkpointing
    )
    return TrainingSetup(datamodule, module, trainer, cfg.ckpt_path)


def instantiate_group(group: str, node: DictConfig, **kwargs: Any) -> Any:
    """`instantiate(node)`, where a constructor that rejects a value of the config is the user's error.

    Lightning's Trainer, for one, checks `precision` and `devices` with a ValueError or TypeError, which Hydra wraps;
    the message already names the value, so it becomes one line naming the config group.
    """
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as error:
        cause = error.__cause__
        if find_user_error(error) is None and isinstance(cause, (TypeError, ValueError)):
            mistyped = mistyped_value(node, group)
            raise UserError(mistyped or f"{group}{overrides_of(group)}: {cause}") from None
        raise


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


def train(cfg: DictConfig) -> dict:
    """Fit and test the model `cfg` describes; return the results every run prints.

    `results_from` picks the weights the validation and test numbers (and so the value a sweep optimises) come
    from: `last`, the final epoch's, or `best`, the checkpoint with the best `optimized_metric`.
    """
    setup = build(cfg, Path(get_original_cwd()) / "outputs")
    trainer, module, datamodule = setup.trainer, setup.module, setup.datamodule
    with isolated_job(trainer):
        trainer.fit(module, datamodule=datamodule, ckpt_path=setup.ckpt_path)
        stop_if_signalled(trainer)
        results = metrics_of(trainer)
        weights = "last"
        if cfg.results_from == "best":
            weights = trainer.checkpoint_callback.best_model_path
            trainer.validate(module, datamodule=datamodule, ckpt_path=weights, verbose=False)
            results |= metrics_of(trainer)
        trainer.test(module, datamodule=datamodule, ckpt_path=None if weights == "last" else weights, verbose=False)
        stop_if_signalled(trainer)
        results |= metrics_of(trainer)
    results |= summarise_history(cfg.run_dir, trainer.world_size) | {"weights": weights}
    log_hyperparameters(trainer, cfg, results)
    return results


def metrics_of(trainer: L.Trainer) -> dict[str, float]:
    """The numbers the last fit, validate or test call logged."""
    return {name: value.item() for name, value in trainer.callback_metrics.items()}


def log_hyperparameters(trainer: L.Trainer, cfg: DictConfig, results: dict) -> None:
    """TensorBoard's HParams view (and MLflow's runs table): the run's config beside its final metrics, so runs and
    sweeps compare in one table, which in TensorBoard opens on the keys the run chose (project/engine/hparams.py), the
    optimised metric first.

    The metrics get an `hp/` prefix: under their own names they would add a point to the per-epoch curves.
    """
    params = OmegaConf.to_container(cfg, resolve=True)
    for key in ("run_dir", "callbacks", "logger"):
        params.pop(key, None)
    metrics = {
        f"hp/{name.replace('/', '_')}": value
        for name, value in logged_metrics(results).items()
        if isinstance(value, (int, float))
    }
    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            first = f"hp/{cfg.optimized_metric.replace('/', '_')}"
            log_to_tensorboard(logger, params, metrics, first)
        if isinstance(logger, MLFlowLogger):  # its runs table: the config as params, the results as metrics
            logger.log_hyperparams({**params, "world_size": trainer.world_size})
            logger.log_metrics(metrics, step=trainer.global_step)


def summarise_history(run_dir: str, world_size: int) -> dict:
    """Epochs, time and speed from rank 0's history file (written by every strategy, spawned workers included)."""
    history_file = Path(run_dir) / "history.rank0.json"
    if not history_file.is_file():  # callbacks=none: no history recorded
        return TrainingHistory(world_size=world_size, fit_seconds=float("nan")).run_summary(run_dir)
    return TrainingHistory.load(history_file).run_summary(run_dir)


@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
@exit_on_user_error
def main(cfg: DictConfig) -> float | None:
    capture_logs()
    check_config(cfg)  # before the config is printed, so a bad value is the last thing on screen
    give_network_hints(cfg)  # and the printed network is the one built
    finished = finished_results(cfg.run_dir) if in_sweep_job() else None
    if finished is not None:
        job = HydraConfig.get().job.num
        report(f"job {job} finished in an earlier run of this sweep: not run again ({cfg.run_dir})")
        return sweep_value(finished.get(cfg.optimized_metric))
    if rank_zero_only.rank == 0:
        report(f"Config\n{OmegaConf.to_yaml(cfg, resolve=True)}")
    results = train(cfg)
    if rank_zero_only.rank == 0:
        save_results(results, cfg.run_dir)
        report(format_results_table(results))
    return sweep_value(results.get(cfg.optimized_metric))


def sweep_value(value: float | None) -> float | None:
    """What a sweeper is given: the metric, or None where there is no finite one (Optuna records a failed trial)."""
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


if __name__ == "__main__":
    run_hydra_app(main)
