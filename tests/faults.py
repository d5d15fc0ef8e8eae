"""What the fault tests check of every run they break, and how they run it.

Every fault test runs an entry point as a user would, in a process of its own, and checks four things: the exit
status; the last line of stderr (`error: ...` naming what to fix, no traceback anywhere); what is on disk (no
`.partial` file, every checkpoint loads); and that no process of the run is left. A bad input is one `BadInput`:
the core's are in tests/fault_cases.py, an optional part's in its own tests/optional/<part>/ folder, each list
turned into a test by `bad_input_test`; conftest.py's `bad_input_runs` starts a module's cases side by side.
"""

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tests.helpers import REPO, mnist_overrides, run_module, start_module

USER_ERROR, SWEEP_FAILED = 2, 1
INTERRUPTED = 128 + signal.SIGINT
# A run that fails at start takes a Python and Lightning start-up (seconds; more on a loaded machine): longer is a hang.
START_TIMEOUT = 120
ENV = {"OMP_NUM_THREADS": "1"}  # DDP ranks share the 2 cores of a small machine
# Runs that load a test-only module (tests/crash_callback.py, tests/foreign_modules.py) find it.
TESTS_IMPORTABLE = {**ENV, "PYTHONPATH": str(REPO)}
LONG_TOY_RUN = ("logger=none", "trainer.max_epochs=100000")  # runs until it is stopped, a checkpoint every epoch
DDP = ("trainer=ddp", "trainer.devices=2")


def last_line(stderr: str) -> str:
    lines = stderr.rstrip().splitlines()
    return lines[-1] if lines else ""


def assert_ends_in_error_line(
    status: int, stdout: str, stderr: str, expected: int, *names: str, only_line: bool = True
) -> str:
    """Exit status `expected`, no traceback, and stderr's last line `error: ...` naming `names`; that line."""
    shown = f"exit {status}; stderr ends:\n{stderr[-3000:]}"
    assert status == expected, shown
    assert "Traceback" not in stderr + stdout, shown
    line = last_line(stderr)
    assert line.startswith("error: "), shown
    if only_line:
        assert [text for text in stderr.splitlines() if text.startswith("error:")] == [line], shown
    for name in names:
        assert name in line, f"{name!r} not named in: {line}"
    return line


def assert_nothing_half_written(directory: Path) -> None:
    """No checkpoint's temporary file is left, and every checkpoint loads whole."""
    assert sorted(directory.rglob("*.partial")) == []
    for path in directory.rglob("checkpoints/*.ckpt"):
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
        assert "state_dict" in checkpoint and "config" in checkpoint, path


def processes_in(directory: Path) -> list[int]:
    """Live processes working in `directory` or below: every process of a run started there (its ranks too)."""
    found = []
    for cwd in Path("/proc").glob("[0-9]*/cwd"):
        try:
            target = Path(os.readlink(cwd))
        except OSError:
            continue
        if (target == directory or directory in target.parents) and alive(int(cwd.parent.name)):
            found.append(int(cwd.parent.name))
    return found


def assert_no_process_left(directory: Path, grace: float = 10.0) -> None:
    """None of the run's processes outlives it (after `grace` seconds to exit); any that does is killed."""
    deadline = time.monotonic() + grace
    while (left := processes_in(directory)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert left == [], f"processes of the run outlived it: {left}"


@contextmanager
def background_run(
    args: list[str], cwd: Path, new_session: bool = False, env: dict | None = None
) -> Iterator[subprocess.Popen]:
    """`python -m project.train <args>` in the background, its output in files in `cwd` (`output_of` reads them).
    Whatever is still running when the test ends is killed.
    """
    proc = start_module(
        "project.train", args, cwd, cwd / "stdout.txt", cwd / "stderr.txt", env=env, new_session=new_session
    )
    try:
        yield proc
    finally:
        for pid in [*descendants(proc.pid), proc.pid]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        proc.wait()


def wait_for_file(path: Path, proc: subprocess.Popen, cwd: Path, timeout: float = 180) -> None:
    """Until `path` exists, while the `background_run` in `cwd` goes on."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            pytest.fail(f"the run ended (exit {proc.returncode}) before {path} existed:\n{output_of(cwd)[1][-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {path} after {timeout} s")
        time.sleep(0.2)


def end_of(proc: subprocess.Popen, cwd: Path, timeout: float = 60) -> int:
    """The exit status of the `background_run` in `cwd`, due within `timeout` s: a stopped run must not hang."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the run did not end within {timeout} s; its stderr ends:\n{output_of(cwd)[1][-3000:]}")


def output_of(cwd: Path) -> tuple[str, str]:
    """The stdout and stderr of the `background_run` in `cwd`."""
    return (cwd / "stdout.txt").read_text(), (cwd / "stderr.txt").read_text()


def descendants(pid: int) -> list[int]:
    """Process ids below `pid` (Linux /proc), children first."""
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


# Bad input: exit 2 at once, in one line.


@dataclass(frozen=True)
class BadInput:
    """One way to start a run wrongly, and what its error line must name."""

    id: str
    args: tuple[str, ...]
    names: tuple[str, ...]
    module: str = "project.train"
    mnist: bool = False  # run the MNIST recipe on the small test files (tests.helpers.mnist_overrides)
    prepare: Callable[[Path, Path], None] | None = None  # (case dir, a finished toy run's last.ckpt)
    check: Callable[[Path], None] | None = None  # what else must hold of the case dir after the run


def run_bad_input(case: BadInput, case_dir: Path, data: Path, ckpt: Path) -> subprocess.CompletedProcess:
    if case.prepare:
        case.prepare(case_dir, ckpt)
    args = [arg.format(dir=case_dir, data=data, ckpt=ckpt) for arg in case.args]
    if case.module == "project.train":
        args = [f"hydra.run.dir={case_dir / 'run'}", "logger=none", *args]
        if case.mnist:
            args = mnist_overrides(data, *args)
    else:
        args = [f"hydra.run.dir={case_dir / 'run'}", *args]
    return run_module(case.module, *args, cwd=case_dir, timeout=START_TIMEOUT, env=ENV)


BAD_INPUT_TEST = "test_bad_input_exits_2_with_one_error_line_naming_it"


def bad_input_test(cases: list[BadInput]) -> Callable:
    """The test that runs `cases` (a module names it `test_bad_input_exits_2_with_one_error_line_naming_it`)."""

    @pytest.mark.parametrize("case", [pytest.param(case, id=case.id) for case in cases])
    def test(case: BadInput, bad_input_runs: dict, mnist_root: Path, finished_toy_run: Path) -> None:
        """The user learns what to change from one line, and the run leaves no results that look like a success."""
        case_dir, future = bad_input_runs[case.id]
        result = future.result()
        names = [name.format(dir=case_dir, data=mnist_root, ckpt=finished_toy_run) for name in case.names]
        assert_ends_in_error_line(result.returncode, result.stdout, result.stderr, USER_ERROR, *names)
        assert not (case_dir / "run" / "results.json").exists()
        assert_nothing_half_written(case_dir / "run")  # (the case's own damaged checkpoints lie beside it)
        assert_no_process_left(case_dir)
        if case.check:
            case.check(case_dir)

    test.__name__ = BAD_INPUT_TEST
    return test
