"""The best checkpoint (by `optimized_metric`), for any module: one that does not log that metric is told so once.

Lightning's `ModelCheckpoint(monitor=...)` ends the run at the first validation when the module never logged the
monitored key. A module of the user's own logs metrics of its own names, so at that first validation this says,
in one line, which metrics the module does log and how to pick one; the run goes on without a best checkpoint. So
does each job of a grid sweep (`-m seed=1,2`), which needs no objective: its table shows `-` for the metric.
Where the run needs that metric it is an error there instead, before more epochs are spent: with `results_from=best`
(in a grid sweep, that job fails alone), and in a job of a search, whose sweeper optimises the metric; every trial
of a search would meet it alike, so it ends the search at its first trial, in that one line (`ObjectiveNotLogged`).
"""

import sys

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import Tensor

from project.engine.errors import UserError
from project.engine.run_log import report
from project.engine.sweeps import in_a_search


class ObjectiveNotLogged(UserError):
    """The module does not log the metric a search optimises: the end of the search, not only of its trial."""

    ends_the_sweep = True


class BestCheckpoint(ModelCheckpoint):
    """`ModelCheckpoint` keeping the best `monitor`; `results_from` says whether the run's results need it."""

    def __init__(self, *args, results_from: str = "last", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.results_from = results_from
        self._told = False

    def _save_topk_checkpoint(self, trainer: L.Trainer, monitor_candidates: dict[str, Tensor]) -> None:
        if self.monitor is None or self.monitor in monitor_candidates:
            super()._save_topk_checkpoint(trainer, monitor_candidates)
            return
        if self._told:
            return
        self._told = True
        logged = sorted(name for name in monitor_candidates if name not in ("epoch", "step"))
        module = type(trainer.lightning_module).__name__
        if logged:
            message = (
                f"optimized_metric={self.monitor} is not logged by {module} (it logs: {', '.join(logged)}): set "
                f"optimized_metric to one of those and optimized_mode=min|max, or log {self.monitor} with self.log "
                "in the module"
            )
        else:
            message = (
                f"optimized_metric={self.monitor} is not logged by {module}, which logs no metric: log one with "
                "self.log in the module and name it with optimized_metric=<name> optimized_mode=min|max"
            )
        if in_a_search():
            raise ObjectiveNotLogged(f"{message} (the search optimises it)")
        if self.results_from == "best":
            raise UserError(f"{message} (results_from=best is that metric)")
        if trainer.global_rank == 0:
            report(f"warning: {message}; no best checkpoint is kept", sys.stderr)
