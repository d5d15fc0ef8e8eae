"""Faults and bad input: nothing hangs, nothing exits 0 on failure, every user error is one line, sweeps survive a
failing job, and nothing is left half-written or running.

Every case runs the entry point as a user would, in a process of its own, and checks what tests/faults.py says: the
exit status, one last `error:` line, nothing half-written, no process left. The core's bad-input cases are listed in
tests/fault_cases.py; the optional parts' in their own test folders.
"""

import errno
import math
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from tests.fault_cases import BAD_INPUTS
from tests.faults import (
    DDP,
    ENV,
    INTERRUPTED,
    LONG_TOY_RUN,
    START_TIMEOUT,
    SWEEP_FAILED,
    TESTS_IMPORTABLE,
    USER_ERROR,
    alive,
    assert_ends_in_error_line,
    assert_no_process_left,
    assert_nothing_half_written,
    background_run,
    bad_input_test,
    descendants,
    end_of,
    last_line,
    output_of,
    wait_for_file,
)
from tests.foreign_modules import FOREIGN_CONF
from tests.helpers import (
    MID_EPOCH_ON,
    REPO,
    STOPPED_BY_SIGTERM,
    TRUST_TEST_CODE,
    check_ok,
    environment,
    free_port,
    histories,
    python,
    read_json,
    requires,
    run_module,
    start_module,
)

pytestmark = pytest.mark.slow  # every case starts the entry point (seconds each), most train


# Bad input: exit 2 at once, in one line.

test_bad_input_exits_2_with_one_error_line_naming_it = bad_input_test(BAD_INPUTS)


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("trainer.max_epoch=3", "did you mean trainer.max_epochs?"),
        ("trainer.foo=1", "write +trainer.foo=1 to add a key that your code reads"),
    ],
    ids=["near-a-key", "near-none"],
)
def test_a_key_the_config_does_not_have_is_one_line_before_anything_runs(tmp_path: Path, override: str, named: str):
    """Hydra cannot apply the override, before this project's code runs: one line with the nearest keys; the advice
    to add the key with `+` only where no key is near (it would add a key that nothing reads)."""
    result = run_module("project.train", override, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, env=ENV)
    key = override.split("=")[0]
    assert_ends_in_error_line(result.returncode, result.stdout, result.stderr, USER_ERROR, key, named)
    assert (f"+{override}" in result.stderr) == (named.startswith("write +"))
    assert not (tmp_path / "run").exists()


def test_resuming_a_finished_run_reports_its_epochs_and_no_made_up_time(tmp_path: Path, finished_toy_run: Path):
    """Nothing is left to train: the results say so (its 3 epochs, a fit of about no time), not a stale clock."""
    run_dir = tmp_path / "run"
    started = time.monotonic()
    check_ok(
        run_module(
            "project.train", "logger=none", f"ckpt_path={finished_toy_run}", f"hydra.run.dir={run_dir}", cwd=tmp_path
        )
    )
    whole_run = time.monotonic() - started
    results = read_json(run_dir / "results.json")
    trained_epochs = torch.load(finished_toy_run, weights_only=False)["epoch"] + 1
    assert results["epochs"] == trained_epochs == 3
    assert 0 <= results["fit_seconds"] <= whole_run, (results["fit_seconds"], whole_run)
    assert_nothing_half_written(tmp_path)


# Signals: a stop says how to resume, and leaves a whole last.ckpt and no process.


def resume_from(line: str) -> Path:
    """The checkpoint a stop's error line names to resume from."""
    found = re.search(r"ckpt_path=(\S+)$", line)
    assert found, f"no ckpt_path=... to resume from in: {line}"
    return Path(found.group(1))


@pytest.mark.parametrize("processes", [1, pytest.param(2, marks=pytest.mark.fresh)])
def test_sigterm_stops_the_run_with_143_naming_the_checkpoint_to_resume_from(tmp_path: Path, processes: int):
    """What Slurm, Kubernetes and `timeout` send: the run ends at once with the command that resumes it."""
    run_dir = tmp_path / "run"
    ddp = DDP if processes == 2 else ()
    with background_run([*LONG_TOY_RUN, *ddp, f"hydra.run.dir={run_dir}"], tmp_path) as proc:
        wait_for_file(run_dir / "checkpoints" / "last.ckpt", proc, tmp_path)
        everyone = [proc.pid, *descendants(proc.pid)]
        assert len(everyone) == processes, everyone
        os.kill(proc.pid, signal.SIGTERM)
        status = end_of(proc, tmp_path)
    stdout, stderr = output_of(tmp_path)
    # Every rank stopped; rank 0 alone says so.
    line = assert_ends_in_error_line(status, stdout, stderr, STOPPED_BY_SIGTERM)
    stop = re.match(r"error: stopped by SIGTERM in epoch \d+: resume from its last checkpoint \(step (\d+)\) ", line)
    assert stop, line
    last = run_dir.resolve() / "checkpoints" / "last.ckpt"
    assert resume_from(line) == last
    assert torch.load(last, weights_only=False)["global_step"] == int(stop.group(1)), "written at the step it stopped"
    assert not (run_dir / "results.json").exists()
    assert_nothing_half_written(tmp_path)
    assert not any(alive(pid) for pid in everyone)
    assert_no_process_left(tmp_path)


@pytest.mark.parametrize(
    ("callbacks", "expected"),
    [
        # The first step is written as SIGTERM stops the run after it (the mid-epoch checkpoint switched on).
        pytest.param(
            ("callbacks=default", MID_EPOCH_ON),
            "resume from its last checkpoint (step 1) with the same command plus ckpt_path=",
            marks=requires("mid_epoch"),
            id="callbacks=default",
        ),
        # Without checkpoints there is nothing to resume from, and the line must not name a file.
        pytest.param(("callbacks=none",), "it had written no checkpoint yet: run it again", id="callbacks=none"),
    ],
)
def test_sigterm_at_the_first_step_names_what_to_resume_from(tmp_path: Path, callbacks: tuple, expected: str):
    run_dir = tmp_path / "run"
    faulty = "+callbacks.sigterm._target_=tests.fault_cases.SigtermAtFirstBatch"
    result = run_module(
        "project.train",
        "logger=none",
        *callbacks,
        faulty,
        f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
        timeout=START_TIMEOUT,
        env=TESTS_IMPORTABLE,
    )
    line = assert_ends_in_error_line(result.returncode, result.stdout, result.stderr, STOPPED_BY_SIGTERM)
    assert line.startswith(f"error: stopped by SIGTERM in epoch 0: {expected}"), line
    last = run_dir / "checkpoints" / "last.ckpt"
    assert last.exists() == (callbacks[0] == "callbacks=default")
    if last.exists():
        assert resume_from(line) == last.resolve() and torch.load(last, weights_only=True)["global_step"] == 1
    assert_no_process_left(tmp_path)


# A SIGTERM before the first epoch: one line from the first second, no process left.
STOPPED_WHILE_STARTING = "error: stopped by SIGTERM while starting: nothing was trained and no checkpoint written: "


def held_in_import(marker: Path, rank: int = 0) -> dict[str, str]:
    """The environment that holds local rank `rank` of a run inside its `import torch`, its pid then in `marker`
    (tests/held_import)."""
    held = Path(__file__).resolve().parent / "held_import"
    return {
        **ENV,
        "PYTHONPATH": f"{held}{os.pathsep}{REPO}",
        "HELD_IMPORT_MARKER": str(marker),
        "HELD_IMPORT_RANK": str(rank),
    }


@pytest.mark.fresh
@pytest.mark.parametrize(
    "program",
    [["-m", "project.train"], ["-mproject.train"], [str(REPO / "project" / "train.py")]],
    ids=["-m project.train", "-mproject.train", "project/train.py"],
)
def test_sigterm_while_python_imports_the_libraries_is_one_line(tmp_path: Path, program: list[str]):
    """The launch's first seconds, however the user names the program: `project/__init__.py` handles SIGTERM before
    Python imports torch, so a SIGTERM while it does is the one line, not a silent 143."""
    run = [python(), *program, *DDP, "logger=none", f"hydra.run.dir={tmp_path / 'run'}"]
    held = tmp_path / "held"
    with open(tmp_path / "stdout.txt", "w") as stdout, open(tmp_path / "stderr.txt", "w") as stderr:
        proc = subprocess.Popen(run, cwd=tmp_path, stdout=stdout, stderr=stderr, env=environment(held_in_import(held)))
    try:
        wait_for_file(held, proc, tmp_path, timeout=START_TIMEOUT)
        os.kill(proc.pid, signal.SIGTERM)
        status = end_of(proc, tmp_path)
    finally:
        proc.kill()
    line = assert_ends_in_error_line(status, *output_of(tmp_path), STOPPED_BY_SIGTERM)
    assert line == STOPPED_WHILE_STARTING + "run the same command again"
    assert_no_process_left(tmp_path)


@pytest.mark.fresh
def test_sigterm_to_every_process_while_rank_1_imports_the_libraries_is_one_line(tmp_path: Path):
    """A terminal's or a scheduler's SIGTERM to the whole group while the rank rank 0 started is still importing
    torch (seconds, for a real interpreter): rank 0 says the one line, rank 1 nothing, and no process is left."""
    held = tmp_path / "held"
    args = [*LONG_TOY_RUN, *DDP, f"hydra.run.dir={tmp_path / 'run'}"]
    with background_run(args, tmp_path, new_session=True, env=held_in_import(held, rank=1)) as proc:
        wait_for_file(held, proc, tmp_path)
        everyone = [proc.pid, *descendants(proc.pid)]
        os.killpg(proc.pid, signal.SIGTERM)
        status = end_of(proc, tmp_path)
    line = assert_ends_in_error_line(status, *output_of(tmp_path), STOPPED_BY_SIGTERM)
    assert line == STOPPED_WHILE_STARTING + "run the same command again"
    assert not any(alive(pid) for pid in everyone)
    assert_no_process_left(tmp_path)


def wait_for_text(text: str, proc, cwd: Path, timeout: float = START_TIMEOUT) -> None:
    """Until the stderr of the `background_run` in `cwd` holds `text`, while it goes on."""
    deadline = time.monotonic() + timeout
    while text not in output_of(cwd)[1]:
        assert proc.poll() is None and time.monotonic() < deadline, f"no {text!r} in:\n{output_of(cwd)[1][-3000:]}"
        time.sleep(0.1)


@pytest.mark.parametrize("group", [False, True], ids=["to-rank-0", "to-every-rank"])
def test_sigterm_while_ddp_ranks_meet_is_one_line_and_leaves_no_process(tmp_path: Path, group: bool):
    """Rank 1 is held before it meets rank 0, which waits inside torch's C++ rendezvous, where Python runs no signal
    handler (to the whole group, rank 1 is gone and the rendezvous would never end): rank 0 says the one line at once,
    rank 1 nothing, and no process is left."""
    run_dir, held = tmp_path / "run", tmp_path / "held"
    hold = ["+callbacks.held._target_=tests.fault_cases.HeldRank", "+callbacks.held.rank=1"]
    hold.append(f"+callbacks.held.marker={held}")
    args = [*LONG_TOY_RUN, *DDP, *hold, f"hydra.run.dir={run_dir}"]
    with background_run(args, tmp_path, new_session=True, env=TESTS_IMPORTABLE) as proc:
        wait_for_file(held, proc, tmp_path)
        wait_for_text("Initializing distributed: GLOBAL_RANK: 0", proc, tmp_path)
        everyone = [proc.pid, *descendants(proc.pid)]
        (os.killpg if group else os.kill)(proc.pid, signal.SIGTERM)
        status = end_of(proc, tmp_path)
    line = assert_ends_in_error_line(status, *output_of(tmp_path), STOPPED_BY_SIGTERM)
    assert line == STOPPED_WHILE_STARTING + "run the same command again"
    assert sorted(tmp_path.rglob("*.ckpt")) == []
    assert not any(alive(pid) for pid in everyone)
    assert_no_process_left(tmp_path)


@pytest.mark.parametrize("processes", [1, 2])
def test_sigterm_after_the_ranks_met_and_before_the_first_epoch_is_one_line(tmp_path: Path, processes: int):
    """The data's setup and a checkpoint's restore come before Lightning handles SIGTERM (just before the first
    epoch): a SIGTERM there is the same one line."""
    ddp = DDP if processes == 2 else ()
    signals = "+callbacks.sigterm._target_=tests.fault_cases.SigtermAtSetup"
    args = ["logger=none", *ddp, signals, f"hydra.run.dir={tmp_path / 'run'}"]
    result = run_module("project.train", *args, cwd=tmp_path, timeout=START_TIMEOUT, env=TESTS_IMPORTABLE)
    line = assert_ends_in_error_line(result.returncode, result.stdout, result.stderr, STOPPED_BY_SIGTERM)
    assert line == STOPPED_WHILE_STARTING + "run the same command again"
    assert sorted(tmp_path.rglob("*.ckpt")) == []
    assert_no_process_left(tmp_path)


@pytest.mark.parametrize("processes", [1, 2])
def test_sigterm_after_training_before_the_results_names_the_checkpoint_that_completes_the_run(
    tmp_path: Path, processes: int
):
    """Between `fit` and `test` Lightning has no SIGTERM handler registered: the stop is one line all the same, and
    the command it names tests the trained weights and writes the results, training nothing more."""
    run_dir = tmp_path / "run"
    ddp = DDP if processes == 2 else ()
    signals = "+callbacks.sigterm._target_=tests.fault_cases.SigtermAfterFit"
    args = ["logger=none", *ddp, signals, f"hydra.run.dir={run_dir}"]
    result = run_module("project.train", *args, cwd=tmp_path, timeout=START_TIMEOUT, env=TESTS_IMPORTABLE)
    line = assert_ends_in_error_line(result.returncode, result.stdout, result.stderr, STOPPED_BY_SIGTERM)
    expected = "error: stopped by SIGTERM after training, before the run's results were written: resume from its "
    steps = 6 // processes  # 3 epochs of 2 steps, each rank taking its share
    assert line.startswith(expected + f"last checkpoint (step {steps}) with the same command plus ckpt_path="), line
    assert not (run_dir / "results.json").exists()
    assert_nothing_half_written(tmp_path)
    assert_no_process_left(tmp_path)

    resumed = ["logger=none", *ddp, f"ckpt_path={resume_from(line)}", TRUST_TEST_CODE, f"hydra.run.dir={run_dir}"]
    check_ok(run_module("project.train", *resumed, cwd=tmp_path, timeout=START_TIMEOUT, env=ENV))
    assert read_json(run_dir / "results.json")["epochs"] == 3


def test_sigterm_under_ddp_spawn_ends_its_processes_mid_write_and_names_the_checkpoint_to_resume_from(tmp_path: Path):
    """ddp_spawn's processes handle SIGTERM among themselves; the process that started them, the one a scheduler or
    `kill` signals, only waits for them: it ends them at once, and no process is left training into the run dir. A
    rank ended inside a checkpoint's write leaves no temporary file: the process that ended it removes it."""
    run_dir = tmp_path / "run"
    marker = tmp_path / "writing"
    stall = ["+callbacks.stall._target_=tests.fault_cases.StallInCheckpointWrite", f"+callbacks.stall.marker={marker}"]
    args = [*LONG_TOY_RUN, "trainer=ddp_spawn", *stall, f"hydra.run.dir={run_dir}"]
    with background_run(args, tmp_path, env=TESTS_IMPORTABLE) as proc:
        wait_for_file(marker, proc, tmp_path)
        assert list((run_dir / "checkpoints").glob(".*.partial")), "the stalled write's file is not there to remove"
        everyone = [proc.pid, *descendants(proc.pid)]
        os.kill(proc.pid, signal.SIGTERM)
        status = end_of(proc, tmp_path)
    line = assert_ends_in_error_line(status, *output_of(tmp_path), STOPPED_BY_SIGTERM)
    stop = re.match(
        r"error: stopped by SIGTERM: the ddp_spawn processes were ended at once, not after a step: resume from its "
        r"last checkpoint \(step (\d+)\) with the same command plus ckpt_path=",
        line,
    )
    assert stop, line
    last = run_dir.resolve() / "checkpoints" / "last.ckpt"
    assert resume_from(line) == last and torch.load(last, weights_only=False)["global_step"] == int(stop.group(1))
    assert_nothing_half_written(tmp_path)
    assert not any(alive(pid) for pid in everyone)
    assert_no_process_left(tmp_path)


def test_sigterm_while_a_sweeps_second_job_starts_says_how_to_carry_the_sweep_on(tmp_path: Path):
    """Each job of a sweep starts anew; the first trained, so the line is the second's, and names the sweep."""
    sweep_dir = tmp_path / "sweep"
    signals = ["+callbacks.sigterm._target_=tests.fault_cases.SigtermAtSetup", "+callbacks.sigterm.job=1"]
    sweep = ["-m", "seed=1,2", "logger=none", *signals, f"hydra.sweep.dir={sweep_dir}"]
    result = run_module("project.train", *sweep, cwd=tmp_path, timeout=START_TIMEOUT, env=TESTS_IMPORTABLE)
    line = assert_ends_in_error_line(result.returncode, result.stdout, result.stderr, STOPPED_BY_SIGTERM)
    carry_on = "carry the sweep on with the same command (its finished jobs are not run again)"
    assert line == STOPPED_WHILE_STARTING + carry_on
    assert (sweep_dir / "0" / "results.json").exists()
    assert not list((sweep_dir / "1").rglob("*.ckpt")) and not (sweep_dir / "1" / "results.json").exists()
    assert_no_process_left(tmp_path)


@pytest.mark.parametrize("processes", [1, 2])
def test_ctrl_c_stops_the_run_with_130_naming_the_checkpoint_to_resume_from(tmp_path: Path, processes: int):
    """A terminal's Ctrl-C reaches every process of the group; the run ends as interrupted, resumable."""
    run_dir = tmp_path / "run"
    ddp = DDP if processes == 2 else ()
    with background_run([*LONG_TOY_RUN, *ddp, f"hydra.run.dir={run_dir}"], tmp_path, new_session=True) as proc:
        wait_for_file(run_dir / "checkpoints" / "last.ckpt", proc, tmp_path)
        everyone = [proc.pid, *descendants(proc.pid)]
        os.killpg(proc.pid, signal.SIGINT)
        status = end_of(proc, tmp_path)
    stdout, stderr = output_of(tmp_path)
    # Every rank stopped; rank 0 alone says so.
    line = assert_ends_in_error_line(status, stdout, stderr, INTERRUPTED)
    assert line.startswith("error: interrupted by the user (Ctrl-C): resume from its last checkpoint (step "), line
    assert resume_from(line) == run_dir.resolve() / "checkpoints" / "last.ckpt"
    assert_nothing_half_written(tmp_path)
    assert not any(alive(pid) for pid in everyone)
    assert_no_process_left(tmp_path)


def test_a_node_that_never_joins_ends_the_run_in_one_line_within_the_timeout(tmp_path: Path):
    """Rank 0 of a two-node torchrun launch whose second node never starts: not torch's 30 minutes of silence."""
    torchrun_rank_zero = {
        "TORCHELASTIC_RUN_ID": "fault",
        "WORLD_SIZE": "2",
        "RANK": "0",
        "LOCAL_RANK": "0",
        "GROUP_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    args = [*DDP[:1], "trainer.num_nodes=2", "trainer.devices=1", "trainer.strategy.timeout.seconds=2"]
    result = run_module(
        "project.train",
        *args,
        "logger=none",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
        timeout=START_TIMEOUT,
        env={**ENV, **torchrun_rank_zero},
    )
    line = assert_ends_in_error_line(result.returncode, result.stdout, result.stderr, USER_ERROR, "127.0.0.1")
    assert "did not all meet" in line and "1/2 clients joined" in line, line
    assert_no_process_left(tmp_path)


@pytest.mark.fresh
def test_rank_1_killed_stops_the_run_naming_it(tmp_path: Path):
    """The dead rank is the cause: rank 0's broken collective is only its consequence."""
    run_dir = tmp_path / "run"
    with background_run([*LONG_TOY_RUN, *DDP, f"hydra.run.dir={run_dir}"], tmp_path) as proc:
        wait_for_file(run_dir / "checkpoints" / "last.ckpt", proc, tmp_path)
        everyone = [proc.pid, *descendants(proc.pid)]
        assert len(everyone) == 2, everyone
        victim = everyone[1]  # rank 1: rank 0's only child
        os.kill(victim, signal.SIGKILL)
        status = end_of(proc, tmp_path)
    stdout, stderr = output_of(tmp_path)
    assert status not in (0, None)
    assert last_line(stderr) == f"error: rank 1 (pid {victim}) was killed by SIGKILL: the run stops", stderr[-3000:]
    assert "Traceback" not in stderr
    assert_nothing_half_written(tmp_path)
    assert not any(alive(pid) for pid in everyone)
    assert_no_process_left(tmp_path)


def test_a_bug_of_rank_0_alone_ends_the_run_in_its_traceback_and_kills_the_rank_left_in_a_collective(tmp_path: Path):
    """Rank 1 waits in the epoch's first collective for a rank 0 that will never come: it is killed, not waited for,
    and the bug is the line (no rank died before it)."""
    bug = [
        "+callbacks.bug._target_=tests.crash_callback.RaiseAtEpochStart",
        "+callbacks.bug.epoch=1",
        "+callbacks.bug.rank=0",
    ]
    with background_run([*LONG_TOY_RUN, *DDP, *bug, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path) as proc:
        # Well short of the minute a rank is waited for after a success (`HydraJobLauncher.finish`), start-up included.
        status = end_of(proc, tmp_path, timeout=50)
    stdout, stderr = output_of(tmp_path)
    assert status == 1, stderr[-3000:]
    # torch prefixes the traceback of a rank's uncaught exception with the rank.
    assert last_line(stderr) == '[rank0]: KeyError: "a bug of rank 0\'s"', stderr[-3000:]
    assert "error:" not in stderr, "a bug is no error line of the user's"
    assert_no_process_left(tmp_path)


def test_rank_0_killed_takes_its_ranks_along_and_leaves_last_checkpoint_whole(tmp_path: Path):
    """SIGKILL cannot be handled: what counts is that last.ckpt is whole and no rank is left in a collective.

    (A writer killed mid-write cannot remove its `.last.ckpt.partial`; the rename keeps last.ckpt whole anyway.)
    """
    run_dir = tmp_path / "run"
    with background_run([*LONG_TOY_RUN, *DDP, f"hydra.run.dir={run_dir}"], tmp_path) as proc:
        wait_for_file(run_dir / "checkpoints" / "last.ckpt", proc, tmp_path)
        everyone = [proc.pid, *descendants(proc.pid)]
        assert len(everyone) == 2, everyone
        os.kill(proc.pid, signal.SIGKILL)
        assert end_of(proc, tmp_path) == -signal.SIGKILL
        deadline = time.monotonic() + 30
        while any(alive(pid) for pid in everyone) and time.monotonic() < deadline:
            time.sleep(0.2)
    assert not any(alive(pid) for pid in everyone), "a rank outlived rank 0"
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["epoch"] >= 0
    assert_no_process_left(tmp_path)


def test_a_killed_loader_worker_ends_the_run_in_one_line_with_how_to_resume(tmp_path: Path):
    """A DataLoader worker of a data module of the user's own that the kernel's OOM killer (or anyone) ends takes
    the run with it: torch's line and the resume hint, and no process left."""
    run_dir = tmp_path / "run"
    args = [
        f"hydra.searchpath=[file://{FOREIGN_CONF}]",
        "model=regression",
        "data=regression",
        "+data.num_workers=1",
        "optimized_metric=val/mse",
        "optimized_mode=min",
        *LONG_TOY_RUN,
        f"hydra.run.dir={run_dir}",
    ]
    with background_run(args, tmp_path, env=TESTS_IMPORTABLE) as proc:
        wait_for_file(run_dir / "checkpoints" / "last.ckpt", proc, tmp_path)
        os.kill(descendants(proc.pid)[0], signal.SIGKILL)
        status = end_of(proc, tmp_path)
    stdout, stderr = output_of(tmp_path)
    line = assert_ends_in_error_line(status, stdout, stderr, 1, "DataLoader worker", "killed from outside")
    assert f"ckpt_path={(run_dir / 'checkpoints' / 'last.ckpt').resolve()}" in line
    assert_no_process_left(tmp_path)


# Sweeps: a failing job fails alone; a stop ends the sweep.


def sweep_table(stdout: str, title: str) -> list[str]:
    assert title in stdout, stdout[-3000:]
    return stdout[stdout.index(title) :].splitlines()


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        pytest.param(["seed=1,abc,3"], "seed", id="bad-seed"),
        pytest.param(["model.optimizer.lr=0.1,abc,0.5"], "model.optimizer.lr", id="bad-lr"),
        pytest.param(["model.optimizer.lr=0.1,abc,0.5", "trainer=ddp"], "model.optimizer.lr", id="ddp-bad-lr"),
        pytest.param(["model=toy,mnist_mlp,toy", "trainer=ddp"], "model", id="ddp-network-fails-in-training"),
    ],
)
def test_sweep_runs_every_job_when_one_fails_and_exits_1(tmp_path: Path, overrides: list[str], named: str):
    """One bad point of a grid must not cost the others; the table and the exit status still say it failed."""
    sweep_dir = tmp_path / "sweep"
    result = run_module(
        "project.train", "-m", *overrides, "logger=none", f"hydra.sweep.dir={sweep_dir}", cwd=tmp_path, env=ENV
    )
    line = assert_ends_in_error_line(result.returncode, result.stdout, result.stderr, SWEEP_FAILED, only_line=False)
    assert line.startswith("error: 1 of 3 sweep jobs failed (job 1): "), line
    job_error = (sweep_dir / "1" / "error.txt").read_text().strip()
    assert job_error.startswith("error: ") and named in job_error, job_error
    assert not (sweep_dir / "1" / "results.json").exists()
    table = sweep_table(result.stdout, "Sweep: 3 job(s), 1 failed")
    rows = {row.split()[0]: row for row in table if row[:1].isdigit()}
    assert rows["1"].split()[-2] == "failed", rows["1"]
    assert f"job 1 {job_error}" in table
    for job in ("0", "2"):
        assert not (sweep_dir / job / "error.txt").exists()
        assert f"{read_json(sweep_dir / job / 'results.json')['val/acc']:.4f}" in rows[job]
    assert_nothing_half_written(tmp_path)
    assert_no_process_left(tmp_path)


def test_sigterm_ends_a_sweep_without_starting_its_next_job_and_its_hint_carries_the_sweep_on(tmp_path: Path):
    """A stop is the user's (or the scheduler's) decision about the whole sweep, unlike a failing job; its line says
    how to carry on that sweep (not a ckpt_path, which every job would then resume from), and doing so resumes the
    stopped job from its own checkpoint and runs the one it had not reached."""
    sweep = ["-m", "seed=1,2", "logger=none", "trainer.max_epochs=60"]
    with background_run(sweep, tmp_path) as proc:
        (sweep_dir,) = wait_for_glob(tmp_path, "outputs/multirun/*/*", proc)
        wait_for_file(sweep_dir / "0" / "checkpoints" / "last.ckpt", proc, tmp_path)
        os.kill(proc.pid, signal.SIGTERM)
        status = end_of(proc, tmp_path)
    stdout, stderr = output_of(tmp_path)
    line = assert_ends_in_error_line(status, stdout, stderr, STOPPED_BY_SIGTERM)
    hint = re.match(
        r"error: stopped by SIGTERM in epoch \d+: carry the sweep on with the same command plus hydra.sweep.dir=(\S+) "
        r"\(its finished jobs are not run again\); this job resumes from its last checkpoint \(step (\d+)\)$",
        line,
    )
    assert hint and Path(hint.group(1)) == sweep_dir.resolve(), line
    assert not (sweep_dir / "1").exists()
    assert_nothing_half_written(tmp_path)
    assert_no_process_left(tmp_path)

    check_ok(run_module("project.train", *sweep, f"hydra.sweep.dir={hint.group(1)}", cwd=tmp_path, env=ENV))
    stopped, fresh = (read_json(sweep_dir / job / "history.rank0.json") for job in ("0", "1"))
    assert stopped["first_step"] == int(hint.group(2)) > 0, "the stopped job resumed from its own last step"
    assert fresh["first_step"] == 0 and read_json(sweep_dir / "1" / "results.json")["epochs"] == 60
    assert read_json(sweep_dir / "0" / "results.json")["epochs"] == 60


@pytest.mark.fresh
def test_ctrl_c_ends_a_ddp_sweep_without_starting_its_next_job_and_says_how_to_carry_it_on(tmp_path: Path):
    """A terminal's Ctrl-C reaches every process of the group, both ranks of the sweep's job among them: the sweep
    ends as interrupted, in rank 0's one line, and no rank is left."""
    sweep = ["-m", "seed=1,2", *LONG_TOY_RUN, *DDP]
    with background_run(sweep, tmp_path, new_session=True) as proc:
        (sweep_dir,) = wait_for_glob(tmp_path, "outputs/multirun/*/*", proc)
        wait_for_file(sweep_dir / "0" / "checkpoints" / "last.ckpt", proc, tmp_path)
        everyone = [proc.pid, *descendants(proc.pid)]
        os.killpg(proc.pid, signal.SIGINT)
        status = end_of(proc, tmp_path)
    line = assert_ends_in_error_line(status, *output_of(tmp_path), INTERRUPTED)
    carry_on = f"carry the sweep on with the same command plus hydra.sweep.dir={sweep_dir.resolve()} "
    assert line.startswith(f"error: interrupted by the user (Ctrl-C): {carry_on}"), line
    assert not (sweep_dir / "1").exists()
    assert_nothing_half_written(tmp_path)
    assert not any(alive(pid) for pid in everyone)
    assert_no_process_left(tmp_path)


# Runs and sweeps: nothing written over, no job trained from a sibling's weights.


def wait_for_glob(directory: Path, pattern: str, proc, timeout: float = 120) -> list[Path]:
    """The paths matching `pattern` below `directory`, once there are any, while `proc` goes on."""
    deadline = time.monotonic() + timeout
    while not (found := sorted(directory.glob(pattern))):
        assert proc.poll() is None and time.monotonic() < deadline, f"nothing matched {pattern}"
        time.sleep(0.2)
    return found


def test_a_run_dir_given_again_is_refused_unless_the_run_carries_its_run_on(tmp_path: Path):
    """`hydra.run.dir=...` typed twice must not write over the first run's checkpoints and results; with
    `ckpt_path=last` the second run carries the first on, in its directory."""
    run_dir = tmp_path / "run"
    first = ["logger=none", "seed=1", "trainer.max_epochs=3", f"hydra.run.dir={run_dir}"]
    check_ok(run_module("project.train", *first, cwd=tmp_path, env=ENV))
    written = {path: path.read_bytes() for path in (run_dir / "results.json", run_dir / "checkpoints" / "last.ckpt")}

    second = ["logger=none", "seed=2", "trainer.max_epochs=2", f"hydra.run.dir={run_dir}"]
    result = run_module("project.train", *second, cwd=tmp_path, env=ENV)
    line = assert_ends_in_error_line(result.returncode, result.stdout, result.stderr, USER_ERROR, f"={run_dir} ")
    assert "already holds another run (results.json, checkpoints/)" in line and "ckpt_path=last" in line, line
    assert {path: path.read_bytes() for path in written} == written, "nothing of the first run written over"

    check_ok(run_module("project.train", *first[:2], "trainer.max_epochs=5", "ckpt_path=last", first[3], cwd=tmp_path))
    assert read_json(run_dir / "results.json")["epochs"] == 5
    history = read_json(run_dir / "history.rank0.json")
    assert (history["first_step"], len(history["step_losses"]), history["resumed_at_steps"]) == (0, 10, [6]), (
        "carried on from its own epoch 3 (step 6), its history whole"
    )
    assert_no_process_left(tmp_path)


def test_a_run_dir_whose_run_failed_at_its_start_can_be_used_again(tmp_path: Path):
    """A typo ends a run before it writes a checkpoint: the corrected command may use the same directory."""
    run_dir = tmp_path / "run"
    failed = run_module("project.train", "seed=-1", f"hydra.run.dir={run_dir}", cwd=tmp_path, env=ENV)
    assert failed.returncode == USER_ERROR and (run_dir / ".hydra").is_dir()
    check_ok(run_module("project.train", "logger=none", f"hydra.run.dir={run_dir}", cwd=tmp_path, env=ENV))
    assert read_json(run_dir / "results.json")["epochs"] == 3


def test_ckpt_path_last_under_a_sweep_takes_the_run_from_before_the_sweep_for_every_job(tmp_path: Path):
    """Job 1 must not resume job 0's fresh last.ckpt (same model, same data, newer) and report its weights."""
    check_ok(run_module("project.train", "logger=none", "trainer.max_epochs=3", cwd=tmp_path, env=ENV))
    (earlier,) = (tmp_path / "outputs").glob("*/*/checkpoints/last.ckpt")
    sweep_dir = tmp_path / "sweep"
    sweep = ["-m", "logger=none", "model.optimizer.lr=0.1,0.5", "ckpt_path=last", "trainer.max_epochs=6"]
    check_ok(run_module("project.train", *sweep, f"hydra.sweep.dir={sweep_dir}", cwd=tmp_path, env=ENV))
    for job in ("0", "1"):
        checkpoint = torch.load(sweep_dir / job / "checkpoints" / "last.ckpt", weights_only=False)
        assert checkpoint["config"]["ckpt_path"] == str(earlier), f"job {job} resumed another run"
        assert checkpoint["global_step"] == 12, "6 steps before the sweep, 6 in it"
    assert_no_process_left(tmp_path)


def test_a_ddp_sweep_stopped_in_its_second_job_is_carried_on_by_the_same_command(tmp_path: Path):
    """Job 0 finished: not run again. Job 1 stopped: resumes from its own last.ckpt on both ranks. Job 2: fresh.
    A sweep dir that holds a sweep of other overrides is refused before any job."""
    sweep_dir = tmp_path / "sweep"
    # Only job 1 has to be caught mid-run: jobs 0 and 2 are short.
    sweep = ["-m", "trainer.max_epochs=3,40,4", *DDP, "logger=none"]
    sweep.append(f"hydra.sweep.dir={sweep_dir}")
    with background_run(sweep, tmp_path) as proc:
        wait_for_file(sweep_dir / "1" / "checkpoints" / "last.ckpt", proc, tmp_path)
        os.kill(proc.pid, signal.SIGTERM)
        status = end_of(proc, tmp_path)
    stdout, stderr = output_of(tmp_path)
    # Every rank stopped; rank 0 alone says so.
    line = assert_ends_in_error_line(status, stdout, stderr, STOPPED_BY_SIGTERM)
    expected = "carry the sweep on with the same command (its finished jobs are not run again); this job resumes"
    assert expected in line, line
    stopped_at = int(re.search(r"\(step (\d+)\)$", line).group(1))
    finished = (sweep_dir / "0" / "results.json").read_bytes()

    other = run_module("project.train", *[o.replace("3,40,4", "3,40,5") for o in sweep], cwd=tmp_path, env=ENV)
    line = assert_ends_in_error_line(other.returncode, other.stdout, other.stderr, USER_ERROR, f"={sweep_dir} ")
    assert "holds another sweep" in line and not (sweep_dir / "2").exists(), line

    result = check_ok(run_module("project.train", *sweep, cwd=tmp_path, env=ENV))
    assert "job 0 finished in an earlier run of this sweep: not run again" in result.stderr + result.stdout
    assert (sweep_dir / "0" / "results.json").read_bytes() == finished
    resumed = histories(sweep_dir / "1")
    assert [(h["world_size"], h["first_step"]) for h in resumed] == [(2, stopped_at)] * 2
    assert [(h["world_size"], h["first_step"]) for h in histories(sweep_dir / "2")] == [(2, 0)] * 2
    table = sweep_table(result.stdout, "Sweep: 3 job(s)")
    assert len([row for row in table if row[:1].isdigit()]) == 3
    assert_no_process_left(tmp_path)


# Training that diverges: stopped at once on every rank, named, never a success.


def test_a_ddp_run_that_diverges_stops_on_both_ranks_at_one_step_and_keeps_its_finite_checkpoint(tmp_path: Path):
    """Both ranks read the averaged gradients, so both stop at the same step with the same line (rank 1's, where it
    gets to print it before rank 0's end stops it); the last.ckpt left is the one written before the step that
    diverged, with finite weights."""
    run_dir = tmp_path / "run"
    args = ["logger=none", *DDP, "model.optimizer.lr=1e4", "trainer.max_epochs=50", f"hydra.run.dir={run_dir}"]
    result = run_module("project.train", *args, cwd=tmp_path, timeout=START_TIMEOUT, env=ENV)
    line = assert_ends_in_error_line(result.returncode, result.stdout, result.stderr, USER_ERROR, only_line=False)
    diverged = re.match(
        r"error: training diverged at step (\d+) \(loss \S+\): lower the learning rate \(now 10000\)", line
    )
    assert diverged, line
    assert {text for text in result.stderr.splitlines() if text.startswith("error:")} == {line}, "one line"
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)
    assert checkpoint["global_step"] < int(diverged.group(1))
    assert all(torch.isfinite(tensor).all() for tensor in checkpoint["state_dict"].values())
    assert not (run_dir / "results.json").exists()
    assert_no_process_left(tmp_path)


@pytest.mark.fresh
def test_a_ddp_spawn_run_that_diverges_ends_in_its_workers_one_line(tmp_path: Path):
    """The spawned ranks raise the error; their parent gets it back as a traceback's text and says its one line.
    (Fresh interpreters: spawned workers forked from the tests' preloaded Python leave multiprocessing's resource
    tracker a warning to print after the line, which a user's run does not.)"""
    args = ["logger=none", "trainer=ddp_spawn", "model.optimizer.lr=1e4", "trainer.max_epochs=50"]
    result = run_module("project.train", *args, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    line = assert_ends_in_error_line(result.returncode, result.stdout, result.stderr, USER_ERROR, "diverged at step")
    assert "lower the learning rate (now 10000)" in line
    assert not (tmp_path / "run" / "results.json").exists()
    assert_no_process_left(tmp_path)


def test_data_that_turns_nan_is_named_as_the_cause_and_a_sweep_counts_the_job_failed(tmp_path: Path):
    """A data module of the user's own whose point 5 is NaN: the line says to check the data, not the learning rate;
    in a sweep that job fails (the other trains), and with stop_when_diverged=false the run trains on."""
    regression = [
        f"hydra.searchpath=[file://{FOREIGN_CONF}]",
        "model=regression",
        "data=regression",
        "optimized_metric=val/mse",
        "optimized_mode=min",
        "logger=none",
    ]
    env = TESTS_IMPORTABLE
    sweep_dir = tmp_path / "sweep"
    args = ["-m", *regression, "+data.nan_at=null,5", f"hydra.sweep.dir={sweep_dir}"]
    result = run_module("project.train", *args, cwd=tmp_path, env=env)
    line = assert_ends_in_error_line(result.returncode, result.stdout, result.stderr, SWEEP_FAILED, only_line=False)
    assert line.startswith("error: 1 of 2 sweep jobs failed (job 1)"), line
    job_error = (sweep_dir / "1" / "error.txt").read_text()
    assert "training diverged at step" in job_error and "its batch held NaN or infinite inputs" in job_error
    assert (sweep_dir / "0" / "results.json").is_file()

    run_dir = tmp_path / "regardless"
    args = [*regression, "+data.nan_at=5", "stop_when_diverged=false", f"hydra.run.dir={run_dir}"]
    check_ok(run_module("project.train", *args, cwd=tmp_path, env=env))
    assert math.isnan(read_json(run_dir / "results.json")["val/mse"])
    assert_no_process_left(tmp_path)


# Memory: one line naming where it ran out.

FOREIGN_REGRESSION = [f"hydra.searchpath=[file://{FOREIGN_CONF}]", "model=regression", "data=regression"]


@pytest.mark.parametrize(
    ("overrides", "where"),
    [
        (["experiment=mnist", "model.network.num_hidden_features=1000000000000"], "while building the run"),
        (
            [*FOREIGN_REGRESSION, "+model.scratch_elements=1000000000000000", "optimized_metric=val/mse"],
            "while training",
        ),
        (
            [*FOREIGN_REGRESSION, "+model.scratch_elements=1000000000000000", "optimized_metric=val/mse", *DDP],
            "while training",
        ),
    ],
    ids=["network-too-big", "training", "training-ddp"],
)
def test_running_out_of_memory_is_one_line_naming_where(tmp_path: Path, mnist_root: Path, overrides, where: str):
    """The allocator's own error (torch's, as a GPU's or a small machine's would be), not its traceback."""
    args = [*overrides, f"data.root={mnist_root}" if "experiment=mnist" in overrides else "logger=none"]
    env = TESTS_IMPORTABLE
    result = run_module("project.train", *args, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, env=env)
    line = assert_ends_in_error_line(result.returncode, result.stdout, result.stderr, USER_ERROR, only_line=False)
    assert line.startswith(f"error: out of memory {where} ("), line
    assert "GiB asked for): lower the batch size or the model's size" in line, line
    assert len({text for text in result.stderr.splitlines() if text.startswith("error:")}) == 1, "one line (per rank)"
    assert_no_process_left(tmp_path)


# Disks: a directory that cannot be written, a disk that fills up.


def mount(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["mount", *args], capture_output=True, text=True)


@contextmanager
def made_read_only(directory: Path) -> Iterator[Path]:
    """`directory` no one can write in while this lasts: mode 555, or for root (whom modes do not stop) a read-only
    bind mount over it (its files stay as they are)."""
    if os.geteuid() != 0:
        directory.chmod(0o555)
        try:
            yield directory
        finally:
            directory.chmod(0o755)
        return
    if mount("--bind", str(directory), str(directory)).returncode != 0:
        pytest.skip("as root only a read-only mount stops writes, and mount --bind is not permitted here")
    try:
        deadline = time.monotonic() + 30  # a file open for writing there (a checkpoint being written) holds it off
        while (remounted := mount("-o", "remount,ro,bind", str(directory))).returncode != 0:
            if "busy" not in remounted.stderr or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if remounted.returncode != 0:
            pytest.skip(f"could not make the bind mount read-only: {remounted.stderr.strip()}")
        yield directory
    finally:
        subprocess.run(["umount", str(directory)], check=True)


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """An empty directory no one can write in (`made_read_only`)."""
    directory = tmp_path / "read-only"
    directory.mkdir()
    with made_read_only(directory):
        yield directory


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs, to fill up (needs root and mount rights)."""
    directory = tmp_path / "disk"
    directory.mkdir()
    mounted = mount("-t", "tmpfs", "-o", "size=4m", "tmpfs", str(directory))
    if mounted.returncode != 0:
        pytest.skip(f"a small disk to fill needs a tmpfs mount, not permitted here: {mounted.stderr.strip()}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", str(directory)], check=True)


def test_run_dir_in_a_read_only_dir_exits_2_naming_it(tmp_path: Path, read_only_dir: Path):
    """A run dir that cannot be created is the user's to move (hydra.run.dir), not a crash."""
    result = run_module(
        "project.train",
        "logger=none",
        f"hydra.run.dir={read_only_dir / 'run'}",
        cwd=tmp_path,
        timeout=START_TIMEOUT,
        env=ENV,
    )
    assert_ends_in_error_line(result.returncode, result.stdout, result.stderr, USER_ERROR, str(read_only_dir))
    assert list(read_only_dir.iterdir()) == []
    assert_no_process_left(tmp_path)


def test_checkpoints_dir_made_read_only_mid_run_exits_2_and_a_new_run_there_is_refused_before_training(
    tmp_path: Path,
):
    """A checkpoint that cannot be written ends the run in one line naming what is kept (the previous last.ckpt,
    whole); carried on into the same read-only dir, the run is refused before its first epoch trains.

    The dir turns read-only while the run is held at its second epoch's end, before that epoch's checkpoint: the
    write that meets the read-only disk is always the checkpoint's.
    """
    run_dir = tmp_path / "run"
    checkpoints = run_dir / "checkpoints"
    ready, go = tmp_path / "held", tmp_path / "go"
    hold = [
        "+callbacks.hold._target_=tests.crash_callback.HoldAtEpochEnd",
        "+callbacks.hold.epoch=1",
        f"+callbacks.hold.ready={ready}",
        f"+callbacks.hold.go={go}",
    ]
    with background_run([*LONG_TOY_RUN, *hold, f"hydra.run.dir={run_dir}"], tmp_path, env=TESTS_IMPORTABLE) as proc:
        wait_for_file(ready, proc, tmp_path)
        with made_read_only(checkpoints):
            go.touch()
            status = end_of(proc, tmp_path)
            stdout, stderr = output_of(tmp_path)
            line = assert_ends_in_error_line(status, stdout, stderr, USER_ERROR, f"{checkpoints} cannot be written")
            assert line.startswith(f"error: could not write {checkpoints / 'last.ckpt'}: "), line
            assert re.search(r"kept: (best-epoch\d{3}\.ckpt, )?last\.ckpt$", line), line
            assert torch.load(checkpoints / "last.ckpt", weights_only=False)["epoch"] == 0

            again = run_module(
                "project.train",
                *LONG_TOY_RUN,
                "ckpt_path=last",
                TRUST_TEST_CODE,
                f"hydra.run.dir={run_dir}",
                cwd=tmp_path,
                env=ENV,
            )
            line = assert_ends_in_error_line(again.returncode, again.stdout, again.stderr, USER_ERROR, str(checkpoints))
            assert "cannot be written (a read-only disk, or no permission): make it writable, or" in line, line
            assert not re.search(r"^epoch \d+ step|Epoch \d+:", again.stdout, re.M), "refused before it trained"
    assert_nothing_half_written(tmp_path)
    assert_no_process_left(tmp_path)


def test_a_run_dir_that_exists_read_only_exits_2_naming_it(tmp_path: Path, read_only_dir: Path):
    """Hydra would open its log file there first, and fail in logging's traceback."""
    result = run_module(
        "project.train", "logger=none", f"hydra.run.dir={read_only_dir}", cwd=tmp_path, timeout=START_TIMEOUT, env=ENV
    )
    line = assert_ends_in_error_line(result.returncode, result.stdout, result.stderr, USER_ERROR, str(read_only_dir))
    assert "hydra.run.dir" in line
    assert_no_process_left(tmp_path)


def status_on_a_full_disk(directory: Path, proc: subprocess.Popen, cwd: Path, timeout: float = 60) -> int:
    """Keep `directory`'s disk full until the `background_run` in `cwd` ends, and return its exit status.

    Filled once, the disk could keep a run going: a checkpoint written over the previous one frees that one's
    space, so one being written while the disk filled leaves room for the next. A disk others fill stays full.
    """
    deadline = time.monotonic() + timeout
    with (directory / "filler").open("ab", buffering=0) as filler:
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                while True:
                    filler.write(b"\0" * 4096)
            except OSError as error:
                assert error.errno == errno.ENOSPC, error
            time.sleep(0.05)
    return end_of(proc, cwd, timeout=max(deadline - time.monotonic(), 1))


def test_disk_full_mid_run_exits_2_and_keeps_the_last_checkpoint(tmp_path: Path, small_disk: Path):
    """The checkpoint that no longer fits is not left half-written, and the one before it still loads."""
    run_dir = small_disk / "run"
    with background_run([*LONG_TOY_RUN, f"hydra.run.dir={run_dir}"], tmp_path) as proc:
        wait_for_file(run_dir / "checkpoints" / "last.ckpt", proc, tmp_path)
        status = status_on_a_full_disk(small_disk, proc, tmp_path)
    stdout, stderr = output_of(tmp_path)
    line = assert_ends_in_error_line(status, stdout, stderr, USER_ERROR, str(run_dir))
    assert "no space left" in line.lower(), line
    assert_nothing_half_written(small_disk)
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["epoch"] >= 0
    assert_no_process_left(tmp_path)


@pytest.mark.fresh
def test_disk_full_under_tensorboard_and_the_log_file_is_one_line(tmp_path: Path, small_disk: Path):
    """TensorBoard's writer thread, the log file and the run all meet the full disk: one line names it, no logging
    traceback on the console."""
    run_dir = small_disk / "run"
    with background_run(["trainer.max_epochs=100000", "callbacks=none", f"hydra.run.dir={run_dir}"], tmp_path) as proc:
        wait_for_file(run_dir / "tensorboard", proc, tmp_path)
        status = status_on_a_full_disk(small_disk, proc, tmp_path)
    stdout, stderr = output_of(tmp_path)
    line = assert_ends_in_error_line(status, stdout, stderr, USER_ERROR, "no space left on the disk of", str(run_dir))
    assert "--- Logging error ---" not in stderr and "Exception in thread" not in stderr, stderr[-3000:]
    assert "hydra.run.dir" in line
    assert_no_process_left(tmp_path)


# Launches at the same moment.


def test_launches_started_together_write_their_own_run_dirs(tmp_path: Path):
    """Two runs started at once must not share (and garble) one `outputs/<date>/<time>`."""
    outputs = [(tmp_path / f"stdout{number}.txt", tmp_path / f"stderr{number}.txt") for number in range(2)]
    procs = [start_module("project.train", ["logger=none"], tmp_path, *files) for files in outputs]
    statuses = [proc.wait(timeout=300) for proc in procs]
    ended = [(stdout.read_text(), stderr.read_text()) for stdout, stderr in outputs]
    assert statuses == [0, 0], [stderr[-3000:] for _, stderr in ended]
    printed = sorted(re.search(r"^run dir +(\S+)\s*$", stdout, re.MULTILINE).group(1) for stdout, _ in ended)
    run_dirs = sorted(path for path in (tmp_path / "outputs").glob("*/*") if path.is_dir())
    assert printed == [str(run_dir) for run_dir in run_dirs]
    first, second = run_dirs
    if second.name.startswith(first.name):  # started in the same second
        assert second.name == f"{first.name}-1"
    for run_dir in run_dirs:
        assert read_json(run_dir / "results.json")["run_dir"] == str(run_dir.resolve())
        assert (run_dir / ".hydra" / "config.yaml").is_file()
    assert (first / ".launch_id").read_text() != (second / ".launch_id").read_text()
    assert_nothing_half_written(tmp_path)
    assert_no_process_left(tmp_path)
