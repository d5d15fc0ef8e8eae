"""A run's log file holds what its console showed, so a failed run leaves something to diagnose from."""

import errno
import logging
import os
import sys
import threading
import warnings
from pathlib import Path

import pytest

from project.engine.run_log import DISK_ERRORS, LIBRARY_LOGGERS, ClosableConsole, capture_logs, started_by_rank_zero
from tests.helpers import check_ok, run_module


def test_train_log_holds_lightnings_messages_warnings_and_the_results_table(tmp_path: Path):
    result = check_ok(run_module("project.train", "logger=none", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path))
    log = (tmp_path / "run" / "train.log").read_text()
    assert "GPU available: False" in log and "GPU available: False" in result.stderr, "Lightning's own messages"
    assert "Results" in log and "run dir" in log, "the results table"
    assert "seed: 123" in log, "the config as printed"
    assert result.stderr.count("GPU available") == 1, "each message shown once on the console"


def test_a_bad_value_is_checked_before_the_config_is_printed_and_stays_in_the_log(tmp_path: Path):
    result = run_module("project.train", "seed=-1", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert result.returncode == 2
    assert "Config" not in result.stdout, "nothing but the error line to read"
    line = "error: seed must be an integer from 0 to 2**32 - 1, got -1"
    assert result.stderr.strip().splitlines()[-1] == line
    assert line in (tmp_path / "run" / "train.log").read_text()
    assert (tmp_path / "run" / ".hydra" / "config.yaml").is_file(), "the config is kept in the run dir either way"


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list[BaseException]:
    """`capture_logs` called in this process, everything it changes put back after the test; the exceptions that
    reach the thread hook it found."""
    reached: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda arguments: reached.append(arguments.exc_value))
    monkeypatch.setattr(sys, "stdout", sys.stdout)
    monkeypatch.setattr(sys, "stderr", sys.stderr)
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        monkeypatch.setattr(logger, "handlers", list(logger.handlers))
        monkeypatch.setattr(logger, "propagate", logger.propagate)
    # What `logging.captureWarnings(True)` changes.
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)
    monkeypatch.setattr(logging, "_warnings_showwarning", logging._warnings_showwarning)
    capture_logs()
    return reached


def raise_in_a_thread(error: BaseException) -> None:
    def fail() -> None:
        raise error

    thread = threading.Thread(target=fail)
    thread.start()
    thread.join()


def test_a_thread_failing_on_a_full_or_read_only_disk_stays_silent_and_any_other_failure_is_reported(captured):
    """A writer thread (TensorBoard's) that meets a full disk leaves it to the run's one error line, without a
    thread's traceback."""
    for error_number in DISK_ERRORS:
        raise_in_a_thread(OSError(error_number, os.strerror(error_number)))
    assert captured == []
    refused, bug = OSError(errno.EACCES, "Permission denied"), KeyError("weights")
    raise_in_a_thread(refused)
    raise_in_a_thread(bug)
    assert captured == [refused, bug]


def test_a_console_whose_reader_is_gone_at_a_flush_writes_to_dev_null_from_then_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
):
    log = tmp_path / "train.log"
    handler = logging.FileHandler(log)
    monkeypatch.setattr(logging.getLogger(), "handlers", [handler])
    read_end, write_end = os.pipe()
    os.close(read_end)  # `| head` has read its lines and gone
    with open(write_end, "w") as pipe:
        console = ClosableConsole(pipe)
        monkeypatch.setattr(sys, "stdout", console)
        console.write("a line, buffered\n")
        console.flush()  # the pipe refuses it
        assert os.readlink(f"/proc/self/fd/{write_end}") == "/dev/null"
        console.write("the run goes on\n")
        console.flush()
    handler.close()
    line = f"stdout was closed by its reader: the run goes on; its output is in {log}"
    assert capsys.readouterr().err == line + "\n"
    assert log.read_text() == line + "\n"


@pytest.mark.parametrize(
    ("environment", "reported_by_rank_zero"),
    [
        ({}, False),  # rank 0 itself reports
        ({"RANK": "1", "LOCAL_RANK": "1"}, True),  # a rank Lightning's launcher started
        ({"RANK": "1", "SLURM_PROCID": "1"}, False),  # srun started it: it reports itself
        ({"RANK": "1", "TORCHELASTIC_RUN_ID": "job"}, False),  # torchrun started it
    ],
)
def test_only_a_rank_that_rank_zero_started_leaves_its_lines_to_rank_zero(
    monkeypatch, environment, reported_by_rank_zero
):
    for variable in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(variable, raising=False)
    for variable, value in environment.items():
        monkeypatch.setenv(variable, value)
    assert started_by_rank_zero() is reported_by_rank_zero
