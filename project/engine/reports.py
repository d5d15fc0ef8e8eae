"""[results] The results table every run ends with, and `results.json`, its machine-readable twin in the run dir.

The table shows what the module logged, whatever it is named: `<stage>/<name>` metrics (the classifier's
`train/loss`, `val/acc`, ...) as a row per name and a column per stage, "-" where a stage has none; any other
metric on a line of its own.


[progress] The progress a run shows: a bar redrawn in place in a terminal, plain lines in a file or a pipe.

A Slurm `.out` file, a CI log or a pipe keeps every redraw of a progress bar (the carriage returns a terminal
overwrites), and a line printed while a bar is drawn (a failed run's `error:` line) lands in the middle of it, the bar
redrawn after it when it is closed at exit. So where standard output is not a terminal, progress is plain lines
(`ProgressLines`: a few per epoch, each with the epoch, the step and the loss); in a terminal it is Lightning's bar,
closed as soon as the run fails (`ClosingTQDMProgressBar`), before its error line is printed, so that the line starts
on a line of its own and is the last thing on the screen.


[hparams] TensorBoard's HParams table: the keys a run chose first and shown, beside its final metrics, the optimised one first.

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

import json
import math
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import lightning as L
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.callbacks import ProgressBar, TQDMProgressBar
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData
from torch.utils.tensorboard.summary import hparams
from torch.utils.tensorboard.writer import FileWriter

from project.engine.config import command_line_overrides, overridden_key
from project.engine.errors import in_sweep_job
from project.engine.run_log import report
from project.engine.upstream import open_tqdm_bars

# ---- from results.py
STAGES = ("train", "val", "test")
RUN_KEYS = ("epochs", "world_size", "fit_seconds", "samples_per_second", "run_dir", "weights")


def logged_metrics(results: dict) -> dict[str, float]:
    """The metrics in `results` (everything but the run's size, speed and place), in the order they were logged."""
    return {name: value for name, value in results.items() if name not in RUN_KEYS}


def format_value(value: object) -> str:
    """A metric's cell: 4 decimals for a number, "-" for a missing one."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.4f}" if isinstance(value, (int, float)) else str(value)


def metric_line(name: str, value: object, width: int) -> str:
    """A metric on a line of its own, as the table shows one (and `project.evaluate` each of its metrics): the name in
    `width` characters, then the value in a column of 10."""
    return f"{name:<{width}}{format_value(value):>10}"


def stage_of(metric: str) -> tuple[str, str] | None:
    """("val", "acc") for "val/acc"; None for a metric not named `<stage>/<name>`."""
    stage, slash, name = metric.partition("/")
    return (stage, name) if slash and stage in STAGES else None


def format_results_table(results: dict) -> str:
    """Logged metrics per stage as rows, the other metrics, then the run's size, speed and place."""
    metrics = logged_metrics(results)
    names = list(dict.fromkeys(staged[1] for staged in map(stage_of, metrics) if staged))
    width = max([10, *(len(name) + 2 for name in names)])
    lines = [f"{'':<{width}}{''.join(f'{stage:>10}' for stage in STAGES)}"] if names else []
    for name in names:
        cells = "".join(f"{format_value(metrics.get(f'{stage}/{name}')):>10}" for stage in STAGES)
        lines.append(f"{name:<{width}}{cells}")
    others = [name for name in metrics if stage_of(name) is None]
    lines += [metric_line(name, metrics[name], width) for name in others]
    if not metrics:
        lines.append("metrics     none logged (self.log in the module's steps puts them here)")
    speed = results["samples_per_second"]
    speed_of = "(training samples, all processes)"
    if speed is None:
        speed_of = "(not known: no history was kept, or a batch's size could not be read)"
    lines += [
        f"epochs      {results['epochs']}",
        f"processes   {results['world_size']}",
        f"wall time   {format_seconds(results['fit_seconds'])} (fit: train + validation)",
        f"samples/s   {'-' if speed is None else format(speed, '.0f')} {speed_of}",
        f"weights     {results.get('weights', 'last')} (val and test)",
        f"run dir     {results['run_dir']}",
    ]
    width = max(len(line) for line in lines)
    rule = "-" * width
    return "\n".join([rule, "Results", rule, *lines, rule])


def format_seconds(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds:.2f} s"


def save_results(results: dict, run_dir: str | Path) -> Path:
    path = Path(run_dir) / "results.json"
    path.write_text(json.dumps(results, indent=1))
    return path


# ---- from progress.py
# Plain lines where an epoch's length is unknown (an iterable data set): one every this many steps.
STEPS_PER_LINE_OF_UNKNOWN_EPOCH = 100


def progress_bar(refresh_rate: int, lines_per_epoch: int, lines: bool | None = None) -> ProgressBar:
    """Plain lines (`lines` true), Lightning's bar redrawn every `refresh_rate` steps (false), or whichever suits
    standard output (None: the bar where it is a terminal)."""
    if lines is None:
        lines = not sys.stdout.isatty()
    return ProgressLines(lines_per_epoch) if lines else ClosingTQDMProgressBar(refresh_rate=refresh_rate)


class ClosingTQDMProgressBar(TQDMProgressBar):
    """Lightning's bar, closed when the run fails: left open, it would be closed (and redrawn) at exit, after the
    run's error line."""

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        for bar in open_tqdm_bars(self):
            bar.close()


class ProgressLines(ProgressBar):
    """`lines_per_epoch` lines per training epoch (`epoch 0 step 20/200 ...` and the progress bar's metrics: the
    loss, and what the module logs with `prog_bar=True`), one after each validation, printed and written to the run's
    log file; as many over a test or a prediction (`test step 5/50 ...`, `predict step 5/50`: project.evaluate,
    project.predict)."""

    def __init__(self, lines_per_epoch: int = 10) -> None:
        super().__init__()
        self.lines_per_epoch = lines_per_epoch
        self.enabled = True

    def disable(self) -> None:
        self.enabled = False

    def enable(self) -> None:
        self.enabled = True

    @property
    def is_enabled(self) -> bool:
        return self.enabled

    @property
    def is_disabled(self) -> bool:
        return not self.enabled

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.step_line(f"epoch {trainer.current_epoch}", batch_idx + 1, self.total_train_batches, trainer, pl_module)

    def on_test_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self.step_line("test", batch_idx + 1, trainer.num_test_batches[dataloader_idx], trainer, pl_module)

    def on_predict_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self.step_line("predict", batch_idx + 1, trainer.num_predict_batches[dataloader_idx], trainer, pl_module)

    def step_line(self, stage: str, step: int, total: float, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """`<stage> step 20/200: ...` where `step` is one of the epoch's `lines_per_epoch` (and its last)."""
        known = math.isfinite(total)
        every = max(1, math.ceil(total / self.lines_per_epoch)) if known else STEPS_PER_LINE_OF_UNKNOWN_EPOCH
        if self.enabled and (step % every == 0 or step == total):
            of_total = f"/{int(total)}" if known else ""
            self.line(f"{stage} step {step}{of_total}", trainer, pl_module)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.enabled and not trainer.sanity_checking:
            self.line(f"epoch {trainer.current_epoch} validated", trainer, pl_module)

    def line(self, where: str, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        metrics = self.get_metrics(trainer, pl_module)
        shown = ", ".join(
            f"{name} {value:.4g}" if isinstance(value, float) else f"{name} {value}"
            for name, value in metrics.items()
            if name != "v_num"
        )
        report(f"{where}: {shown}" if shown else where)


# ---- from hparams.py
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
