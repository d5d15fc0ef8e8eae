"""The sweeper's reading of its search space and storage, in-process: what Optuna is given, or the one line a user
gets instead (the searches themselves run in tests/test_search_*.py and tests/fault_cases.py)."""

import random
import warnings
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState

from project.engine.errors import UserError
from project.optional.optuna import storage as storage_module
from project.optional.optuna.search import (
    NOT_RUN_ATTR,
    OptunaSearch,
    consecutive_runs,
    counted,
    open_study,
    search_direction,
    search_space,
)
from project.optional.optuna.storage import open_storage, record_heartbeat, stale_trials

HEARTBEATS = (10, 60)  # seconds: interval, grace period


def test_the_search_space_takes_the_values_hydra_sweeps_and_the_last_word_on_a_key():
    """`range` stops before its end as in `-m`, `interval` is of floats as in Hydra; a fixed value on the command line
    takes the key out of the search."""
    space, fixed = search_space(
        [
            "a=range(1,5)",
            "b=tag(log, interval(0.0001, 0.01))",
            "c=interval(1, 4)",
            "d=choice(x, 'y z')",
            "data.batch_size=choice(64, 128)",
            "data.batch_size=64",
            "e=range(0.5, 1.0, 0.25)",
        ]
    )
    assert space == {
        "a": optuna.distributions.IntDistribution(1, 4),
        "b": optuna.distributions.FloatDistribution(0.0001, 0.01, log=True),
        "c": optuna.distributions.FloatDistribution(1.0, 4.0),
        "d": optuna.distributions.CategoricalDistribution(["x", "y z"]),
        "e": optuna.distributions.FloatDistribution(0.5, 0.75, step=0.25),
    }
    assert fixed == ["data.batch_size=64"]


@pytest.mark.parametrize(
    ("override", "problem"),
    [
        ("lr=interval(1, a)", "mismatch type argument end"),
        ("lr=choice()", "empty choice"),
        ("lr=interval(0.1, 0.01)", "low <= high"),
        ("lr=tag(log, interval(0, 1))", "low > 0"),
        ("lr=range(5, 1)", "the range holds no number"),
    ],
)
def test_a_search_space_optuna_cannot_search_is_one_line_naming_the_key_and_the_forms(override: str, problem: str):
    with pytest.raises(UserError) as refused:
        search_space(["data.batch_size=64", override])
    message = str(refused.value)
    assert message.startswith(f"the search space's {override} ") and problem in message and "\n" not in message
    assert "tag(log, interval(low, high))" in message


def test_a_storage_that_is_no_database_or_cannot_be_written_is_refused_naming_it(tmp_path: Path):
    damaged = tmp_path / "optuna.db"
    damaged.write_bytes(random.Random(0).randbytes(4096))
    with pytest.raises(UserError, match=f"^{damaged} .hydra.sweeper.storage. is not a database"):
        open_study(f"sqlite:///{damaged}", "s", "maximize", None, None, HEARTBEATS)
    unwritable = tmp_path / "no-such-dir" / "optuna.db"
    with pytest.raises(UserError, match="cannot be opened .unable to open database file.: give a storage in a"):
        open_study(f"sqlite:///{unwritable}", "s", "maximize", None, None, HEARTBEATS)
    study = open_study(f"sqlite:///{tmp_path / 'fresh.db'}", "s", "minimize", None, None, HEARTBEATS)
    assert study.direction == optuna.study.StudyDirection.MINIMIZE


def test_a_journal_storage_is_made_with_its_directory_and_one_that_is_no_journal_is_refused(tmp_path: Path):
    journal = tmp_path / "searches" / "study.log"
    study = open_study(f"journal://{journal}", "s", "maximize", None, None, HEARTBEATS)
    study.ask()
    assert (
        journal.is_file()
        and len(open_study(f"journal://{journal}", "s", "maximize", None, None, HEARTBEATS).trials) == 1
    )
    not_a_journal = tmp_path / "notes.txt"
    not_a_journal.write_text("some notes\n")
    with pytest.raises(UserError, match=f"^{not_a_journal} .hydra.sweeper.storage. is not an Optuna journal"):
        open_study(f"journal://{not_a_journal}", "s", "maximize", None, None, HEARTBEATS)


@pytest.mark.parametrize("heartbeats", [(0, 60), (10, 10)], ids=["no-interval", "grace-not-longer"])
def test_heartbeats_a_live_worker_could_miss_are_refused(tmp_path: Path, heartbeats: tuple[int, int]):
    with pytest.raises(UserError, match="a grace period longer than it"):
        open_study(f"sqlite:///{tmp_path / 's.db'}", "s", "maximize", None, None, heartbeats)


def test_a_retry_takes_its_originals_place_and_a_trial_not_run_takes_none():
    def trial(number: int, state: TrialState, **attrs: Any) -> FrozenTrial:
        made = optuna.create_trial(state=state, value=0.0 if state == TrialState.COMPLETE else None, **attrs)
        made.number = number
        return made

    trials = [
        trial(0, TrialState.COMPLETE),
        trial(1, TrialState.FAIL),  # its worker gone: retried as 3
        trial(2, TrialState.RUNNING),
        trial(3, TrialState.WAITING, system_attrs={"failed_trial": 1, "retry_history": [1]}),
        trial(4, TrialState.FAIL, user_attrs={NOT_RUN_ATTR: "..."}),
        trial(5, TrialState.FAIL),  # a failed job: it counts
    ]
    assert [t.number for t in counted(trials)] == [0, 3, 2, 5]


def test_a_stored_trial_whose_values_lie_outside_the_search_space_ends_the_search_before_it_runs(tmp_path: Path):
    """A study is data: a waiting trial in its storage (how a retry is queued) is asked with its stored values, which
    become a job's overrides. A retry's own values are the space's; a value planted there (a resolver that would
    make a directory, a number out of range) ends the search in one line before any job, its trials failed."""
    space, _ = search_space(["model.optimizer.lr=interval(0.01, 0.1)", "model.network.num_layers=choice(2, 4)"])
    search = OptunaSearch("sqlite:///" + str(tmp_path / "study.db"), "s", 9, 1, 5, 20, None, None, None, None)
    search.study = optuna.create_study(storage=search.storage, study_name="s")
    search.study.enqueue_trial({"model.optimizer.lr": 0.05, "model.network.num_layers": 4})  # a retry's
    assert search._ask(space, 1)[0].params == {"model.optimizer.lr": 0.05, "model.network.num_layers": 4}
    planted = {"model.optimizer.lr": 7.0, "model.network.num_layers": f"${{launch_dir:{tmp_path}/x}}"}
    for key, value in planted.items():
        search.study.enqueue_trial({"model.optimizer.lr": 0.05, "model.network.num_layers": 2, key: value})
        with pytest.raises(SystemExit) as stopped, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Optuna's own, of a value out of range
            search._ask(space, 1)
        assert stopped.value.code == 2
    assert not (tmp_path / "x").exists()
    assert [trial.state for trial in search.study.get_trials()][1:] == [TrialState.FAIL, TrialState.RUNNING]


def test_the_direction_is_optimized_modes_and_an_older_configs_direction_must_agree():
    assert search_direction("max", None) == search_direction("max", "maximize") == "maximize"
    assert search_direction("min", None) == "minimize"
    with pytest.raises(UserError, match="^hydra.sweeper.direction=maximize disagrees with optimized_mode=min, which"):
        search_direction("min", "maximize")


def test_a_batch_is_launched_in_runs_of_consecutive_trials_so_that_job_n_is_trial_n():
    """Another worker asked trials 5 and 6 between this worker's 4 and 7."""
    study = optuna.create_study()
    asked = [study.ask() for _ in range(9)]
    mine = [asked[n] for n in (2, 3, 4, 7, 8)]
    assert [[trial.number for trial in run] for run in consecutive_runs(mine)] == [[2, 3, 4], [7, 8]]


@pytest.mark.parametrize("url", ["sqlite:///{dir}/study.db", "journal://{dir}/study.log"])
def test_a_running_trial_that_never_had_a_heartbeat_is_stale_once_its_start_is_older_than_the_grace_period(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str
):
    """A worker that died between asking for its trial and the trial's first heartbeat: the other workers must take
    the trial for stale (Optuna's RDBStorage never does), or they would wait for it without end. A trial with a
    heartbeat as old, and a finished one, are not."""
    storage = open_storage(url.format(dir=tmp_path), heartbeat_interval=1, grace_period=2)
    study = optuna.create_study(storage=storage, study_name="s", direction="maximize")
    orphan, beating, finished = study.ask(), study.ask(), study.ask()
    study.tell(finished, 1.0)
    assert stale_trials(study) == []

    later = datetime.now() + timedelta(seconds=5)  # the workers' clock, 5 s on (the database keeps its own)
    monkeypatch.setattr(storage_module, "datetime", type("Later", (datetime,), {"now": staticmethod(lambda: later)}))
    record_heartbeat(study, beating)  # as its worker does every second
    assert [trial.number for trial in stale_trials(study)] == [orphan.number]
