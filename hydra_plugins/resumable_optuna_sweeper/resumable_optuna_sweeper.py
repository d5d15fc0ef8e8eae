"""ResumableOptunaSweeper: an Optuna search (Optuna 4 or 5, ask and tell) whose study lives in the sweep dir.

Hydra takes sweepers from the `hydra_plugins` package only, hence this file's place; importing it registers the
`hydra/sweeper: optuna` config that conf/hparams_search/mnist_optuna.yaml overrides. Each batch of `n_jobs` trials is
asked of the study, launched through the configured launcher (in this process, or as Slurm jobs via submitit) with
job number = trial number, and told what each job returned. The search space is `hydra.sweeper.params` plus the
command line, in Hydra's override grammar; the direction is `optimized_mode`'s.

Its study is kept in `storage` (a SQLite file of the sweep dir), so the same command run again with
`hydra.sweep.dir=<that dir>` carries on where it stopped:
- `n_trials` counts the trials to finish in all, so only those still missing are run;
- jobs are numbered on from the stored trials (job dir N is trial N), so no earlier job dir is written over;
- the sampler is reseeded at random: seeded as in the first run, it would suggest that run's parameters again
  (TPE's first trials are random draws), so the continuation's suggestions are new but not reproducible;
- a trial still marked running whose job left its results.json finished just before the kill: it is told so;
- any other trial still marked running was interrupted (its process was killed): it is marked failed, its job
  dir gets an `interrupted.txt` (the sweep summary shows the job as `interrupted`, which does not fail the
  sweep), and its parameters are tried again first, as a new trial; a trial that finished is never run again.
A trial whose job failed (it returned None, `project.engine.errors`, or raised) is a failed trial of the study and the
search goes on. A trial its job's pruner stopped (`project.optional.optuna.pruning`, which leaves `pruned.txt` in the
job dir) is a pruned one. The summary table (`project.engine.sweeps`) ends the search, also one without a finished
trial.
A search space, storage or pruner that cannot be used ends the search before its first job, in one `error:` line.
"""

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy.exc
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, Transformer
from hydra.core.plugins import Plugins
from hydra.errors import HydraException
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import MISSING, DictConfig, OmegaConf
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from project.engine.errors import UserError
from project.engine.sweeps import INTERRUPTED_FILE, PRUNED_FILE, refuse

log = logging.getLogger(__name__)
DIRECTIONS = {"max": "maximize", "min": "minimize"}


@dataclass
class ResumableOptunaSweeperConf:
    """`hydra/sweeper: optuna`: the keys conf/hparams_search/mnist_optuna.yaml sets."""

    _target_: str = "hydra_plugins.resumable_optuna_sweeper.resumable_optuna_sweeper.ResumableOptunaSweeper"
    # The study's database URL (sqlite:///${hydra.sweep.dir}/optuna.db): the trials' jobs reach it too (pruning),
    # wherever they run. No default: OmegaConf resolves a default's ${...} as a config is merged over it, which would
    # claim a sweep dir of its own.
    storage: str = MISSING
    study_name: str = MISSING
    n_trials: int = 20
    n_jobs: int = 1
    # `_target_` + arguments of an Optuna sampler; none: Optuna's default (TPE, unseeded).
    sampler: Any = None
    # `_target_` + arguments of an Optuna pruner; none: every trial runs to its end.
    pruner: Any = None
    params: Any = None
    # Not needed: the search follows optimized_mode. Read only so that a config written for Hydra's Optuna sweeper
    # still runs where it agrees (and is refused where it does not).
    direction: Any = None


ConfigStore.instance().store(
    group="hydra/sweeper", name="optuna", node=ResumableOptunaSweeperConf, provider="resumable_optuna_sweeper"
)


def distribution(override: Override) -> BaseDistribution | None:
    """The Optuna distribution of one `key=<sweep>` override, or None for a fixed value: `choice(...)` and a
    shuffled `range` are categorical; `range(a, b, s)` is the numbers Hydra's `-m` would run (b excluded);
    `interval(a, b)` is uniform over the floats between, `tag(log, interval(a, b))` log-uniform."""
    if not override.is_sweep_override():
        return None
    sweep = override.value()
    if override.is_choice_sweep() or (override.is_range_sweep() and sweep.shuffle):
        choices = list(override.sweep_iterator(transformer=Transformer.encode))
        if not choices:
            raise ValueError("it has no values to choose from")
        return CategoricalDistribution(choices)
    if override.is_range_sweep():
        values = list(override.sweep_iterator())
        if not values:
            raise ValueError("the range holds no number")
        if all(isinstance(value, int) for value in (sweep.start, sweep.stop, sweep.step)):
            return IntDistribution(values[0], values[-1], step=sweep.step)
        return FloatDistribution(values[0], values[-1], step=sweep.step)
    if override.is_interval_sweep():  # Hydra's interval is of floats, whatever its ends look like
        return FloatDistribution(sweep.start, sweep.end, log="log" in sweep.tags)
    raise ValueError("Optuna searches choice, range and interval sweeps only")


def search_space(overrides: list[str]) -> tuple[dict[str, BaseDistribution], list[str]]:
    """The distributions to search and the fixed overrides every trial gets; of two for one key the later counts (the
    command line's over `hydra.sweeper.params`): a key given a fixed value there is not searched."""
    space: dict[str, BaseDistribution] = {}
    fixed: dict[str, str] = {}
    for text in overrides:
        try:
            override = OverridesParser.create().parse_override(text)
            dist = distribution(override)
        except (HydraException, ValueError) as error:
            raise UserError(
                f"the search space's {text} (hydra.sweeper.params or the command line): "
                f"{' '.join(str(error).split())}: give choice(a, b, ...), range(start, stop, step), "
                "interval(low, high) or tag(log, interval(low, high)) with low < high (and low > 0 on a log scale), "
                "or a fixed value"
            ) from None
        key = override.get_key_element()
        space.pop(key, None)
        fixed.pop(key, None)
        if dist is None:
            fixed[key] = text
        else:
            space[key] = dist
    return space, list(fixed.values())


def search_direction(optimized_mode: str, direction: str | None) -> str:
    """Optuna's direction for `optimized_mode`; a `hydra.sweeper.direction` that says otherwise is refused."""
    follows = DIRECTIONS[optimized_mode]
    if direction not in (None, follows):
        raise UserError(
            f"hydra.sweeper.direction={direction} disagrees with optimized_mode={optimized_mode}, which the search "
            f"follows ({follows}): remove hydra.sweeper.direction, and set optimized_mode=min|max"
        )
    return follows


def open_study(url: str, study_name: str, direction: str, sampler: Any, pruner: Any) -> optuna.Study:
    """The stored study (made where there is none); a storage Optuna cannot use is the user's to fix or move."""
    database = url.removeprefix("sqlite:///")
    try:
        return optuna.create_study(
            storage=url, study_name=study_name, direction=direction, sampler=sampler, pruner=pruner, load_if_exists=True
        )
    except sqlalchemy.exc.DatabaseError as error:
        problem = str(error.orig) if error.orig is not None else str(error).splitlines()[0]
        if "is not a database" in problem:
            raise UserError(
                f"{database} (hydra.sweeper.storage) is not a database the sweeper can carry its study on ({problem}): "
                "move it away to start the search afresh, or give another hydra.sweep.dir"
            ) from None
        raise UserError(
            f"hydra.sweeper.storage={url} cannot be opened ({problem}): give a storage in a directory you can write "
            "(by default <hydra.sweep.dir>/optuna.db)"
        ) from None
    except sqlalchemy.exc.SQLAlchemyError as error:
        raise UserError(f"hydra.sweeper.storage={url} is no database URL Optuna can use ({error})") from None
    except RuntimeError as error:  # a study file of an older Optuna, whose tables this one no longer reads
        if "optuna storage upgrade" not in str(error):
            raise
        raise UserError(
            f"{database} (hydra.sweeper.storage) holds a study of an older Optuna ({' '.join(str(error).split())}): "
            f"upgrade it with `optuna storage upgrade --storage {url}` (keep a copy first), or start afresh with a "
            "new hydra.sweep.dir"
        ) from None


class ResumableOptunaSweeper(Sweeper):
    def __init__(
        self,
        storage: str,
        study_name: str,
        n_trials: int,
        n_jobs: int,
        sampler: optuna.samplers.BaseSampler | None,
        pruner: optuna.pruners.BasePruner | None,
        params: DictConfig | None,
        direction: str | None,
    ) -> None:
        """Hydra passes the sampler and pruner built from their configs (it instantiates the sweeper recursively)."""
        self.storage, self.study_name = storage, study_name
        self.n_trials, self.n_jobs = n_trials, n_jobs
        self.sampler, self.pruner, self.params = sampler, pruner or optuna.pruners.NopPruner(), params
        self.direction = direction

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            config=config, hydra_context=hydra_context, task_function=task_function
        )

    def sweep(self, arguments: list[str]) -> None:
        params = [f"{key}={value}" for key, value in OmegaConf.to_container(self.params or OmegaConf.create()).items()]
        try:
            space, fixed = search_space([*params, *arguments])
            study = open_study(
                self.storage,
                self.study_name,
                search_direction(self.config.optimized_mode, self.direction),
                self.sampler,
                self.pruner,
            )
        except UserError as error:
            refuse(str(error))
        sweep_dir = Path(self.config.hydra.sweep.dir)
        to_go = self.n_trials - self._carry_on(study, sweep_dir)
        while to_go > 0:
            trials = [study.ask(space) for _ in range(min(self.n_jobs, to_go))]
            overrides = [(*(f"{key}={value}" for key, value in trial.params.items()), *fixed) for trial in trials]
            returns = self.launcher.launch(overrides, initial_job_idx=trials[0].number)
            for trial, job in zip(trials, returns, strict=True):
                state, value = self._outcome(job, sweep_dir / str(trial.number))
                study.tell(trial.number, value, state=state)
            to_go -= len(trials)
        self._log_best(study)

    @staticmethod
    def _outcome(job: Any, job_dir: Path) -> tuple[TrialState, float | None]:
        """What a job's trial is told: failed where it returned no value (or raised), else pruned or complete."""
        try:
            value = job.return_value  # re-raises what the job raised
        except Exception as error:
            log.warning(f"trial {job_dir.name} failed: {error}")
            return TrialState.FAIL, None
        if value is None:
            return TrialState.FAIL, None
        if (job_dir / PRUNED_FILE).is_file():
            return TrialState.PRUNED, None  # Optuna takes the last value the job reported
        return TrialState.COMPLETE, float(value)

    def _carry_on(self, study: optuna.Study, sweep_dir: Path) -> int:
        """Settle the trials a stopped run left running (module docstring); the number of trials finished before."""
        trials = study.get_trials(deepcopy=False)
        if not trials:
            return 0
        for trial in [t for t in trials if t.state == TrialState.RUNNING]:
            job_dir = sweep_dir / str(trial.number)
            results = job_dir / "results.json"
            value = json.loads(results.read_text()).get(self.config.optimized_metric) if results.is_file() else None
            if value is not None:  # killed after the job had finished, before the study heard of it
                pruned = (job_dir / PRUNED_FILE).is_file()
                study.tell(trial.number, None if pruned else value, state=TrialState.PRUNED if pruned else None)
                continue
            study.tell(trial.number, state=TrialState.FAIL)
            study.enqueue_trial(trial.params)  # a waiting trial, numbered next
            job_dir.mkdir(parents=True, exist_ok=True)  # the marker also says which trials the count leaves out
            (job_dir / INTERRUPTED_FILE).write_text(
                f"interrupted: the search was stopped during this trial; its parameters were tried again as "
                f"trial {len(study.trials) - 1}\n"
            )
        finished = [
            t
            for t in study.get_trials(deepcopy=False)
            if t.state.is_finished() and not (sweep_dir / str(t.number) / INTERRUPTED_FILE).is_file()
        ]
        study.sampler.reseed_rng()
        log.info(
            f"carrying on the study {self.study_name}: {len(finished)} trial(s) finished, "
            f"{max(0, self.n_trials - len(finished))} to go"
        )
        return len(finished)

    def _log_best(self, study: optuna.Study) -> None:
        """The best trial in the log and in `optimization_results.yaml` of the sweep dir, where there is one."""
        if not any(trial.state == TrialState.COMPLETE for trial in study.get_trials(deepcopy=False)):
            log.warning(f"no trial of the study {self.study_name} finished: it has no best parameters")
            return
        best = study.best_trial
        log.info(f"best trial {best.number}: {self.config.optimized_metric} {best.value}, parameters {best.params}")
        OmegaConf.save(
            OmegaConf.create({"name": "optuna", "best_params": best.params, "best_value": best.value}),
            Path(self.config.hydra.sweep.dir) / "optimization_results.yaml",
        )
