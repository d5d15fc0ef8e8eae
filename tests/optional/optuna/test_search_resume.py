"""An Optuna search killed mid-trial carries on, run again with its sweep dir, to n_trials finished trials: the killed
trial is retried once its heartbeat is stale (2 s after the kill here; `grace_period` in a search)."""

import os
import signal
import time
from pathlib import Path

import optuna
import pytest

from project.engine.sweeps import INTERRUPTED_FILE, format_sweep_table, job_rows
from tests.helpers import check_ok, mnist_overrides, run_module, start_module

pytestmark = pytest.mark.slow
TRIALS = 4
KILLED_IN = 2  # the trial (and job) the first run is killed in: trials 0 and 1 have finished


def search_arguments(mnist_root: Path, sweep_dir: Path) -> list[str]:
    overrides = mnist_overrides(
        mnist_root, "trainer.max_epochs=1", "hydra.mode=MULTIRUN", "hparams_search=mnist_optuna"
    )
    return [
        *overrides,
        f"hydra.sweeper.n_trials={TRIALS}",
        "hydra.sweeper.heartbeat_interval=1",
        "hydra.sweeper.grace_period=2",
        f"hydra.sweep.dir={sweep_dir}",
    ]


def kill_when_job_starts(args: list[str], cwd: Path, job_dir: Path) -> None:
    """Run the search until the job in `job_dir` is running (Hydra has written its `.hydra/` files, and the job has
    logged its config), then SIGKILL it, ranks and all."""
    search = start_module("project.train", args, cwd, cwd / "search.out", cwd / "search.err", new_session=True)
    log = job_dir / "train.log"
    try:
        deadline = time.monotonic() + 300
        while not (log.is_file() and "Config" in log.read_text()):
            assert search.poll() is None, f"the search ended (exit {search.returncode}) before job {job_dir.name}"
            assert time.monotonic() < deadline, "the search never got to the job"
            time.sleep(0.02)
    finally:
        os.killpg(search.pid, signal.SIGKILL)
        search.wait()


def test_a_killed_search_carries_on_to_n_trials_and_runs_no_finished_trial_again(tmp_path: Path, mnist_root: Path):
    sweep_dir = tmp_path / "search"
    args = search_arguments(mnist_root, sweep_dir)
    kill_when_job_starts(args, tmp_path, sweep_dir / str(KILLED_IN))
    assert not (sweep_dir / str(KILLED_IN) / "results.json").exists(), "killed during the trial"
    before = {job: (sweep_dir / str(job) / "results.json").read_text() for job in range(KILLED_IN)}

    result = check_ok(run_module("project.train", *args, cwd=tmp_path))

    study = optuna.load_study(study_name="mnist_optuna", storage=f"sqlite:///{sweep_dir}/optuna.db")
    states = [trial.state for trial in study.trials]
    complete = optuna.trial.TrialState.COMPLETE
    assert states.count(complete) == TRIALS and states[KILLED_IN] == optuna.trial.TrialState.FAIL
    assert len(states) == TRIALS + 1, "the interrupted trial, and the ones still missing"
    retries = [trial for trial in study.trials if trial.system_attrs.get("retry_history") == [KILLED_IN]]
    assert len(retries) == 1 and retries[0].params == study.trials[KILLED_IN].params, "the interrupted one tried again"
    finished = [tuple(sorted(trial.params.items())) for trial in study.trials if trial.state == complete]
    assert len(set(finished)) == TRIALS, "no finished trial run twice"
    assert {job: (sweep_dir / str(job) / "results.json").read_text() for job in range(KILLED_IN)} == before

    summary = result.stdout[result.stdout.index(f"Sweep: {TRIALS + 1} job(s)") :]
    states_shown = [line.split()[-2] for line in summary.splitlines() if line[:1].isdigit()]
    assert states_shown[KILLED_IN] == "interrupted"
    assert all(value.replace(".", "").isdigit() for i, value in enumerate(states_shown) if i != KILLED_IN)
    assert (sweep_dir / str(KILLED_IN) / "interrupted.txt").read_text().startswith("interrupted: ")


def test_the_summary_lists_an_interrupted_job_killed_before_its_overrides_were_saved(tmp_path: Path):
    """The table shows every trial of the search, also one whose job dir holds nothing but the interruption mark."""
    finished = tmp_path / "0"
    (finished / ".hydra").mkdir(parents=True)
    (finished / ".hydra" / "overrides.yaml").write_text("- seed=1\n")
    (finished / "results.json").write_text('{"val/acc": 0.5}')
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / INTERRUPTED_FILE).write_text("interrupted: ...\n")
    rows = job_rows(tmp_path, "val/acc")
    assert [(row.job, row.overrides, row.error, row.interrupted) for row in rows] == [
        ("0", "seed=1", None, False),
        ("1", "(not saved)", None, True),
    ]
    assert format_sweep_table(rows, "val/acc").splitlines()[5].split()[-2] == "interrupted"


@pytest.mark.parametrize("seed", [2, 1234], ids=["some-fail", "all-fail"])
def test_a_search_whose_trial_fails_records_it_failed_and_runs_the_others(tmp_path: Path, seed: int):
    """A trial whose job fails (batch 100 on the toy's 5 points) is a failed trial of the study, not the end of the
    search: the others run, the summary lists it failed, the search exits 1 (also when no trial finished)."""
    sweep_dir = tmp_path / "search"
    result = run_module(
        "project.train",
        "hydra.mode=MULTIRUN",
        "hparams_search=mnist_optuna",
        "trainer=cpu",
        "hydra.sweeper.n_trials=4",
        f"hydra.sweeper.sampler.seed={seed}",
        "model.optimizer.lr=choice(0.1,0.2)",
        "data.batch_size=choice(2,100)",
        f"hydra.sweep.dir={sweep_dir}",
        cwd=tmp_path,
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    study = optuna.load_study(study_name="mnist_optuna", storage=f"sqlite:///{sweep_dir}/optuna.db")
    assert len(study.trials) == 4
    fail, complete = optuna.trial.TrialState.FAIL, optuna.trial.TrialState.COMPLETE
    for trial in study.trials:
        failed = trial.params["data.batch_size"] == 100
        assert trial.state == (fail if failed else complete), trial
        assert (sweep_dir / str(trial.number) / ("error.txt" if failed else "results.json")).is_file()
    failures = sum(trial.state == fail for trial in study.trials)
    assert (failures == 4) == (seed == 1234) and failures > 0, "the seeds draw batch 100 for some trials, all trials"
    rows = [line.split() for line in result.stdout.splitlines() if line[:1].isdigit()]
    assert sum(row[-2] == "failed" for row in rows) == failures and len(rows) == 4
    assert result.stderr.rstrip().splitlines()[-1].startswith(f"error: {failures} of 4 sweep jobs failed")
