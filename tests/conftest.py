"""Shared fixtures: a Python that runs the entry points as a user would, small MNIST files, the config dir."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from project.compare import free_port  # noqa: F401  (tests import it from here)
from tests.idx_files import write_idx_dataset

REPO = Path(__file__).resolve().parents[1]
CONF_DIR = REPO / "conf"
FASHION_MNIST_DEBIAN = Path("/usr/share/datasets/fashion-mnist")


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


def run_module(
    module: str,
    *args: str,
    cwd: Path,
    timeout: float = 300,
    env: dict | None = None,
    launcher: tuple[str, ...] = (),
) -> subprocess.CompletedProcess:
    """Run `python -m <module> <args>` (or `<launcher> -m <module>`) in `cwd` and capture its output."""
    command = [*launcher, "-m", module, *args] if launcher else [sys.executable, "-m", module, *args]
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full_env)


def check_ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    return result


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.fixture(scope="session")
def mnist_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data root holding small MNIST-format files (400 train, 100 test images)."""
    root = tmp_path_factory.mktemp("mnist-data")
    write_idx_dataset(root, "MNIST")
    return root


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


def mnist_overrides(mnist_root: Path, *extra: str) -> list[str]:
    """The MNIST recipe on the small test files: 350 training images (50 held out), no TensorBoard."""
    return [
        "experiment=mnist",
        f"data.root={mnist_root}",
        "data.download=false",
        "data.val_size=50",
        "logger=none",
        *extra,
    ]


def simulated_slurm_nodes(
    module: str, args: list[str], cwd: Path, nodes: int = 2, timeout: float = 300
) -> list[subprocess.CompletedProcess]:
    """Run `module` as `nodes` Slurm tasks on this machine (one task per node), as srun would start them."""
    port = free_port()
    procs = []
    for node in range(nodes):
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
            "SLURM_JOB_ID": "4242",
            "SLURM_STEP_ID": "0",
            "SLURM_JOB_NAME": "train",
            "SLURM_NTASKS": str(nodes),
            "SLURM_NNODES": str(nodes),
            "SLURM_NTASKS_PER_NODE": "1",
            "SLURM_PROCID": str(node),
            "SLURM_NODEID": str(node),
            "SLURM_LOCALID": "0",
            "SLURM_NODELIST": "localhost",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        # As srun starts a task: SLURM_TASK_PID is the program's own pid (`exec` keeps the shell's).
        task = ["sh", "-c", 'SLURM_TASK_PID=$$ exec "$@"', "srun-task", sys.executable, "-m", module, *args]
        procs.append(
            subprocess.Popen(
                task,
                cwd=cwd,
                env=env,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        )
    results = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=timeout)
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    return results


def histories(run_dir: Path) -> list[dict]:
    """Every rank's history file in `run_dir`, in rank order."""
    return [read_json(path) for path in sorted(run_dir.glob("history.rank*.json"))]
