"""Pruning a trial of an Optuna search from inside its training job, for any LightningModule.

With `hydra.sweeper.pruner` set (conf/hparams_search/, hydra_plugins/resumable_optuna_sweeper/), each trial's job
reports its `optimized_metric` to the study after every validation, and stops where the pruner says so. The job may
run in another process than the sweeper (a Slurm job), so it goes through the study's storage, the trial found by
its number, which is the job's number. Step N of the report is the trial's N-th validation (0 first), whatever the
batch size, so trials of different batch sizes are compared at the same point: a pruner's `n_warmup_steps` counts
validations.

A pruned trial ends as a short run: training stops after that validation (its checkpoints are written, as at any
epoch end), and the run is tested and writes its results as usual, so its job dir reads like any other; it also gets
`pruned.txt`, from which the sweeper tells the study the trial was pruned and the summary lists it as `pruned`.
Under DDP only rank 0 talks to the study; its decision is broadcast, so every rank stops at the same step.
"""

from pathlib import Path
from typing import Any

import lightning as L
import optuna
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from lightning.pytorch.trainer.states import TrainerFn
from omegaconf import DictConfig

from project.engine.errors import in_sweep_job
from project.engine.sweeps import PRUNED_FILE


class TrialPruning(L.Callback):
    """Report `metric` to trial `trial_number` of the stored study at each validation end; stop where it is pruned.

    `trial_number` is None on the ranks that rank 0 started (they only hear its decision); `run_dir` gets the mark."""

    def __init__(
        self, storage: str, study_name: str, pruner: Any, trial_number: int | None, metric: str, run_dir: str
    ) -> None:
        self.storage, self.study_name, self.pruner = storage, study_name, pruner
        self.trial_number, self.metric, self.run_dir = trial_number, metric, run_dir
        self.validations = 0
        self.trial: optuna.Trial | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit" or not trainer.is_global_zero or self.trial_number is None:
            return
        storage = optuna.storages.RDBStorage(self.storage)
        study = optuna.load_study(study_name=self.study_name, storage=storage, pruner=instantiate(self.pruner))
        study_id = storage.get_study_id_from_name(self.study_name)
        self.trial = optuna.Trial(study, storage.get_trial_id_from_study_id_trial_number(study_id, self.trial_number))

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:  # not `validate` after fit
            return
        pruned = False
        value = trainer.callback_metrics.get(self.metric)
        if self.trial is not None and value is not None:  # one not logged is named by the best checkpoint's callback
            self.trial.report(value.item(), self.validations)
            pruned = self.trial.should_prune()
        pruned = trainer.strategy.broadcast(pruned, src=0)
        if pruned:
            trainer.should_stop = True
            if trainer.is_global_zero:
                pruner = type(self.trial.study.pruner).__name__
                Path(self.run_dir, PRUNED_FILE).write_text(
                    f"pruned: {pruner} stopped this trial after its validation {self.validations} "
                    f"({self.metric} {value.item():.6g}, epoch {trainer.current_epoch}, step {trainer.global_step})\n"
                )
        self.validations += 1

    def state_dict(self) -> dict[str, int]:
        return {"validations": self.validations}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        self.validations = state_dict["validations"]


def trial_pruning(cfg: DictConfig) -> list[L.Callback]:
    """The pruning callback where this run is (a rank of) a trial of a search with a pruner; none otherwise."""
    if not HydraConfig.initialized():
        return []
    sweeper = HydraConfig.get().sweeper
    if sweeper.get("pruner") is None:
        return []
    trial_number = HydraConfig.get().job.num if in_sweep_job() else None
    return [
        TrialPruning(
            sweeper.storage, sweeper.study_name, sweeper.pruner, trial_number, cfg.optimized_metric, cfg.run_dir
        )
    ]
