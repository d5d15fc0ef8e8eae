"""`hydra/sweeper=optuna`'s search (Optuna 4 or 5, ask and tell), whose study any number of workers share.

The sweeper Hydra finds (hydra_plugins/resumable_optuna_sweeper/) starts it as a sweep starts. Each batch of `n_jobs`
trials is asked of the study, launched through the configured launcher (in this process, or as Slurm jobs via
submitit) with job number = trial number, and told what each job returned. The search space is
`hydra.sweeper.params` plus the command line, in Hydra's override grammar; the direction is `optimized_mode`'s.

The study is kept in `storage` (project.optional.optuna.storage: SQLite, a database, or a journal file), so
- several searches started on the same storage and `study_name` (terminals, nodes, a Slurm array) are workers of
  one search: `n_trials` counts the study's trials, whichever worker ran them, and no trial is run twice;
- the same command run again with `hydra.sweep.dir=<that dir>` carries on where it stopped (a worker of its own).
A worker asks for a trial while the study has fewer than `n_trials` trials finished or running (`counted`); two
workers asking at the same moment may both get one, so a trial beyond `n_trials` in trial order is not run (it is
told failed, its user attribute `not_run` says why). Job N is trial N in every worker, so job dirs never clash.
A worker records a heartbeat of each trial it runs every `heartbeat_interval` seconds; a running trial without one
for `grace_period` seconds lost its worker (killed, its node lost), and any worker settles it (`_settle_stale`):
- where its job left its results.json (it finished just before the kill), it is told so;
- otherwise it is marked failed, its job dir gets an `interrupted.txt` (the sweep summary shows the job as
  `interrupted`, which does not fail the sweep), and its parameters are tried again once, as a new trial that the
  next worker to ask takes first. A worker with no trial left to ask waits for the others' running trials, so that
  one whose worker dies is still retried. A live trial of another worker is never touched. The job dir is the one
  the trial's user attribute `job_dir` names only where that lies in this worker's sweep dir or is a job dir Hydra
  wrote for that trial (`_job_dir`): a study handed over names any place, and none other is written in.
The sampler is reseeded at random where the study is shared or carried on: seeded as in the first run, it would
suggest that run's (or that worker's) parameters again, so such suggestions are new but not reproducible.
A trial whose job failed (it returned None, `project.engine.errors`, or raised) is a failed trial of the study and the
search goes on, except where its module does not log `optimized_metric`, which every trial would meet alike: that
ends the search at the trial's first validation, in one `error:` line (`project.engine.checkpoints`), the trial
left running in the study as a stopped one is. A trial its job's pruner stopped (`project.optional.optuna.pruning`,
which leaves `pruned.txt` in the job dir) is a pruned one. The summary table (`project.engine.sweeps`) of the jobs
this worker ran ends its search, also one without a finished trial, after the study's best trial.
A search space, storage, heartbeat setting or pruner that cannot be used ends the search before its first job, in
one `error:` line.
"""

import contextlib
import logging
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy.exc
import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, Transformer
from hydra.core.plugins import Plugins
from hydra.errors import HydraException
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, TrialState

from project.engine.build import instantiate_group
from project.engine.errors import UserError, quoted, refuse
from project.engine.run_dir import names_a_url, plain_path_inside
from project.engine.sweeps import INTERRUPTED_FILE, PRUNED_FILE, finished_results
from project.optional.optuna.storage import JOURNAL_PREFIX, mark_failed, open_storage, record_heartbeat, stale_trials

log = logging.getLogger(__name__)
DIRECTIONS = {"max": "maximize", "min": "minimize"}
# A trial's user attribute: where its job runs (any worker settling the trial finds the job's results there).
JOB_DIR_ATTR = "job_dir"
# A trial's user attribute: why it was asked but not run.
NOT_RUN_ATTR = "not_run"
# A retry's system attribute (set by the retry callback): the numbers of the trials it stands in for.
RETRY_HISTORY_ATTR = "retry_history"
# Adds a stale trial's retry (once: a retry whose worker is gone too stays failed); RetryFailedTrialCallback before
# Optuna 4.9, which deprecates that name. Experimental in Optuna's eyes since 2.8: its warning would open every
# search's output.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
    RETRY = (
        getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None) or optuna.storages.RetryFailedTrialCallback
    )(max_retry=1)


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


def outside_the_space(params: dict[str, Any], space: dict[str, BaseDistribution]) -> str | None:
    """`key=value` of the first parameter that `space` does not hold (another key, a value not among a choice's, a
    number out of an interval or range, or no number), or None."""
    if set(params) != set(space):
        return f"the parameters {sorted(params)} (the space's: {sorted(space)})"
    for key, value in params.items():
        dist = space[key]
        if isinstance(dist, CategoricalDistribution):
            inside = value in dist.choices
        else:
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            inside = number and dist.low <= value <= dist.high
        if not inside:
            return f"{key}={value}"
    return None


def search_direction(optimized_mode: str, direction: str | None) -> str:
    """Optuna's direction for `optimized_mode`; a `hydra.sweeper.direction` that says otherwise is refused."""
    follows = DIRECTIONS[optimized_mode]
    if direction not in (None, follows):
        raise UserError(
            f"hydra.sweeper.direction={direction} disagrees with optimized_mode={optimized_mode}, which the search "
            f"follows ({follows}): remove hydra.sweeper.direction, and set optimized_mode=min|max"
        )
    return follows


def open_study(
    url: str, study_name: str, direction: str, sampler: Any, pruner: Any, heartbeats: tuple[int, int]
) -> optuna.Study:
    """The stored study (made where there is none), its trials' heartbeats recorded every `heartbeats[0]` seconds
    and stale after `heartbeats[1]`; a storage Optuna cannot use is the user's to fix or move."""
    interval, grace = heartbeats
    if not 0 < interval < grace:
        raise UserError(
            f"hydra.sweeper.heartbeat_interval={interval} and grace_period={grace}: give a heartbeat interval of a "
            "second or more and a grace period longer than it (a live worker's trial would be taken for one whose "
            "worker is gone)"
        )
    database = url.removeprefix("sqlite:///")
    try:
        storage = open_storage(url, *heartbeats)
        return optuna.create_study(
            storage=storage,
            study_name=study_name,
            direction=direction,
            sampler=sampler,
            pruner=pruner,
            load_if_exists=True,
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
        raise UserError(
            f"hydra.sweeper.storage={url} is no storage URL Optuna can use ({error}): give sqlite:///<file>, "
            f"{JOURNAL_PREFIX}<file> or a database URL"
        ) from None
    except OSError as error:  # a journal file
        raise UserError(
            f"hydra.sweeper.storage={url} cannot be opened ({error.strerror or error}): give a journal file in a "
            "directory you can write"
        ) from None
    except (ValueError, UnicodeDecodeError) as error:  # a file that is no journal (its lines are not JSON)
        if not url.startswith(JOURNAL_PREFIX):
            raise
        raise UserError(
            f"{url.removeprefix(JOURNAL_PREFIX)} (hydra.sweeper.storage) is not an Optuna journal ({error}): move it "
            "away to start the search afresh, or give another file"
        ) from None
    except RuntimeError as error:  # a study file of an older Optuna, whose tables this one no longer reads
        if "optuna storage upgrade" not in str(error):
            raise
        raise UserError(
            f"{database} (hydra.sweeper.storage) holds a study of an older Optuna ({' '.join(str(error).split())}): "
            f"upgrade it with `optuna storage upgrade --storage {url}` (keep a copy first), or start afresh with a "
            "new hydra.sweep.dir"
        ) from None


def retried(trials: list[FrozenTrial]) -> set[int]:
    """The numbers of the trials a retry stands in for (RetryFailedTrialCallback's `retry_history`)."""
    return {number for trial in trials for number in trial.system_attrs.get(RETRY_HISTORY_ATTR, [])}


def counted(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """The trials that count towards `n_trials`, in the order they take its places: every trial finished, running or
    waiting to run, except one a retry stands in for, or one asked beyond `n_trials` and not run; a retry takes the
    place of the trial it stands in for."""
    stood_in_for = retried(trials)
    kept = [trial for trial in trials if trial.number not in stood_in_for and NOT_RUN_ATTR not in trial.user_attrs]
    return sorted(kept, key=lambda trial: (trial.system_attrs.get("failed_trial", trial.number), trial.number))


def consecutive_runs(trials: list[optuna.Trial]) -> Iterator[list[optuna.Trial]]:
    """The batch in runs of consecutive trial numbers: the launcher numbers a launch's jobs on from its first, and
    job N must be trial N (another worker may have asked the numbers in between)."""
    run: list[optuna.Trial] = []
    for trial in trials:
        if run and trial.number != run[-1].number + 1:
            yield run
            run = []
        run.append(trial)
    if run:
        yield run


@contextlib.contextmanager
def heartbeats(study: optuna.Study, trials: list[optuna.Trial], interval: int) -> Iterator[None]:
    """Record the trials' heartbeats every `interval` seconds while the block runs (their jobs), from a thread."""
    stop = threading.Event()

    def beat() -> None:
        while True:
            for trial in trials:
                try:
                    record_heartbeat(study, trial)
                except UpdateFinishedTrialError:
                    pass  # taken for gone by another worker: its tell says so
                except (OSError, sqlalchemy.exc.SQLAlchemyError) as error:  # the next one may reach the storage
                    log.warning(f"the heartbeat of trial {trial.number} did not reach the storage: {error}")
            if stop.wait(interval):
                return

    thread = threading.Thread(target=beat, name="optuna-heartbeats", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def ran_trial(job_dir: object, trial: FrozenTrial) -> bool:
    """Whether `job_dir` is a job dir Hydra wrote for `trial` (in another worker's sweep dir): an absolute local path
    named after its number, whose saved overrides hold its parameters as the sweeper gave them."""
    if not (isinstance(job_dir, str) and job_dir.startswith("/") and not names_a_url(job_dir)):
        return False
    overrides_file = Path(job_dir) / ".hydra" / "overrides.yaml"
    if Path(job_dir).name != str(trial.number) or not overrides_file.is_file():
        return False
    try:
        saved = yaml.safe_load(overrides_file.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    return isinstance(saved, list) and all(f"{key}={value}" in saved for key, value in trial.params.items())


def built(part: Any, name: str) -> Any:
    """The sampler or pruner `part`, built where it is still its config."""
    return instantiate_group(f"hydra.sweeper.{name}", part) if isinstance(part, DictConfig) else part


class OptunaSearch:
    """One worker's search, with `hydra.sweeper`'s settings; set up and run as a Hydra sweeper is (`setup`, then
    `sweep`), by the sweeper Hydra builds."""

    def __init__(
        self,
        storage: str,
        study_name: str,
        n_trials: int,
        n_jobs: int,
        heartbeat_interval: int,
        grace_period: int,
        sampler: optuna.samplers.BaseSampler | DictConfig | None,
        pruner: optuna.pruners.BasePruner | DictConfig | None,
        params: DictConfig | None,
        direction: str | None,
    ) -> None:
        """Hydra 1.3 passes the sampler and pruner built from their configs (it instantiates the sweeper recursively);
        Hydra 1.4 passes their configs, built here."""
        self.storage, self.study_name = storage, study_name
        self.n_trials, self.n_jobs = n_trials, n_jobs
        self.heartbeat_interval, self.grace_period = heartbeat_interval, grace_period
        sampler, pruner = (built(part, name) for part, name in ((sampler, "sampler"), (pruner, "pruner")))
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
                (self.heartbeat_interval, self.grace_period),
            )
        except UserError as error:
            refuse(str(error))
        self.study, self.sweep_dir = study, Path(self.config.hydra.sweep.dir)
        self.ran: list[int] = []
        self.reseeded = False
        self._settle_stale()
        if study.get_trials(deepcopy=False):
            self._reseed(
                f"carrying on the study {self.study_name}: {self._finished_or_running()} of its {self.n_trials} "
                "trial(s) finished or running"
            )
        waiting = False
        while True:
            self._settle_stale()
            room = self.n_trials - self._finished_or_running()
            running = sum(t.state == TrialState.RUNNING for t in study.get_trials(deepcopy=False))
            if room > 0:
                if not self.reseeded and len(study.get_trials(deepcopy=False)) > len(self.ran):
                    self._reseed(f"the study {self.study_name} is shared with other workers")
                self._run_batch(self._ask(space, min(self.n_jobs, room)), fixed)
                waiting = False
            elif running:  # other workers': wait, to retry one whose worker dies
                if not waiting:
                    log.info(f"no trial left to ask; waiting for the {running} trial(s) other workers are running")
                waiting = True
                time.sleep(self.heartbeat_interval)
            else:
                break
        self._log_best()

    def _ask(self, space: dict[str, BaseDistribution], count: int) -> list[optuna.Trial]:
        """`count` trials of the study, or the search ended in one line (its asked trials told failed) where the
        stored study gave one values outside the search space. A waiting trial in the storage (how a retry is
        queued) is asked with its stored values, which become its job's overrides: a study is data, and may not
        choose what a job runs. Optuna itself refuses a value of another type, and only warns of a number out of
        its range."""
        asked: list[optuna.Trial] = []
        try:
            for _ in range(count):
                asked.append(self.study.ask(space))
                outside = outside_the_space(asked[-1].params, space)
                if outside is not None:
                    raise ValueError(outside)
        except ValueError as error:
            for trial in asked:
                self.study.tell(trial, state=TrialState.FAIL)
            refuse(
                f"the study {self.study_name} ({self.storage}) holds a trial whose values lie outside the search "
                f"space ({' '.join(str(error).split())}): a stored study's values are not run; give a new "
                "hydra.sweeper.study_name (or a new hydra.sweep.dir) to search afresh"
            )
        return asked

    def _finished_or_running(self) -> int:
        return sum(t.state != TrialState.WAITING for t in counted(self.study.get_trials(deepcopy=False)))

    def _reseed(self, why: str) -> None:
        self.study.sampler.reseed_rng()
        log.info(f"{why}: the sampler's suggestions are drawn afresh (not reproducible from its seed)")
        self.reseeded = True

    def _run_batch(self, asked: list[optuna.Trial], fixed: list[str]) -> None:
        """Run the trials that fit in `n_trials` (`counted`); tell the others they were not run."""
        for trial in asked:  # at once: a running trial without one is stale once its start is grace_period old
            record_heartbeat(self.study, trial)
        places = [trial.number for trial in counted(self.study.get_trials(deepcopy=False))][: self.n_trials]
        run = [trial for trial in asked if trial.number in places]
        for trial in asked:
            if trial not in run:
                trial.set_user_attr(
                    NOT_RUN_ATTR,
                    f"asked as the study had its {self.n_trials} trials (another worker asked at the same moment)",
                )
                self.study.tell(trial, state=TrialState.FAIL)
        if not run:
            return
        for trial in run:
            trial.set_user_attr(JOB_DIR_ATTR, str((self.sweep_dir / str(trial.number)).absolute()))
        returns = []
        with heartbeats(self.study, run, self.heartbeat_interval):
            for trials_in_a_row in consecutive_runs(run):
                overrides = [
                    (*(f"{key}={value}" for key, value in trial.params.items()), *fixed) for trial in trials_in_a_row
                ]
                returns += self.launcher.launch(overrides, initial_job_idx=trials_in_a_row[0].number)
        for trial, job in zip(run, returns, strict=True):
            state, value = self._outcome(job, self.sweep_dir / str(trial.number))
            try:
                self.study.tell(trial.number, value, state=state)
            except (ValueError, UpdateFinishedTrialError):  # the study already holds it failed (`_settle_stale`)
                log.warning(
                    f"trial {trial.number} was taken for one whose worker is gone (no heartbeat for "
                    f"{self.grace_period} s reached the storage): its job's results stay in its dir, and the study "
                    "keeps the trial failed and runs its retry"
                )
            self.ran.append(trial.number)

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

    def _settle_stale(self) -> None:
        """Settle the running trials whose worker is gone (module docstring); of two workers settling one, the
        storage lets one only (the other's update of a finished trial is refused)."""
        for trial in stale_trials(self.study):
            job_dir = self._job_dir(trial)
            try:
                results = finished_results(job_dir) or {}
            except UserError as error:
                log.warning(f"trial {trial.number}: {error}: it is taken for unfinished")
                results = {}
            value = results.get(self.config.optimized_metric)
            if value is not None:  # killed after the job had finished, before the study heard of it
                pruned = (job_dir / PRUNED_FILE).is_file()
                with contextlib.suppress(ValueError, UpdateFinishedTrialError):  # or another worker told it first
                    self.study.tell(
                        trial.number, None if pruned else value, state=TrialState.PRUNED if pruned else None
                    )
                continue
            if not mark_failed(self.study, trial):
                continue  # another worker settled it
            RETRY(self.study, trial)
            again = [
                t.number
                for t in self.study.get_trials(deepcopy=False)
                if trial.number in t.system_attrs.get(RETRY_HISTORY_ATTR, [])
            ]
            tried = f"its parameters are tried again as trial {again[0]}" if again else "it was a retry already"
            log.warning(
                f"trial {trial.number} had no heartbeat for {self.grace_period} s (its worker is gone): marked "
                f"failed; {tried}"
            )
            job_dir.mkdir(parents=True, exist_ok=True)  # the marker also says which trials the count leaves out
            (job_dir / INTERRUPTED_FILE).write_text(f"interrupted: the worker running this trial stopped; {tried}\n")

    def _job_dir(self, trial: FrozenTrial) -> Path:
        """Where `trial`'s job ran, as the study says (any worker's job dir), where it is a place a job of this
        search may have: in this worker's sweep dir, or a job dir Hydra wrote for this very trial (another worker's:
        named after it, its .hydra/overrides.yaml holding its parameters). A study is data, handed over or shared:
        no other place it names (a home directory, a URL) is written in or has its results read, and the trial's
        place in this sweep dir stands in for it, with a warning."""
        own = self.sweep_dir / str(trial.number)
        stored = trial.user_attrs.get(JOB_DIR_ATTR)
        if stored is None or plain_path_inside(stored, self.sweep_dir) or ran_trial(stored, trial):
            return own if stored is None else Path(stored)
        log.warning(
            f"trial {trial.number}: the study names {quoted(stored)} as its job dir, which is neither in this sweep "
            f"dir nor a job dir of that trial: not used; {own} stands in for it"
        )
        return own

    def _log_best(self) -> None:
        """What this worker ran, and the study's best trial (of all workers) in the log and in
        `optimization_results.yaml` of the sweep dir, where there is one."""
        log.info(f"this worker ran trial(s) {', '.join(map(str, self.ran)) or 'none'} of the study {self.study_name}")
        if not any(trial.state == TrialState.COMPLETE for trial in self.study.get_trials(deepcopy=False)):
            log.warning(f"no trial of the study {self.study_name} finished: it has no best parameters")
            return
        best = self.study.best_trial
        log.info(
            f"best trial of the study: {best.number}, {self.config.optimized_metric} {best.value}, "
            f"parameters {best.params}"
        )
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(
            OmegaConf.create({"name": "optuna", "best_params": best.params, "best_value": best.value}),
            self.sweep_dir / "optimization_results.yaml",
        )
