"""Which rank this process is, and the run's log file (`<run dir>/train.log`, `train.rank<N>.log`), which gets what the
console shows. Standard library only: `project.engine.startup` uses it before the libraries are imported."""

import errno
import logging
import os
import sys
import threading
from typing import TextIO

LIBRARY_LOGGERS = ("lightning", "lightning.pytorch", "lightning.fabric")
# What a full or read-only disk raises.
DISK_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


def process_rank() -> int:
    """This process's rank as its launcher announced it (torchrun, srun, Lightning)."""
    for variable in ("RANK", "SLURM_PROCID", "LOCAL_RANK"):
        rank = int(os.environ.get(variable, "0"))
        if rank > 0:
            return rank
    return 0


def started_by_rank_zero() -> bool:
    """Whether rank 0 itself started this rank (Lightning's DDP launcher), and so reports for it; ranks srun or
    torchrun start each report (a signal may end rank 0 before it can)."""
    launched = "SLURM_PROCID" in os.environ or "TORCHELASTIC_RUN_ID" in os.environ
    return process_rank() != 0 and not launched


def capture_logs() -> None:
    """Send Lightning's messages and Python's warnings through Hydra's handlers and the console through
    `ClosableConsole`s; a log file or a thread failing on a full or read-only disk stays silent."""
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
    hook = threading.excepthook

    def excepthook(arguments: threading.ExceptHookArgs) -> None:
        if not (isinstance(arguments.exc_value, OSError) and arguments.exc_value.errno in DISK_ERRORS):
            hook(arguments)

    threading.excepthook = excepthook


class ClosableConsole:
    """A console stream that outlives its reader (`| head`): the first write a closed pipe refuses points it at
    /dev/null and says so; the run goes on."""

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


def printable(text: str) -> str:
    """`text` with each control character but a line break or tab written as its escape (`\\x1b`): what the engine
    prints echoes names and paths read from files, which must not drive the terminal (escape codes)."""
    return "".join(char if char.isprintable() or char in "\n\t" else ascii(char)[1:-1] for char in text)


def report(text: str, stream: TextIO | None = None, level: int = logging.INFO) -> None:
    """Print `text` (to stdout by default) and log it, control characters escaped (`printable`); a text for stderr
    starts below a progress bar on stdout."""
    text = printable(text)
    stream = stream or sys.stdout
    below_a_bar = stream is not sys.stdout and not getattr(sys.stdout, "at_line_start", True)
    print(f"\n{text}" if below_a_bar else text, file=stream, flush=True)
    to_log_file(text, level)
