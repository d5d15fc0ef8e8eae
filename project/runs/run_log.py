"""What the console shows of a run also goes to its log file (`<run dir>/train.log`, `train.rank<N>.log`).

Hydra sets up logging (console and that file) when the job starts. Lightning, imported before, gave its logger a
console handler of its own and cut it off from the root logger, so none of its messages reached the file; Python's
warnings and `print` never did. `capture_logs` reconnects Lightning and the warnings to Hydra's handlers, and
`report` prints a text (the config, the results table, an error line) and writes it to the file too, so a failed
run leaves in its directory what its user saw.
"""

import logging
import sys
from typing import TextIO

LIBRARY_LOGGERS = ("lightning", "lightning.pytorch", "lightning.fabric")


def capture_logs() -> None:
    """Send Lightning's messages and Python's warnings through Hydra's console and file handlers."""
    logging.captureWarnings(True)
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.propagate = True


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
