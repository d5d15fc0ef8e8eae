"""The storage of a search's study, named by one URL (`hydra.sweeper.storage`), read by the sweeper and the jobs.

- `sqlite:///<file>` or any database URL SQLAlchemy takes (`postgresql://...`): Optuna's RDBStorage. SQLite needs
  file locking that works, which a shared disk (NFS, Lustre) often does not give.
- `journal://<file>` (the path as written after `//`: `journal:///shared/search.log` is absolute, as in a file
  URL, `journal://outputs/search.log` relative to the working directory): Optuna's JournalStorage on an
  append-only file, which works on a shared disk. Its directory is made.

Several workers share a study through its storage, and a worker that dies leaves its trial running: the sweeper
tells such a trial from a live one by its heartbeat (`record_heartbeat`, `stale_trial_ids`), which its worker
records every `heartbeat_interval` seconds while the trial runs, the first as soon as it has asked for the trial.
RDBStorage keeps Optuna's own heartbeats, but never takes a trial without one for stale: `HeartbeatRDBStorage` does,
counted from its start (a worker that died between asking for it and its first heartbeat), or the other workers
would wait for it without end. Optuna's JournalStorage has none, so `HeartbeatJournalStorage` records them as a
system attribute of the trial. Both stamp with the workers' clocks, which must agree to well within `grace_period`,
as NTP keeps them. Optuna records and reads heartbeats inside `Study.optimize` only; an ask-and-tell worker reaches
them through `record_heartbeat`, `stale_trials` and `mark_failed` below, the one place that touches Optuna's private
names (`study._storage`, `trial._trial_id`, `_get_stale_trial_ids`, the RDB's tables).
"""

import warnings
from datetime import datetime, timedelta
from pathlib import Path

import optuna
import sqlalchemy.exc
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.storages._rdb import models
from optuna.storages._rdb.storage import _create_scoped_session
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, TrialState

JOURNAL_PREFIX = "journal://"
# Tries at opening a database that other workers may be creating at the same moment (each makes some of its tables).
CREATION_ATTEMPTS = 5
# The trial's system attribute holding its last heartbeat (seconds since the epoch) in a journal.
HEARTBEAT_ATTR = "heartbeat"


class HeartbeatJournalStorage(JournalStorage, BaseHeartbeat):
    """A JournalStorage whose running trials' workers record heartbeats, as RDBStorage's do."""

    def __init__(self, path: Path, heartbeat_interval: int | None, grace_period: int | None) -> None:
        super().__init__(JournalFileBackend(str(path)))  # Optuna 4's name; JournalFileStorage before
        self.heartbeat_interval, self.grace_period = heartbeat_interval, grace_period

    def record_heartbeat(self, trial_id: int) -> None:
        self.set_trial_system_attr(trial_id, HEARTBEAT_ATTR, datetime.now().timestamp())

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        """Running trials whose last heartbeat is older than the grace period; a trial with none yet counts from its
        start (a retry copies its original's attributes, so the later of the two counts)."""
        grace = self.grace_period or 2 * (self.heartbeat_interval or 0)
        now = datetime.now().timestamp()
        return [
            trial._trial_id
            for trial in self.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,))
            if now - max(trial.system_attrs.get(HEARTBEAT_ATTR, 0), trial.datetime_start.timestamp()) > grace
        ]

    def get_heartbeat_interval(self) -> int | None:
        return self.heartbeat_interval

    def get_heartbeat_stale_trial_callback(self) -> None:
        return None  # the sweeper settles stale trials itself (it first looks for a result the job left)

    def get_failed_trial_callback(self) -> None:  # the name of the same question before Optuna 4.9
        return None


class HeartbeatRDBStorage(RDBStorage):
    """Optuna's RDBStorage, where a running trial that never had a heartbeat is stale too once its start is older
    than the grace period, as in `HeartbeatJournalStorage`."""

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        grace = self.grace_period or 2 * (self.heartbeat_interval or 0)
        started_before = datetime.now() - timedelta(seconds=grace)  # a trial's start reads back in local time
        with _create_scoped_session(self.scoped_session) as session:
            never_beat = (
                session.query(models.TrialModel.trial_id)
                .filter(models.TrialModel.study_id == study_id)
                .filter(models.TrialModel.state == TrialState.RUNNING)
                .filter(~models.TrialModel.heartbeats.any())
                .all()
            )
        old = [trial_id for (trial_id,) in never_beat if self.get_trial(trial_id).datetime_start < started_before]
        return super()._get_stale_trial_ids(study_id) + old


def record_heartbeat(study: optuna.Study, trial: optuna.Trial) -> None:
    study._storage.record_heartbeat(trial._trial_id)


def stale_trials(study: optuna.Study) -> list[FrozenTrial]:
    """The running trials of the study whose heartbeat is older than the storage's grace period, as Optuna's
    `fail_stale_trials` finds them."""
    return [study._storage.get_trial(trial_id) for trial_id in study._storage._get_stale_trial_ids(study._study_id)]


def mark_failed(study: optuna.Study, trial: FrozenTrial) -> bool:
    """Mark a running trial failed; False where it is finished already (another worker marked it first): the
    storage takes one of two such updates, as in Optuna's `fail_stale_trials`."""
    try:
        return study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
    except UpdateFinishedTrialError:
        return False


def open_storage(url: str, heartbeat_interval: int | None = None, grace_period: int | None = None) -> BaseStorage:
    """The storage `url` names; with a heartbeat interval, one whose trials' workers record heartbeats. Raises what
    the storage raises (OSError for a journal file, SQLAlchemy's errors for a database)."""
    if url.startswith(JOURNAL_PREFIX):
        path = Path(url.removeprefix(JOURNAL_PREFIX))
        path.parent.mkdir(parents=True, exist_ok=True)
        return HeartbeatJournalStorage(path, heartbeat_interval, grace_period)
    with warnings.catch_warnings():  # heartbeats are experimental in Optuna's eyes, stable since 2.9 in fact
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        for attempt in range(CREATION_ATTEMPTS):
            try:
                return HeartbeatRDBStorage(url, heartbeat_interval=heartbeat_interval, grace_period=grace_period)
            except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.OperationalError) as error:
                # Another worker made the database's tables at the same moment (`UNIQUE constraint failed`,
                # `table ... already exists`): the next attempt finds them made.
                raced = isinstance(error, sqlalchemy.exc.IntegrityError) or "already exists" in str(error)
                if not raced or attempt == CREATION_ATTEMPTS - 1:
                    raise
