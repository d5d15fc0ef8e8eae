"""What a run shows and leaves: the results table and `results.json`, its progress (a bar in a terminal, plain lines
elsewhere), and every logger's table of runs (TensorBoard's HParams opening on the keys the run chose)."""

import json
import math
import sys
from collections.abc import Iterable
from pathlib import Path

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
from project.engine.run_log import printable, report
from project.engine.upstream import open_tqdm_bars

STAGES = ("train", "val", "test")
RUN_KEYS = ("epochs", "world_size", "fit_seconds", "samples_per_second", "run_dir", "weights")


def logged_metrics(results: dict) -> dict[str, float]:
    """The metrics in `results` (everything but the run's size, speed and place), in the order they were logged."""
    return {name: value for name, value in results.items() if name not in RUN_KEYS}


def format_value(value: object) -> str:
    """A metric's cell: 4 decimals for a number, "-" for a missing one."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.4f}" if isinstance(value, (int, float)) else printable(str(value))  # a results.json's, maybe


def metric_line(name: str, value: object, width: int) -> str:
    """A metric on its own line (the table's, `project.evaluate`'s): name in `width` characters, value in 10."""
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


# Plain lines where an epoch's length is unknown (an iterable data set): one every this many steps.
STEPS_PER_LINE_OF_UNKNOWN_EPOCH = 100


def progress_bar(refresh_rate: int, lines_per_epoch: int, lines: bool | None = None) -> ProgressBar:
    """Plain lines (`lines` true), Lightning's bar redrawn every `refresh_rate` steps (false), or (None) the bar where
    standard output is a terminal: a log file or a pipe would keep every redraw."""
    if lines is None:
        lines = not sys.stdout.isatty()
    return ProgressLines(lines_per_epoch) if lines else ClosingTQDMProgressBar(refresh_rate=refresh_rate)


class ClosingTQDMProgressBar(TQDMProgressBar):
    """Lightning's bar, closed as soon as the run fails, so that its error line starts a line of its own and stays
    last: left open, the bar would be redrawn at exit, after it."""

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        for bar in open_tqdm_bars(self):
            bar.close()


class ProgressLines(ProgressBar):
    """`lines_per_epoch` lines per epoch of training, test or prediction (`epoch 0 step 20/200: loss ...`, with what
    the module logs with `prog_bar=True`) and one after each validation, printed and written to the run's log."""

    def __init__(self, lines_per_epoch: int = 10) -> None:
        super().__init__()
        self.lines_per_epoch = lines_per_epoch
        self.enabled = True

    def disable(self) -> None:
        self.enabled = False

    def enable(self) -> None:
        self.enabled = True

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.step_line(f"epoch {trainer.current_epoch}", batch_idx + 1, self.total_train_batches, trainer, pl_module)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx: int = 0) -> None:
        self.step_line("test", batch_idx + 1, trainer.num_test_batches[dataloader_idx], trainer, pl_module)

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx: int = 0) -> None:
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


@rank_zero_only
def log_to_tensorboard(logger: TensorBoardLogger, config: dict, metrics: dict[str, float], first_metric: str) -> None:
    """Write the HParams summaries of a run (`config`, final `metrics` with `first_metric` first) into `logger`'s
    directory, marking as differing the keys the run chose, which TensorBoard's table then shows first."""
    params = flat(config)
    chosen = names_under(chosen_keys(), params)
    ordered = dict(sorted(metrics.items(), key=lambda item: item[0] != first_metric))
    logger.log_metrics(ordered)
    # On disk before the HParams file exists: TensorBoard reads a run's event files in turn, and does not go back.
    logger.experiment.flush()
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
    """`{"model": {"optimizer": {"lr": 0.1}}}` as `{"model/optimizer/lr": 0.1}`, as Lightning names them (a list of
    configs by index: `trainer/plugins/0/_target_`); a value the table cannot show (None, a list) as its text."""
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
    """The config keys this run chose: its sweeper's parameters where it has some (a trial's overrides also repeat
    the search's fixed ones), else its command line's overrides (`model.optimizer.lr=0.1` → `model.optimizer.lr`)."""
    search = HydraConfig.get().sweeper.get("params") if in_sweep_job() else None
    if search:
        return list(search)
    return [overridden_key(override) for override in command_line_overrides()]


def names_under(keys: Iterable[str], names: Iterable[str]) -> set[str]:
    """The `names` that `keys` set: `model.optimizer.lr` sets `model/optimizer/lr`, a config group (`model=cnn`)
    every name under `model/`, a choice with no key of its own (`experiment`) none."""
    prefixes = [key.replace(".", "/") for key in keys]
    return {name for name in names if any(name == prefix or name.startswith(f"{prefix}/") for prefix in prefixes)}


def log_hyperparameters(trainer: L.Trainer, cfg: DictConfig, results: dict) -> None:
    """Every logger's table of runs (TensorBoard's HParams, a tracker's): the run's config beside its final metrics,
    named `hp/...` (under their own names they would add a point to the per-epoch curves)."""
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
            log_to_tensorboard(logger, params, metrics, f"hp/{cfg.optimized_metric.replace('/', '_')}")
        else:  # a tracker's runs table: the config as params, the results as metrics
            logger.log_hyperparams({**params, "world_size": trainer.world_size})
            logger.log_metrics(metrics, step=trainer.global_step)
            logger.save()
