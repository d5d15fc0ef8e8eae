"""What the tests share besides fixtures: running the entry points as a user would, and reading what runs wrote.

`make test-fast` sets `PROJECT_TESTS_IN_PROCESS=1`: every test that would start a subprocess (a training run,
torchrun, a shell) is then skipped at that point, which leaves the suite's in-process tests.
"""

import json
import multiprocessing
import multiprocessing.spawn
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import torch.distributed
import torch.multiprocessing

from project.engine.peers import reserved_port
from project.optional.reference.parity import load_checkpoint, network_weights
from tests import preloaded_python

REPO = Path(__file__).resolve().parents[1]
CONF_DIR = REPO / "conf"
FASHION_MNIST_DEBIAN = Path("/usr/share/datasets/fashion-mnist")
# Debian's chromium and chromium-driver: the browser tests use these, never a downloaded driver.
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
IN_PROCESS_ONLY = os.environ.get("PROJECT_TESTS_IN_PROCESS") == "1"
# What srun gives task 0 of a two-node job: multi-node configs are built as the first node's task would build them
# (outside a launcher they are refused, which tests/test_faults.py checks).
SRUN_TASK_ZERO = {
    "SLURM_JOB_ID": "7",
    "SLURM_JOB_NAME": "train",
    "SLURM_NTASKS": "2",
    "SLURM_NNODES": "2",
    "SLURM_NTASKS_PER_NODE": "1",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_NODELIST": "localhost",
}


# The ports `free_port` handed out, held until this test process ends.
HELD_PORTS: list = []


def free_port() -> int:
    """A port no other process of this machine will take (`project.engine.peers.reserved_port`) while the tests run: the
    server, store or launcher the test starts binds it (with SO_REUSEADDR, as theirs all do)."""
    holder = reserved_port()
    HELD_PORTS.append(holder)
    return holder.getsockname()[1]


def python() -> str:
    """The Python to give a launcher (sbatch, torchrun, a shell): tests/preloaded_bin/python, which has this test
    process's preloaded Python fork what it can (tests/preloaded_python.py). Its environment: `environment()`."""
    return str(preloaded_python.SHIM)


def environment(env: dict | None = None) -> dict[str, str]:
    """The environment of a process the tests start: one intra-op thread unless `env` says otherwise (two such
    processes, or a run's ranks, share this machine's cores), and what leads `python()` to the preloaded Python."""
    base = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return {**base, **preloaded_python.PreloadedPython.get().environment(), **(env or {})}


@contextmanager
def spawning_preloaded() -> Iterator[None]:
    """multiprocessing's spawn (torch.multiprocessing.spawn, a "spawn" context) starts its processes through
    `python()` while this lasts: forked from the preloaded Python, with this process's environment."""
    saved_environment, saved_executable = dict(os.environ), multiprocessing.spawn.get_executable()
    os.environ.update(environment())
    multiprocessing.set_executable(python())
    try:
        yield
    finally:
        multiprocessing.set_executable(saved_executable)
        os.environ.clear()
        os.environ.update(saved_environment)


@contextmanager
def one_rank_process_group(directory: Path) -> Iterator[None]:
    """A gloo process group of this process alone (its store a file in `directory`), for code that needs one."""
    torch.distributed.init_process_group(
        "gloo", store=torch.distributed.FileStore(str(directory / "store"), 1), rank=0, world_size=1
    )
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()


def results_of_two_ranks(function: Callable, timeout: float = 120.0) -> dict:
    """What `function(rank, port, results)`, run in two spawned processes, put into `results` (a shared dict); they
    can meet in a gloo group at 127.0.0.1:`port`. A rank still running after `timeout` s (a collective waiting for
    the other) fails the test."""
    with multiprocessing.Manager() as manager, spawning_preloaded():
        results = manager.dict()
        processes = torch.multiprocessing.spawn(function, args=(free_port(), results), nprocs=2, join=False)
        deadline = time.monotonic() + timeout
        while not processes.join(timeout=1):
            if time.monotonic() > deadline:
                for process in processes.processes:
                    process.kill()
                pytest.fail(f"the two ranks did not finish in {timeout:g} s (a collective waiting for a rank?)")
        return dict(results)


def run_module(
    module: str,
    *args: str,
    cwd: Path,
    timeout: float = 300,
    env: dict | None = None,
    launcher: tuple[str, ...] = (),
    fresh: bool = False,
) -> subprocess.CompletedProcess:
    """Run `python -m <module> <args>` (or `<launcher> -m <module>`, a launcher that is this Python's `-m ...`) in
    `cwd` and capture its output.

    The process, and every process it launches, is forked from a Python that has imported the libraries already
    (tests/preloaded_python.py), unless `fresh` asks for an interpreter of its own and of its ranks' own (the tests
    of start-up itself).
    """
    command = [*launcher, "-m", module, *args] if launcher else [sys.executable, "-m", module, *args]
    if fresh:
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}
        return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full_env)
    sigint_ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    return preloaded_python.run(command, cwd, environment(env), timeout, sigint_ignored)


def start_module(
    module: str,
    args: list[str],
    cwd: Path,
    stdout: Path,
    stderr: Path,
    env: dict | None = None,
    new_session: bool = False,
) -> preloaded_python.ForkedProcess:
    """`python -m <module> <args>` in the background, its output in files (a pipe would fill up and block it), as
    a terminal starts it (Ctrl-C reaches Python), forked from the preloaded Python: the `pid`, `poll`, `wait`,
    `send_signal` and `kill` of a `subprocess.Popen`."""
    return preloaded_python.PreloadedPython.get().start(
        [sys.executable, "-m", module, *args], cwd, environment(env), stdout, stderr, new_session
    )


def check_ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    return result


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


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
            **environment(),
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
        task = ["sh", "-c", 'SLURM_TASK_PID=$$ exec "$@"', "srun-task", python(), "-m", module, *args]
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


def torchrun_nodes(
    module: str,
    args: list[str],
    cwd: Path,
    run_id: str,
    nodes: int = 2,
    per_node: int = 1,
    options: tuple[str, ...] = (),
    env: dict | None = None,
    timeout: float = 300,
) -> list[subprocess.CompletedProcess]:
    """Run `module` as a torchrun launch of `nodes` machines on this one: one agent per machine (`python -m
    project.optional.torchrun.launcher`, as on every machine), meeting at a c10d rendezvous on 127.0.0.1, each starting
    `per_node`
    processes. The agents all try to serve the rendezvous; the first to bind its port does, as on one host.
    """
    command = [
        python(),
        "-m",
        "project.optional.torchrun.launcher",
        f"--nnodes={nodes}",
        f"--nproc-per-node={per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}",
        f"--rdzv-id={run_id}",
        *options,
        "-m",
        module,
        *args,
    ]
    full_env = environment(env)
    agents = [
        subprocess.Popen(command, cwd=cwd, env=full_env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(nodes)
    ]
    results = []
    for agent in agents:
        stdout, stderr = agent.communicate(timeout=timeout)
        results.append(subprocess.CompletedProcess(agent.args, agent.returncode, stdout, stderr))
    return results


def last_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    """The network's weights in a run's `checkpoints/last.ckpt`, a file or a sharded (trainer=fsdp) directory."""
    return network_weights(load_checkpoint(run_dir / "checkpoints" / "last.ckpt")["state_dict"])


def histories(run_dir: Path) -> list[dict]:
    """Every rank's history file in `run_dir`, in rank order."""
    return [read_json(path) for path in sorted(run_dir.glob("history.rank*.json"))]


def shell_environment(env: dict | None = None) -> dict[str, str]:
    """`environment(env)` for a user's shell: `python` and `torchrun` are the venv's, as activated, through the
    preloaded Python (tests/preloaded_bin)."""
    full_env = environment(env)
    path = os.pathsep.join([str(preloaded_python.SHIM.parent), str(Path(sys.executable).parent), full_env["PATH"]])
    return {**full_env, "PATH": path}


def readme_section_blocks(title: str) -> list[tuple[str, str]]:
    """(language, text) of each fenced block under the README's `## <title>`."""
    readme = (REPO / "README.md").read_text()
    section = readme.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```(\w+)\n(.*?)^```", section, flags=re.MULTILINE | re.DOTALL)


def follow_readme_steps(steps: list[tuple[str, str]], cwd: Path, extra_env: dict[str, str]) -> Path:
    """The classes and YAML files into the files their first lines name, then the commands (the last block), as a
    user would in `cwd`; the results.json of the one run they make."""
    for _, text in steps[:-1]:
        path = cwd / re.match(r"# ([\w/.]+\.\w+)", text).group(1)  # the file its first line names
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for command in steps[-1][1].strip().splitlines():
        env = shell_environment(extra_env)
        result = subprocess.run(command, shell=True, cwd=cwd, capture_output=True, text=True, env=env, timeout=600)
        assert result.returncode == 0, f"{command}\n{result.stderr[-3000:]}"
    [results] = list(cwd.glob("outputs/*/*/results.json"))
    return results
