"""TensorBoard's HParams table: the keys a run chose first and shown, beside its final metrics, the optimised one first.

TensorBoard takes the table's columns from the experiment summary of the first run it reads that has one, sorts
them by `differs` (true first), then by name, and its HParams dashboard ticks the first five (the rest wait, unticked,
in its side panel); it shows the first five metrics of the summary. Lightning's `log_hyperparams` writes every key
with `differs` false, so a sweep's table opened on `ckpt_path`, `data/_target_`, ... and hid the swept key. Here the
summary marks as differing the keys the run chose (`chosen_keys`): a search's parameters (`hydra.sweeper.params`,
Optuna's search space) or else the command line's overrides (a plain run's, or a `-m` sweep's, whose jobs each get
their swept values as overrides). Every job of one sweep makes the same marks, so it does not matter which one
TensorBoard reads. Keys that differ anyway, such as `trainer/default_root_dir`, are not marked: marking from the
values would put them first.
"""

from collections.abc import Iterable

import lightning as L
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData
from torch.utils.tensorboard.summary import hparams
from torch.utils.tensorboard.writer import FileWriter

from project.engine.errors import in_sweep_job
from project.engine.results import logged_metrics
from project.engine.run_config import command_line_overrides, overridden_key


@rank_zero_only
def log_to_tensorboard(logger: TensorBoardLogger, config: dict, metrics: dict[str, float], first_metric: str) -> None:
    """Write the HParams summaries of a run with `config` and final `metrics` (shown `first_metric` first) into
    `logger`'s directory, the keys the run chose marked as differing; the metrics as scalars too, as Lightning's
    `log_hyperparams` writes them."""
    params = flat(config)
    chosen = names_under(chosen_keys(), params)
    ordered = dict(sorted(metrics.items(), key=lambda item: item[0] != first_metric))
    logger.log_metrics(ordered)
    experiment, session_start, session_end = hparams(params, ordered)
    value = experiment.value[0]
    data = HParamsPluginData.FromString(value.metadata.plugin_data.content)
    for info in data.experiment.hparam_infos:
        info.differs = info.name in chosen
    value.metadata.plugin_data.content = data.SerializeToString()
    writer = FileWriter(logger.log_dir)
    for summary in (experiment, session_start, session_end):
        writer.add_summary(summary)
    writer.close()


def flat(config: dict | list, prefix: str = "") -> dict[str, bool | int | float | str]:
    """`{"model": {"optimizer": {"lr": 0.1}}}` as `{"model/optimizer/lr": 0.1}`, the names the table shows, as
    Lightning names them (a list of configs by index: `trainer/plugins/0/_target_`); a value the table cannot show
    (None, a list of numbers) as its text."""
    items = config.items() if isinstance(config, dict) else enumerate(config)
    names: dict[str, bool | int | float | str] = {}
    for key, value in items:
        name = f"{prefix}{key}"
        configs = isinstance(value, dict) or (isinstance(value, list) and all(isinstance(v, dict) for v in value))
        if value and configs:
            names |= flat(value, f"{name}/")
        else:
            names[name] = value if isinstance(value, (bool, int, float, str)) else str(value)
    return names


def chosen_keys() -> list[str]:
    """The config keys this run chose: in a sweep whose sweeper has parameters, those (an Optuna trial's overrides
    also repeat the search's fixed command line, e.g. `data.root=...`), else its command line's overrides
    (`model.optimizer.lr=0.1` → `model.optimizer.lr`); none outside Hydra."""
    search = HydraConfig.get().sweeper.get("params") if in_sweep_job() else None
    if search:
        return list(search)
    return [overridden_key(override) for override in command_line_overrides()]


def names_under(keys: Iterable[str], names: Iterable[str]) -> set[str]:
    """The `names` that `keys` set: `model.optimizer.lr` sets `model/optimizer/lr`, a config group (`model`, from
    `model=cnn`) every name under `model/`; a choice with no key of its own (`experiment`) none."""
    prefixes = [key.replace(".", "/") for key in keys]
    return {name for name in names if any(name == prefix or name.startswith(f"{prefix}/") for prefix in prefixes)}


def log_hyperparameters(trainer: L.Trainer, cfg: DictConfig, results: dict) -> None:
    """Every logger's table of runs (TensorBoard's HParams view, a tracker's runs table): the run's config beside its
    final metrics, so runs and sweeps compare in one table, which in TensorBoard opens on the keys the run chose, the
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
        else:  # a tracker's runs table: the config as params, the results as metrics
            logger.log_hyperparams({**params, "world_size": trainer.world_size})
            logger.log_metrics(metrics, step=trainer.global_step)
            logger.save()
