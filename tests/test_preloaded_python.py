"""A process forked by the tests' preloaded Python (tests/preloaded_python.py) ends as a fresh interpreter running the
same program does: its exit status (a signal where Python dies of one), what it printed last, its non-daemon threads
joined and its `atexit` handlers run first. Every verdict of the suite that reads a process's end relies on it."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests import preloaded_python
from tests.helpers import environment, python

PROGRAMS = {
    "returns": "print('done')",
    "exits 3": "import sys; print('leaving'); sys.exit(3)",
    "exits with a message": "import sys; sys.exit('error: a message of its own')",
    "exits 256 (0 to its parent)": "import sys; sys.exit(256)",
    "raises": "raise ValueError('a bug')",
    "interrupted": "raise KeyboardInterrupt",
    "a thread outlives the program": (
        "import threading, time\n"
        "def late(): time.sleep(0.2); print('the thread ends', flush=True)\n"
        "threading.Thread(target=late).start()\n"
        "print('main ends')"
    ),
    "atexit prints, then output buffered": (
        "import atexit, sys\natexit.register(lambda: print('atexit ran'))\nsys.stdout.write('no newline, buffered')"
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", PROGRAMS)
def test_a_forked_program_ends_as_a_fresh_interpreter_running_it_does(name: str, tmp_path: Path):
    script = tmp_path / "program.py"
    script.write_text(PROGRAMS[name] + "\n")
    env = {**environment(), "PYTHONUNBUFFERED": ""}  # buffered output, as a program's own run would have it
    fresh = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True)
    forked = preloaded_python.run([sys.executable, str(script)], tmp_path, env, timeout=60, sigint_ignored=False)
    assert forked.returncode == fresh.returncode, (forked.stderr, fresh.stderr)
    assert forked.stdout == fresh.stdout
    assert forked.stderr.strip().splitlines()[-1:] == fresh.stderr.strip().splitlines()[-1:]
    if name == "interrupted":
        assert forked.returncode == -signal.SIGINT


@pytest.mark.slow
def test_a_process_with_more_descriptors_than_one_message_carries_starts_afresh(tmp_path: Path):
    """A ddp_spawn worker inherits a descriptor per tensor its parent shares with it, so a module of a few hundred
    weights and buffers (torchvision's mobilenet_v3_small) has more than the 253 one message can hand over. Such a
    process starts as a fresh interpreter, and the preloaded Python goes on serving the others."""
    (tmp_path / "small.json").write_text('{"a": 1}')
    serving = preloaded_python.PreloadedPython.get().server
    pipes = [descriptor for _ in range(150) for descriptor in os.pipe()]
    try:
        result = subprocess.run(
            [python(), "-m", "json.tool", "small.json"],
            cwd=tmp_path,
            env=environment(),
            pass_fds=pipes,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        for descriptor in pipes:
            os.close(descriptor)
    assert result.returncode == 0 and json.loads(result.stdout) == {"a": 1}, result.stderr
    assert preloaded_python.PreloadedPython.get().server.pid == serving.pid and serving.poll() is None
