"""TensorBoard's HParams table: the keys a run was given on the command line first and shown, beside its final metrics.

TensorBoard takes the table's columns from the experiment summary of the first run it reads that has one, sorts
them by `differs` (true first), then by name, and its HParams dashboard ticks the first five (the rest wait, unticked,
in its side panel); it shows the first five metrics of the summary. Lightning's `log_hyperparams` writes every key
with `differs` false, so a sweep's table opened on `ckpt_path`, `data/_target_`, ... and hid the swept key. Here the
summary marks as differing the keys the run was given on the command line (Hydra's task overrides): a plain run's
overrides, a sweep job's swept values and an Optuna trial's suggestions alike, which Hydra hands each job as its
overrides, so every job of one sweep writes the same marks and it does not matter which one TensorBoard reads. Keys
that differ anyway, such as the run dir, are not marked: marking from the values would put them first.
"""

from collections.abc import Iterable

from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData
from torch.utils.tensorboard.summary import hparams
from torch.utils.tensorboard.writer import FileWriter


@rank_zero_only
def log_to_tensorboard(
    logger: TensorBoardLogger, config: dict, metrics: dict[str, float], overrides: Iterable[str], first_metric: str
) -> None:
    """Write the HParams summaries of a run with `config` and final `metrics` (shown `first_metric` first) into
    `logger`'s directory, the keys `overrides` set marked as differing; the metrics as scalars too, as Lightning's
    `log_hyperparams` writes them."""
    params = flat(config)
    chosen = overridden_keys(overrides, params)
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
    """`{"model": {"optimizer": {"lr": 0.1}}}` as `{"model/optimizer/lr": 0.1}`, the names the table shows (a list's
    items by index); a value the table cannot show (None, an empty list) as its text."""
    items = config.items() if isinstance(config, dict) else enumerate(config)
    names: dict[str, bool | int | float | str] = {}
    for key, value in items:
        name = f"{prefix}{key}"
        if isinstance(value, (dict, list)) and value:
            names |= flat(value, f"{name}/")
        else:
            names[name] = value if isinstance(value, (bool, int, float, str)) else str(value)
    return names


def overridden_keys(overrides: Iterable[str], names: Iterable[str]) -> set[str]:
    """The `names` the command line's `overrides` set: `model.optimizer.lr=0.1` sets `model/optimizer/lr`, a group's
    choice (`model=cnn`) every name under `model/`; a choice with no key of its own (`experiment=mnist`) none."""
    prefixes = [override.lstrip("+~").split("=", 1)[0].replace(".", "/") for override in overrides]
    return {name for name in names if any(name == prefix or name.startswith(f"{prefix}/") for prefix in prefixes)}
