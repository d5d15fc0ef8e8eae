"""Every wait on another process ends within its timeout, in one line naming who did not answer.

Each case runs the entry point as a user would (a process of its own, with the waits set short), makes one peer
fail to answer (a port held by a socket of the test's own), and checks the end: exit
status, the one `error:` line, and no process of the run left. torchrun's own waits are in tests/test_torchrun.py.
"""

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.helpers import run_module
from tests.test_faults import (
    DDP,
    ENV,
    START_TIMEOUT,
    USER_ERROR,
    assert_ends_in_error_line,
    assert_no_process_left,
)

pytestmark = pytest.mark.slow  # every case starts the entry point


@contextmanager
def held_port() -> Iterator[int]:
    """A port on 127.0.0.1 that a socket of the test listens on, and never answers from, while this lasts."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def test_a_master_port_in_use_ends_the_run_in_one_line_naming_it(tmp_path: Path):
    with held_port() as port:
        result = run_module(
            "project.train",
            *DDP,
            "logger=none",
            f"hydra.run.dir={tmp_path / 'run'}",
            cwd=tmp_path,
            timeout=START_TIMEOUT,
            env={**ENV, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)},
        )
    line = assert_ends_in_error_line(result.returncode, result.stdout, result.stderr, USER_ERROR)
    assert line == f"error: port {port} is in use on 127.0.0.1 (another program or run holds it): " + (
        "pick another MASTER_PORT"
    )
    assert_no_process_left(tmp_path)
