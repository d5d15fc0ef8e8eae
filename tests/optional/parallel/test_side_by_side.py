"""`hydra/launcher=parallel` as a user meets it: jobs at once on devices of their own, in Pythons of their own.

The GPUs are listed (`hydra.launcher.devices`): on a machine without any, each job still gets its own
CUDA_VISIBLE_DEVICES, which is what a job saw that these tests check. The preloaded Python forks the launcher and its
jobs (each with the affinity and session the launcher gave it, tests/preloaded_python.py); the SIGTERM case runs
them as a user's are, fresh interpreters.
"""

import json
import os
import re
import signal
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from tests.faults import (
    SWEEP_FAILED,
    TESTS_IMPORTABLE,
    assert_no_process_left,
    background_run,
    end_of,
    last_line,
    output_of,
)
from tests.helpers import check_ok, mnist_overrides, requires, run_module

pytestmark = pytest.mark.slow
SIDE_BY_SIDE = ("hydra/launcher=parallel", "hydra.launcher.devices=[0,1,2,3]", "hydra.launcher.devices_per_job=2")
# The stopped sweep's jobs: the first two long enough that the stop comes while both train; the third, which runs
# only once the sweep is carried on, short.
EPOCHS = (300, 299, 5)
GIVEN = re.compile(r"it sees CUDA_VISIBLE_DEVICES=(?P<gpus>[\w,]+), cores (?P<cores>[\d,]+)")
STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]", re.MULTILINE)


def what_the_job_saw(job_dir: Path) -> tuple[set[str], set[str], float, float]:
    """The GPUs and cores a job's own process saw (its train.log says), and when it logged first and last."""
    log = (job_dir / "train.log").read_text()
    [seen] = GIVEN.findall(log)
    stamps = [datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp() for stamp in STAMP.findall(log)]
    return set(seen[0].split(",")), set(seen[1].split(",")), stamps[0], stamps[-1]


def test_jobs_run_two_at_once_each_on_its_own_gpus_and_cores_and_a_failed_job_frees_its_slot(tmp_path: Path):
    """Jobs 1 and 3 fail as they start (a refused learning rate): each fails alone, and the job after job 1 takes
    its slot while job 0 still trains."""
    sweep_dir = tmp_path / "sweep"
    result = run_module(
        "project.train",
        "-m",
        "seed=1,2",
        "model.optimizer.lr=0.1,-1",
        "trainer.max_epochs=400",
        "logger=none",
        *SIDE_BY_SIDE,
        f"hydra.sweep.dir={sweep_dir}",
        cwd=tmp_path,
    )
    assert result.returncode == SWEEP_FAILED, result.stderr[-3000:]
    assert last_line(result.stderr).startswith("error: 2 of 4 sweep jobs failed (job 1, 3)"), result.stderr[-2000:]
    seen = {job: what_the_job_saw(sweep_dir / str(job)) for job in range(4)}
    assert {frozenset(gpus) for gpus, *_ in seen.values()} == {frozenset("01"), frozenset("23")}
    assert all(json.loads((sweep_dir / str(job) / "results.json").read_text())["val/acc"] == 1.0 for job in (0, 2))
    assert all((sweep_dir / str(job) / "error.txt").is_file() for job in (1, 3))
    for first in range(4):
        for second in range(first + 1, 4):
            (gpus_a, cores_a, start_a, end_a), (gpus_b, cores_b, start_b, end_b) = seen[first], seen[second]
            if start_a < end_b and start_b < end_a:  # at the same time: nothing shared
                assert not gpus_a & gpus_b and not cores_a & cores_b, (first, second, seen)
    assert seen[1][2] < seen[0][3], "jobs 0 and 1 ran at once"
    assert seen[2][0] == seen[1][0], "job 2 took job 1's slot"
    launches = [line for line in result.stdout.splitlines() if line.startswith("job ")]
    assert launches.index(next(line for line in launches if line.startswith("job 2 started"))) < launches.index(
        next(line for line in launches if line.startswith("job 0 ended"))
    ), launches
    assert re.search(r"^job 1 ended after \d+ s: failed: model.optimizer.lr must be", result.stdout, re.MULTILINE)


@pytest.mark.parametrize(
    ("stop", "carry_on"), [(signal.SIGINT, True), pytest.param(signal.SIGTERM, False, marks=pytest.mark.fresh)]
)
def test_a_stopped_sweep_stops_every_job_leaves_no_process_and_carries_on_where_each_stopped(
    tmp_path: Path, stop: signal.Signals, carry_on: bool
):
    """Ctrl-C (to the launcher's whole process group, as a terminal sends it) or SIGTERM (to the launcher alone):
    both running jobs stop at a step with a checkpoint, the third never starts, and the same command carries on
    (after Ctrl-C: it is the same sweep dir either way)."""
    sweep_dir = tmp_path / "sweep"
    command = [
        "-m",
        f"trainer.max_epochs={','.join(map(str, EPOCHS))}",
        "logger=none",
        *SIDE_BY_SIDE,
        f"hydra.sweep.dir={sweep_dir}",
    ]
    with background_run(command, tmp_path, new_session=True) as proc:
        deadline = time.monotonic() + 180
        while not all((sweep_dir / str(job) / "checkpoints" / "last.ckpt").is_file() for job in (0, 1)):
            assert proc.poll() is None and time.monotonic() < deadline, output_of(tmp_path)[1][-3000:]
            time.sleep(0.2)
        if stop == signal.SIGINT:
            os.killpg(proc.pid, stop)
        else:
            os.kill(proc.pid, stop)
        status = end_of(proc, tmp_path, timeout=120)
    stdout, stderr = output_of(tmp_path)
    assert status == 128 + stop, stderr[-3000:]
    cause = "interrupted by the user (Ctrl-C)" if stop == signal.SIGINT else "stopped by SIGTERM"
    assert (
        last_line(stderr)
        == f"error: {cause}: carry the sweep on with the same command (its finished jobs are not run again)"
    )
    started = set(re.findall(r"^job (\d) started", stdout, re.M))
    ended = set(re.findall(r"^job (\d) ended after", stdout, re.M))  # a first job may end before the signal
    stopped = set(re.findall(r"^job (\d) stopped after \d+ s: this job resumes from its last checkpoint", stdout, re.M))
    assert stopped and started == stopped | ended and not stopped & ended, stdout
    assert {path.name for path in sweep_dir.iterdir() if path.is_dir()} == started, "no job started after the stop"
    assert_no_process_left(tmp_path)
    if not carry_on:
        return
    check_ok(run_module("project.train", *command, cwd=tmp_path))
    for job in range(3):
        job_dir = sweep_dir / str(job)
        assert json.loads((job_dir / "results.json").read_text())["epochs"] == EPOCHS[job]
        resumed = f"Restored all states from the checkpoint at {job_dir / 'checkpoints' / 'last.ckpt'}"
        assert (resumed in (job_dir / "train.log").read_text()) == (str(job) in stopped), job
    assert_no_process_left(tmp_path)


@requires("optuna")
def test_a_search_runs_its_n_jobs_trials_at_once_each_on_its_own_slot_and_its_pruner_still_prunes(
    tmp_path: Path, mnist_root: Path
):
    """tests/optional/optuna/test_search_pruning.py's search, its trials two at once: the sampler's seed 6 draws lr
    0.003, 0.003, 1e-7, 0.003, and trial 2 (1e-7), beside trial 3, is pruned at its first validation against the two
    finished before it."""
    sweep_dir = tmp_path / "search"
    result = check_ok(
        run_module(
            "project.train",
            *mnist_overrides(mnist_root, "data.batch_size=64", "trainer.max_epochs=3"),
            "hydra.mode=MULTIRUN",
            "hparams_search=mnist_optuna",
            "hydra.sweeper.n_trials=4",
            "hydra.sweeper.n_jobs=2",
            "hydra.sweeper.sampler.seed=6",
            "model.optimizer.lr=choice(0.003,1e-7)",
            "hydra.sweeper.pruner={_target_:optuna.pruners.MedianPruner,n_startup_trials:2,n_warmup_steps:0}",
            *SIDE_BY_SIDE,
            f"hydra.sweep.dir={sweep_dir}",
            cwd=tmp_path,
        )
    )
    lrs = [yaml.safe_load((sweep_dir / str(job) / ".hydra" / "overrides.yaml").read_text()) for job in range(4)]
    assert [next(o for o in overrides if o.startswith("model.optimizer.lr=")) for overrides in lrs] == [
        f"model.optimizer.lr={lr}" for lr in ("0.003", "0.003", "1e-07", "0.003")
    ]
    assert [(sweep_dir / str(job) / "pruned.txt").is_file() for job in range(4)] == [False, False, True, False]
    assert re.search(r"^Sweep: 4 job\(s\), 1 pruned$", result.stdout, re.M), result.stdout[-3000:]
    seen = {job: what_the_job_saw(sweep_dir / str(job))[0] for job in range(4)}
    launches = [" ".join(line.split()[:3]) for line in result.stdout.splitlines() if line.startswith("job ")]
    for first, second in ((0, 1), (2, 3)):
        assert launches.index(f"job {second} started") < launches.index(f"job {first} ended"), launches
        assert not seen[first] & seen[second], seen


def test_ddp_inside_each_job_runs_its_two_ranks_on_the_jobs_own_devices_at_the_same_time_as_the_other_job(
    tmp_path: Path,
):
    sweep_dir = tmp_path / "sweep"
    check_ok(
        run_module(
            "project.train",
            "-m",
            "seed=1,2",
            "trainer=ddp",
            "trainer.devices=2",
            "trainer.max_epochs=150",
            "logger=none",
            *SIDE_BY_SIDE,
            f"hydra.sweep.dir={sweep_dir}",
            cwd=tmp_path,
        )
    )
    (gpus_a, _, start_a, end_a), (gpus_b, _, start_b, end_b) = (
        what_the_job_saw(sweep_dir / str(job)) for job in (0, 1)
    )
    assert start_a < end_b and start_b < end_a, "the two jobs trained at the same time"
    assert {frozenset(gpus_a), frozenset(gpus_b)} == {frozenset("01"), frozenset("23")}
    for job in (0, 1):
        assert sorted(path.name for path in (sweep_dir / str(job)).glob("history.rank*.json")) == [
            "history.rank0.json",
            "history.rank1.json",
        ]
        assert json.loads((sweep_dir / str(job) / "results.json").read_text())["world_size"] == 2


def test_a_job_whose_worker_is_killed_fails_alone_and_its_slot_runs_the_next_job_in_a_new_worker(tmp_path: Path):
    """Job 0's process is SIGKILLed as its epoch 1 starts (as the kernel's out-of-memory killer would); job 1, on
    the same and only slot, runs to its end."""
    sweep_dir = tmp_path / "sweep"
    result = run_module(
        "project.train",
        "-m",
        "+callbacks.crash._target_=tests.crash_callback.KillAtEpochStart",
        "+callbacks.crash.epoch=1,1000",
        "trainer.max_epochs=3",
        "logger=none",
        "hydra/launcher=parallel",
        "hydra.launcher.devices=[0]",
        f"hydra.sweep.dir={sweep_dir}",
        cwd=tmp_path,
        env=TESTS_IMPORTABLE,
    )
    assert result.returncode == SWEEP_FAILED, result.stderr[-3000:]
    killed = (
        "error: the job's process was killed by SIGKILL (out of memory, or from outside): see console.log in its dir"
    )
    assert (sweep_dir / "0" / "error.txt").read_text().strip() == killed
    assert f"job 0 {killed}" in result.stdout + result.stderr
    assert json.loads((sweep_dir / "1" / "results.json").read_text())["epochs"] == 3
    assert what_the_job_saw(sweep_dir / "1")[0] == {"0"}
    assert last_line(result.stderr).startswith("error: 1 of 2 sweep jobs failed (job 0)")
