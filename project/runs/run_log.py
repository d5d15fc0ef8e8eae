"""What the console shows of a run also goes to its log file (`<run dir>/train.log`, `train.rank<N>.log`).

Hydra sets up logging (console and that file) when the job starts. Lightning, imported before, gave its logger a
console handler of its own and cut it off from the root logger, so none of its messages reached the file; Python's
warnings and `print` never did. `capture_logs` reconnects Lightning and the warnings to Hydra's handlers, and
`report` prints a text (the config, the results table, an error line) and writes it to the file too, so a failed
run leaves in its directory what its user saw.
"""

import errno
import logging
import sys
import threading
from collections.abc import Callable
from typing import TextIO

LIBRARY_LOGGERS = ("lightning", "lightning.pytorch", "lightning.fabric")
# What a full or read-only disk raises (project.errors reports it in one line).
DISK_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


def capture_logs() -> None:
    """Send Lightning's messages and Python's warnings through Hydra's console and file handlers.

    A log file that can no longer be written (a full or read-only disk) is left silent: Python's logging would print
    a traceback on the console for every line, where the run's one error line says what happened. So is a writer
    thread's failure on such a disk (TensorBoard's): the run meets the same error in its own thread and reports it.
    """
    logging.captureWarnings(True)
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.propagate = True
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handleError = lambda record: None
    threading.excepthook = quiet_about_disks(threading.excepthook)


def quiet_about_disks(hook: Callable) -> Callable:
    """`hook`, silent for a thread that failed on a full or read-only disk."""

    def excepthook(arguments: threading.ExceptHookArgs) -> None:
        if not (isinstance(arguments.exc_value, OSError) and arguments.exc_value.errno in DISK_ERRORS):
            hook(arguments)

    return excepthook


def to_log_file(text: str, level: int = logging.INFO) -> None:
    """Write `text` to the run's log file(s) only: the console already shows it."""
    record = logging.LogRecord("project", level, __file__, 0, text, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def report(text: str, stream: TextIO | None = None, level: int = logging.INFO) -> None:
    """Print `text` (to stdout unless `stream` is given) and write it to the run's log file."""
    print(text, file=stream or sys.stdout, flush=True)
    to_log_file(text, level)
