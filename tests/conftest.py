"""Fixtures and the skips of what this machine cannot run; plain helpers live in tests/helpers.py."""

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.helpers import FASHION_MNIST_DEBIAN, IN_PROCESS_ONLY
from tests.idx_files import write_idx_dataset


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip, with the reason, what this machine cannot run."""
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; none is visible here")
    skip_real = pytest.mark.skip(
        reason=f"needs Debian's Fashion-MNIST in {FASHION_MNIST_DEBIAN} (`make system-deps` as root)"
    )
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_gpu)
        if "realdata" in item.keywords and not FASHION_MNIST_DEBIAN.is_dir():
            item.add_marker(skip_real)


@pytest.fixture(scope="session", autouse=True)
def no_processes_in_fast_runs() -> Iterator[None]:
    """Under `make test-fast`, a test that starts a subprocess (a training run, torchrun, a shell) skips right there.

    Session-wide and first, so that module fixtures which train in a process skip their tests too.
    """
    if not IN_PROCESS_ONLY:
        yield
        return
    original = subprocess.Popen.__init__
    subprocess.Popen.__init__ = skip_process
    yield
    subprocess.Popen.__init__ = original


def skip_process(*args: object, **kwargs: object) -> None:
    pytest.skip("starts a process: `make test` runs it")


@pytest.fixture(scope="session")
def mnist_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data root holding small MNIST-format files (400 train, 100 test images)."""
    root = tmp_path_factory.mktemp("mnist-data")
    write_idx_dataset(root, "MNIST")
    return root


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"
