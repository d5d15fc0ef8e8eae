"""An Optuna search that survives a crash: its study lives in a SQLite file in the sweep dir, and the same command
run again with `hydra.sweep.dir=<that dir>` carries on where it stopped. (Hydra takes sweepers from the
`hydra_plugins` package only, hence this file's place; conf/hparams_search/mnist_optuna.yaml uses it.)

Hydra's Optuna sweeper already loads a stored study (`load_if_exists`), but then runs `n_trials` more and numbers
its jobs from 0 again, over the first run's job dirs. `ResumableOptunaSweeper` first looks at the stored study:
- `n_trials` counts the trials to finish in all, so only those still missing are run;
- jobs are numbered on from the stored trials (job dir N is trial N), so no earlier job dir is written over;
- the sampler is reseeded at random: seeded as in the first run, it would suggest that run's parameters again
  (TPE's first trials are random draws), so the continuation's suggestions are new but not reproducible;
- a trial still marked running whose job left its results.json finished just before the kill: it is told so;
- any other trial still marked running was interrupted (its process was killed): it is marked failed, its job
  dir gets an `interrupted.txt` (the sweep summary shows the job as `interrupted`, which does not fail the
  sweep), and its parameters are tried again first, as a new trial; a trial that finished is never run again.
A trial whose job failed (the job returns None: `project.errors`) is a failed trial of the study and the search goes
on; a search in which no trial finished ends with its summary table, not with the plugin's traceback.
"""

import json
import logging
from pathlib import Path

import optuna
from hydra_plugins.hydra_optuna_sweeper.optuna_sweeper import OptunaSweeper

from project.runs.sweep_summary import INTERRUPTED_FILE

log = logging.getLogger(__name__)


class ResumableOptunaSweeper(OptunaSweeper):
    def sweep(self, arguments: list[str]) -> None:
        search = self.sweeper  # the plugin's implementation: study name, storage, n_trials, job numbering
        stored = str(search.storage or "")
        if stored.startswith("sqlite:///") and Path(stored.removeprefix("sqlite:///")).is_file():
            self._carry_on(search)
        try:
            return super().sweep(arguments)
        except ValueError:
            # The plugin ends by asking the study for its best trial, which one without a finished trial has not.
            study = optuna.load_study(study_name=search.study_name, storage=search.storage)
            if any(trial.state == optuna.trial.TrialState.COMPLETE for trial in study.trials):
                raise
            log.warning(f"no trial of the study {search.study_name} finished: it has no best parameters")

    @staticmethod
    def _carry_on(search) -> None:
        try:
            study = optuna.load_study(study_name=search.study_name, storage=search.storage)
        except KeyError:  # no study of that name stored yet: a fresh search
            return
        sweep_dir = Path(search.config.hydra.sweep.dir)
        for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            results = sweep_dir / str(trial.number) / "results.json"
            value = json.loads(results.read_text()).get(search.config.optimized_metric) if results.is_file() else None
            if value is not None:  # killed after the job had finished, before the study heard of it
                study.tell(trial.number, values=[value])
                continue
            study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
            study.enqueue_trial(trial.params)  # a waiting trial, numbered next
            job_dir = sweep_dir / str(trial.number)
            job_dir.mkdir(parents=True, exist_ok=True)  # the marker also says which trials the count leaves out
            (job_dir / INTERRUPTED_FILE).write_text(
                f"interrupted: the search was stopped during this trial; its parameters were tried again as "
                f"trial {len(study.trials) - 1}\n"
            )
        trials = study.get_trials(deepcopy=False)
        finished = [
            t for t in trials if t.state.is_finished() and not (sweep_dir / str(t.number) / INTERRUPTED_FILE).is_file()
        ]
        search.n_trials = max(0, search.n_trials - len(finished))
        if isinstance(search.sampler, optuna.samplers.BaseSampler):
            search.sampler.reseed_rng()
        search.job_idx = sum(t.state != optuna.trial.TrialState.WAITING for t in trials)  # the next ask()'s number
        log.info(
            f"carrying on the study {search.study_name}: {len(finished)} trial(s) finished, "
            f"{search.n_trials} to go, numbered from {search.job_idx}"
        )
