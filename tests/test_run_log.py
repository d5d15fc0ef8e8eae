"""A run's log file holds what its console showed, so a failed run leaves something to diagnose from."""

import errno
import logging
import os
import sys
import threading
import warnings
from pathlib import Path

import pytest

from project.engine.run_log import (
    DISK_ERRORS,
    LIBRARY_LOGGERS,
    ClosableConsole,
    capture_logs,
    printable,
    process_rank,
    report,
    started_by_rank_zero,
)
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
def captured(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> list[BaseException]:
    """`capture_logs` called in this process (the root logger's handlers those the function a test gives indirectly
    makes), everything it changes put back after the test; the exceptions that reach the thread hook it found."""
    reached: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda arguments: reached.append(arguments.exc_value))
    monkeypatch.setattr(sys, "stdout", sys.stdout)
    monkeypatch.setattr(sys, "stderr", sys.stderr)
    monkeypatch.setattr(logging.getLogger(), "handlers", getattr(request, "param", list)())
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


@pytest.mark.parametrize(
    ("environment", "rank"),
    [({}, 0), ({"SLURM_PROCID": "0", "LOCAL_RANK": "1"}, 1), ({"RANK": "0", "SLURM_PROCID": "2"}, 2)],
)
def test_a_processs_rank_is_whichever_its_launcher_announced(monkeypatch, environment, rank):
    """torchrun sets RANK, srun SLURM_PROCID, Lightning's own launcher LOCAL_RANK: a variable another launcher left
    at 0 hides no rank."""
    for variable in ("RANK", "LOCAL_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(variable, raising=False)
    for variable, value in environment.items():
        monkeypatch.setenv(variable, value)
    assert process_rank() == rank


def test_a_name_read_from_a_file_is_printed_with_its_control_characters_escaped():
    assert printable("run\x1b[2J\tdir\nnext\x07é") == "run\\x1b[2J\tdir\nnext\\x07é"


class Terminal:
    """A console's stream as a test sees it: what was written, and whether it was flushed since."""

    def __init__(self) -> None:
        self.text, self.flushed = "", True

    def write(self, text: str) -> int:
        self.text, self.flushed = self.text + text, False
        return len(text)

    def flush(self) -> None:
        self.flushed = True


def test_a_line_for_stderr_starts_below_a_progress_bar_and_is_flushed_at_once(monkeypatch):
    out, err = ClosableConsole(Terminal()), Terminal()
    monkeypatch.setattr(sys, "stdout", Terminal())  # a console the engine did not wrap: no bar is known
    report("before", stream=err)
    assert err.text == "before\n"
    err.text = ""
    monkeypatch.setattr(sys, "stdout", out)
    assert out.at_line_start, "nothing written yet"
    out.write("Epoch 0:  50%|#####     | 1/2\r")  # a bar's redraw: the line goes on
    out.write("")
    assert not out.at_line_start
    report("a warning", stream=err)
    assert (err.text, err.flushed) == ("\na warning\n", True)
    out.write("Epoch 0: 100%|##########| 2/2\n")
    report("another", stream=err)
    assert err.text.endswith("warning\nanother\n")
    report("a result")
    assert out.stream.text.endswith("2/2\na result\n") and out.stream.flushed


def a_log_file_and_the_console() -> list[logging.Handler]:
    """The root logger's handlers as Hydra's job logging leaves them: the run's log file and the console."""
    return [logging.FileHandler(os.devnull), logging.StreamHandler(sys.stdout)]


@pytest.mark.parametrize("captured", [a_log_file_and_the_console], indirect=True)
def test_capture_logs_sends_warnings_to_the_log_and_the_console_handlers_through_the_closable_console(captured, capsys):
    handlers = logging.getLogger().handlers
    log_file = next(handler for handler in handlers if isinstance(handler, logging.FileHandler))
    console = next(handler for handler in handlers if type(handler) is logging.StreamHandler)
    assert isinstance(console.stream, ClosableConsole), "a console handler writes through the closable console"
    log_file.handleError(logging.LogRecord("project", logging.INFO, __file__, 0, "x", None, None))
    log_file.close()
    assert capsys.readouterr().err == "", "a log file on a full disk stays silent: the run's error line says it"
    assert warnings.showwarning is logging._showwarning, "Python's warnings go to the log"


def test_the_line_saying_a_consoles_reader_is_gone_is_flushed_at_once(monkeypatch: pytest.MonkeyPatch):
    """A run whose console was closed may be killed before anything else flushes stderr: the line goes out first."""
    err = Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    read_end, write_end = os.pipe()
    os.close(read_end)
    with open(write_end, "w") as pipe:
        console = ClosableConsole(pipe)
        monkeypatch.setattr(sys, "stdout", console)
        console.write("a line\n")
        console.flush()
    assert (err.text, err.flushed) == ("stdout was closed by its reader: the run goes on without it\n", True)
