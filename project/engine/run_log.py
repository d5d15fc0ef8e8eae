"""Which rank this process is, and the run's log file (`<run dir>/train.log`, `train.rank<N>.log`): it gets what the
console shows, and a console its reader closed (`| head`) does not end the run. Standard library only:
`project.engine.startup` uses it before the libraries are imported."""

import errno
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import TextIO

LIBRARY_LOGGERS = ("lightning", "lightning.pytorch", "lightning.fabric")
# What a full or read-only disk raises (project.engine.errors reports it in one line).
DISK_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


def process_rank() -> int:
    """This process's rank as its launcher announced it (torchrun: RANK, srun: SLURM_PROCID, Lightning: LOCAL_RANK)."""
    for variable in ("RANK", "SLURM_PROCID", "LOCAL_RANK"):
        rank = int(os.environ.get(variable, "0"))
        if rank > 0:
            return rank
    return 0


def started_by_rank_zero() -> bool:
    """Whether this process is a rank that rank 0 itself started (Lightning's DDP launcher), which then reports for it.
    Ranks srun or torchrun start each report: a signal may end rank 0 before it can."""
    launched = "SLURM_PROCID" in os.environ or "TORCHELASTIC_RUN_ID" in os.environ
    return process_rank() != 0 and not launched


def capture_logs() -> None:
    """Send Lightning's messages and Python's warnings through Hydra's console and file handlers, the console streams
    becoming `ClosableConsole`s; a log file, or a writer thread, failing on a full or read-only disk stays silent."""
    if not isinstance(sys.stdout, ClosableConsole):
        sys.stdout, sys.stderr = ClosableConsole(sys.stdout), ClosableConsole(sys.stderr)
    logging.captureWarnings(True)
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.propagate = True
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handleError = lambda record: None
        elif isinstance(handler, logging.StreamHandler):
            handler.setStream(next((s for s in (sys.stdout, sys.stderr) if s.stream is handler.stream), handler.stream))
    threading.excepthook = quiet_about_disks(threading.excepthook)


def quiet_about_disks(hook: Callable) -> Callable:
    """`hook`, silent for a thread that failed on a full or read-only disk."""

    def excepthook(arguments: threading.ExceptHookArgs) -> None:
        if not (isinstance(arguments.exc_value, OSError) and arguments.exc_value.errno in DISK_ERRORS):
            hook(arguments)

    return excepthook


class ClosableConsole:
    """A console stream that outlives its reader: the first write a closed pipe refuses points it at /dev/null, says
    so (on stderr and in the log file), and the run goes on (Python ignores SIGPIPE: the next write would raise)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        # Whether what was written last ended its line (a progress bar's redraw does not).
        self.at_line_start = True

    def write(self, text: str) -> int:
        if text:
            self.at_line_start = text.endswith("\n")
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            self.closed_by_reader()
            return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except BrokenPipeError:
            self.closed_by_reader()

    def closed_by_reader(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self.stream.fileno())
        os.close(devnull)
        files = [
            handler.baseFilename for handler in logging.getLogger().handlers if isinstance(handler, logging.FileHandler)
        ]
        note = f"the run goes on; its output is in {', '.join(files)}" if files else "the run goes on without it"
        line = f"{'stdout' if self is sys.stdout else 'stderr'} was closed by its reader: {note}"
        print(line, file=sys.stderr, flush=True)
        to_log_file(line, logging.WARNING)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def to_log_file(text: str, level: int = logging.INFO) -> None:
    """Write `text` to the run's log file(s) only: the console already shows it."""
    record = logging.LogRecord("project", level, __file__, 0, text, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def report(text: str, stream: TextIO | None = None, level: int = logging.INFO) -> None:
    """Print `text` (to stdout unless `stream` is given) and write it to the run's log file; a text for stderr starts
    on a line of its own below a progress bar drawn on stdout."""
    stream = stream or sys.stdout
    below_a_bar = stream is not sys.stdout and not getattr(sys.stdout, "at_line_start", True)
    print(f"\n{text}" if below_a_bar else text, file=stream, flush=True)
    to_log_file(text, level)
