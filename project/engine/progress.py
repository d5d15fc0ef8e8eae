"""The progress a run shows: a bar redrawn in place in a terminal, plain lines in a file or a pipe.

A Slurm `.out` file, a CI log or a pipe keeps every redraw of a progress bar (the carriage returns a terminal
overwrites), and a line printed while a bar is drawn (a failed run's `error:` line) lands in the middle of it, the bar
redrawn after it when it is closed at exit. So where standard output is not a terminal, progress is plain lines
(`ProgressLines`: a few per epoch, each with the epoch, the step and the loss); in a terminal it is Lightning's bar,
closed as soon as the run fails (`ClosingTQDMProgressBar`), before its error line is printed, so that the line starts
on a line of its own and is the last thing on the screen.
"""

import math
import sys
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ProgressBar, TQDMProgressBar

from project.engine.run_log import report

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
        bars = (self._train_progress_bar, self._val_progress_bar, self._test_progress_bar, self._predict_progress_bar)
        for bar in bars:
            if bar is not None:
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
