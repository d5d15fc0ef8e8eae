"""Pruning a trial of an Optuna search from inside its training job, for any LightningModule.

With `hydra.sweeper.pruner` set (conf/hparams_search/, hydra_plugins/resumable_optuna_sweeper/), each trial's job
reports its `optimized_metric` to the study after every validation, and stops where the pruner says so, through
`TrialPruning`, a callback the search's config adds (`callbacks.trial_pruning`). The job may run in another process
than the sweeper (a Slurm job), so it goes through the study's storage, the trial found by its number, which is the
job's number. Step N of the report is the trial's N-th validation (0 first), whatever the
batch size, so trials of different batch sizes are compared at the same point: a pruner's `n_warmup_steps` counts
validations.

A pruned trial ends as a short run: training stops after that validation (its checkpoints are written, as at any
epoch end), and the run is tested and writes its results as usual, so its job dir reads like any other; it also gets
`pruned.txt`, from which the sweeper tells the study the trial was pruned and the summary lists it as `pruned`.
Under DDP only rank 0 talks to the study; its decision is broadcast, so every rank stops at the same step.
"""

from pathlib import Path

import lightning as L
import optuna
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from lightning.pytorch.trainer.states import TrainerFn

from project.engine.errors import UserError, in_sweep_job, quoted
from project.engine.sweeps import PRUNED_FILE
from project.optional.optuna.storage import open_storage


class TrialPruning(L.Callback):
    """Reports `metric` to this job's trial of the stored study at each validation end, and stops the run where the
    search's pruner (`hydra.sweeper.pruner`) says so; does nothing outside a search with a pruner.

    The ranks that rank 0 started (single runs of its job) only hear its decision; `run_dir` gets the mark."""

    def __init__(self, metric: str, run_dir: str) -> None:
        self.metric, self.run_dir = metric, run_dir
        sweeper = HydraConfig.get().sweeper if HydraConfig.initialized() else {}
        self.active = sweeper.get("pruner") is not None
        self.sweeper = sweeper
        self.validations = 0
        self.trial: optuna.Trial | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit" or not self.active or not trainer.is_global_zero or not in_sweep_job():
            return
        storage = open_storage(self.sweeper.storage)
        study_name = self.sweeper.study_name
        study = optuna.load_study(study_name=study_name, storage=storage, pruner=instantiate(self.sweeper.pruner))
        study_id = storage.get_study_id_from_name(study_name)
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, HydraConfig.get().job.num)
        self.trial = optuna.Trial(study, trial_id)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.active or trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:  # not `validate`
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
        """The count of validations a resumed trial had reported, refused in one line where a checkpoint holds none."""
        validations = state_dict.get("validations")
        if type(validations) is not int or validations < 0:
            raise UserError(
                f"ckpt_path: the checkpoint's TrialPruning state holds validations={quoted(validations)}, not a count "
                "of validations: resume from a checkpoint project.train wrote, or train afresh (without ckpt_path)"
            )
        self.validations = validations
