"""What the bench's tests share (tests/test_bench.py and each optional part's test_*_bench.py): `python -m bench
--quick` run in the test's process, its PNGs checked, and the fixtures its runs need.

The bench's `main` runs in the test's process: its suites start the processes whose behaviour they measure (start-up,
memory, preemption, the DDP ranks), and a fresh interpreter for the bench itself would only add its imports to every
test. A test module imports `one_thread` (an autouse fixture: imported, it applies to every test of the module), and
`preloaded_runs` where a test asks for it (`pytest.mark.usefixtures`).
"""

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from bench.__main__ import main
from tests.helpers import environment, python, read_json

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """One intra-op thread for the bench and for the processes it starts, which share the cores with other tests: two
    threads per process on a busy 2-core machine spin against each other. The environment is put back afterwards
    (the bench's runs seed, which sets PL_GLOBAL_SEED for the later tests of this process and their processes)."""
    saved = dict(os.environ)
    os.environ["OMP_NUM_THREADS"] = "1"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def preloaded_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runs a suite starts as `sys.executable -m ...` are forked from the preloaded Python
    (tests/preloaded_python.py), sparing each the seconds of imports, which no assertion of the test reads. Only for
    suites whose recorded figures the test does not compare with a fresh interpreter's (not start-up, not memory)."""
    for name, value in environment().items():  # (starts the preloaded Python, with the real sys.executable)
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(sys, "executable", python())


def run_quick_bench(out: Path, capsys: pytest.CaptureFixture, *args: str) -> tuple[str, dict]:
    """`python -m bench --quick --out <out> <args>`: its table and the suites of its JSON."""
    status = main(["--quick", "--out", str(out), *args])
    printed = capsys.readouterr()
    assert status == 0, f"a suite failed\n{printed.out[-3000:]}\n{printed.err[-6000:]}"
    [record] = [read_json(path) for path in out.glob("*.json")]
    return printed.out, record["suites"]


def assert_pngs(directory: Path, names: set[str]) -> None:
    found = {path.name.split("-quick-")[1] for path in directory.glob("*.png")}
    assert found == names
    for path in directory.glob("*.png"):
        assert path.read_bytes()[:8] == PNG_SIGNATURE
