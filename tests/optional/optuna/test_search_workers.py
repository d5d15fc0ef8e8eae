"""Three searches on one storage and study are workers of one search; one killed mid-trial is retried by another.

The reported fault: two searches on one SQLite study, the second taking the first's running trial for its own
interrupted one and failing it; both storages are run."""

import os
import signal
import time
from pathlib import Path

import optuna
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from tests.helpers import start_module

pytestmark = pytest.mark.slow
TRIALS = 6
WORKERS = 3
KILLED = 2  # the worker killed during its first trial


STORAGES = {  # the URL, and the storage to read the study back with
    "journal": ("journal://{dir}/study.log", lambda d: JournalStorage(JournalFileBackend(str(d / "study.log")))),
    "sqlite": ("sqlite:///{dir}/study.db", lambda d: f"sqlite:///{d}/study.db"),
}


def worker_arguments(tmp_path: Path, worker: int, storage: str) -> list[str]:
    """Toy trials of a few epochs, each worker its own sweep dir, one storage for all; heartbeats each second, a
    trial without one for 6 s taken for one whose worker is gone. A live worker's heartbeat can miss 2 s on a busy
    2-core machine (CI's, beside the suite's other processes): its trial would be taken for a dead one's."""
    return [
        "hydra.mode=MULTIRUN",
        "hparams_search=mnist_optuna",
        "trainer=cpu",
        "trainer.max_epochs=5",
        "data.batch_size=choice(2,4)",
        f"hydra.sweeper.n_trials={TRIALS}",
        f"hydra.sweeper.storage={STORAGES[storage][0].format(dir=tmp_path)}",
        "hydra.sweeper.heartbeat_interval=1",
        "hydra.sweeper.grace_period=6",
        f"hydra.sweep.dir={tmp_path}/worker-{worker}",
    ]


def running_job(sweep_dir: Path) -> Path | None:
    """A job of the sweep that has started training (it logged its config) and not finished."""
    for log in sweep_dir.glob("*/train.log"):
        if "Config" in log.read_text() and not (log.parent / "results.json").exists():
            return log.parent
    return None


@pytest.mark.parametrize("storage", STORAGES)
def test_workers_share_n_trials_and_a_killed_workers_trial_is_retried_once_by_another(tmp_path: Path, storage: str):
    started = time.monotonic()
    workers = [
        start_module(
            "project.train",
            worker_arguments(tmp_path, worker, storage),
            tmp_path,
            tmp_path / f"worker-{worker}.out",
            tmp_path / f"worker-{worker}.err",
            new_session=True,
        )
        for worker in range(WORKERS)
    ]
    killed = workers[KILLED]
    try:
        deadline = time.monotonic() + 300
        while (job := running_job(tmp_path / f"worker-{KILLED}")) is None:
            assert killed.poll() is None, (tmp_path / f"worker-{KILLED}.err").read_text()[-3000:]
            assert time.monotonic() < deadline, "the worker never started a trial"
            time.sleep(0.02)
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait()
        survivors = [worker for worker in range(WORKERS) if worker != KILLED]
        for worker in survivors:
            assert workers[worker].wait(timeout=600) == 0, (tmp_path / f"worker-{worker}.err").read_text()[-3000:]
    finally:
        for process in workers:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    wall = time.monotonic() - started

    trials = optuna.load_study(study_name="mnist_optuna", storage=STORAGES[storage][1](tmp_path)).trials
    run = [trial for trial in trials if "not_run" not in trial.user_attrs]
    assert sum(trial.state == TrialState.COMPLETE for trial in run) == TRIALS, [(t.number, t.state) for t in trials]
    assert all(trial.state.is_finished() for trial in trials)

    interrupted = trials[int(job.name)]
    assert interrupted.state == TrialState.FAIL and interrupted.user_attrs["job_dir"] == str(job)
    retries = [trial for trial in trials if trial.system_attrs.get("retry_history") == [interrupted.number]]
    assert len(retries) == 1, "retried once"
    retry = retries[0]
    assert retry.state == TrialState.COMPLETE and retry.params == interrupted.params
    assert Path(retry.user_attrs["job_dir"]).parent.name in {f"worker-{worker}" for worker in survivors}
    assert [t.number for t in run if t.state == TrialState.FAIL] == [interrupted.number], "no live trial failed"
    marker = (job / "interrupted.txt").read_text()
    assert marker.startswith("interrupted: the worker running this trial stopped; ")
    assert marker.rstrip().endswith(f"tried again as trial {retry.number}")

    ran_by = {}
    for worker in survivors:
        stdout = (tmp_path / f"worker-{worker}.out").read_text()
        assert "Traceback" not in (tmp_path / f"worker-{worker}.err").read_text()
        mine = sorted(t.number for t in run if Path(t.user_attrs["job_dir"]).parent.name == f"worker-{worker}")
        summary = stdout[stdout.index(f"Sweep: {len(mine)} job(s)") :]
        assert [int(line.split()[0]) for line in summary.splitlines() if line[:1].isdigit()] == mine
        assert f"this worker ran trial(s) {', '.join(map(str, mine))} of the study" in stdout
        assert "best trial of the study: " in stdout
        ran_by[worker] = mine
    print(
        f"\n{storage}: trials per worker {ran_by}, worker {KILLED} killed in trial {interrupted.number}; {wall:.1f} s"
    )
