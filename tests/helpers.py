"""What the tests share besides fixtures: running the entry points as a user would, and reading what runs wrote.

`make test-fast` sets `PROJECT_TESTS_IN_PROCESS=1`: every test that would start a subprocess (a training run,
torchrun, a shell) is then skipped at that point, which leaves the suite's in-process tests.
"""

import json
import math
import multiprocessing
import multiprocessing.spawn
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import torch.distributed
import torch.multiprocessing
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from project.engine.checkpoints import is_sharded, plain_checkpoint
from project.engine.ddp import reserved_port
from project.engine.upstream import VERSION_BASE
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


def untrained_toy_checkpoint(directory: Path, *overrides: str) -> Path:
    """`directory`/last.ckpt as project.train writes one of the toy's untrained module: its whole run config (of
    `overrides`) and weights."""
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        cfg = compose("train", overrides=[*overrides, f"run_dir={directory}"])
    path = directory / "last.ckpt"
    config = OmegaConf.to_container(cfg, resolve=True)
    torch.save({"config": config, "state_dict": instantiate(cfg.model).state_dict(), "global_step": 0}, path)
    return path


# The ports `free_port` handed out, held until this test process ends.
HELD_PORTS: list = []


def free_port() -> int:
    """A port no other process of this machine will take (`project.engine.ddp.reserved_port`) while the tests run: the
    server, store or launcher the test starts binds it (with SO_REUSEADDR, as theirs all do)."""
    holder = reserved_port()
    HELD_PORTS.append(holder)
    return holder.getsockname()[1]


@contextmanager
def held_port() -> Iterator[int]:
    """A port on 127.0.0.1 that a socket of the test listens on, and never answers from, while this lasts."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


@contextmanager
def watched_port() -> Iterator[tuple[int, list]]:
    """A port on 127.0.0.1 that notes every connection made to it and closes it at once (the client fails fast)."""
    connections: list = []
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0.1)
        stop = threading.Event()

        def accept() -> None:
            while not stop.is_set():
                try:
                    connection, address = listener.accept()
                except TimeoutError:
                    continue
                connections.append(address)
                connection.close()

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        try:
            yield listener.getsockname()[1], connections
        finally:
            stop.set()
            thread.join()


def proxied_to(port: int) -> dict[str, str]:
    """An environment that sends any HTTP(S) a process makes, by proxy or not, to the watched `port`."""
    proxy = f"http://127.0.0.1:{port}"
    return {name: proxy for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy")}


# Whether the running test is marked `fresh` (set by conftest.py's `interpreters` fixture): its processes, and every
# process they start, are then fresh interpreters started as a user starts them, not forks of the preloaded Python.
FRESH = False


@contextmanager
def fresh_interpreters() -> Iterator[None]:
    """While this lasts, `run_module`, `start_module`, `python()`, `environment()` and `shell_environment()` give the
    venv's own Python: a test of what a user sees at a run's end (exit status, last line, processes left) that the
    fork could change (docs/testing.md, "Forked or fresh")."""
    global FRESH
    FRESH = True
    try:
        yield
    finally:
        FRESH = False


@contextmanager
def held_by_hydra(cfg: DictConfig) -> Iterator[None]:
    """`cfg` as a run's `HydraConfig` holds it (what `hydra.main` sets), while the block lasts."""
    HydraConfig.instance().set_config(cfg)
    try:
        yield
    finally:
        HydraConfig.instance().cfg = None


def python() -> str:
    """The Python to give a launcher (sbatch, torchrun, a shell): tests/preloaded_bin/python, which has this test
    process's preloaded Python fork what it can (tests/preloaded_python.py), or in a `fresh` test the venv's own.
    Its environment: `environment()`."""
    return sys.executable if FRESH else str(preloaded_python.SHIM)


def environment(env: dict | None = None) -> dict[str, str]:
    """The environment of a process the tests start: one intra-op thread unless `env` says otherwise (two such
    processes, or a run's ranks, share this machine's cores), and what leads `python()` to the preloaded Python;
    in a `fresh` test nothing else (output buffered as a user's is)."""
    if FRESH:
        return {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
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
        if torch.distributed.is_initialized():  # else the code under test took it down itself
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
) -> subprocess.CompletedProcess:
    """Run `python -m <module> <args>` (or `<launcher> -m <module>`, a launcher that is this Python's `-m ...`) in
    `cwd` and capture its output.

    The process, and every process it launches, is forked from a Python that has imported the libraries already
    (tests/preloaded_python.py), unless the test is marked `fresh`.
    """
    command = [*launcher, "-m", module, *args] if launcher else [sys.executable, "-m", module, *args]
    if FRESH:
        return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=environment(env))
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
) -> subprocess.Popen | preloaded_python.ForkedProcess:
    """`python -m <module> <args>` in the background, its output in files (a pipe would fill up and block it), as
    a terminal starts it (Ctrl-C reaches Python), forked from the preloaded Python unless the test is marked
    `fresh`: the `pid`, `poll`, `wait`, `send_signal` and `kill` of a `subprocess.Popen`."""
    command = [sys.executable, "-m", module, *args]
    if not FRESH:
        return preloaded_python.PreloadedPython.get().start(command, cwd, environment(env), stdout, stderr, new_session)
    with open(stdout, "w") as out, open(stderr, "w") as err:
        return subprocess.Popen(
            command,
            cwd=cwd,
            env=environment(env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=new_session,
            # Ctrl-C's SIGINT handled as a terminal's Python handles it, even where the suite itself was started
            # with SIGINT ignored (a shell's background job): Python installs its handler only where it is not.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
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


def last_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    """The classifier's network weights in a run's `checkpoints/last.ckpt` (a file, or a sharded directory), named
    as in the bare network's own `state_dict`."""
    path = run_dir / "checkpoints" / "last.ckpt"
    checkpoint = plain_checkpoint(path) if is_sharded(path) else torch.load(path, map_location="cpu", weights_only=True)
    prefix = "network."
    state = checkpoint["state_dict"]
    return {key.removeprefix(prefix): value for key, value in state.items() if key.startswith(prefix)}


def loss_gap(first: list[float], second: list[float]) -> float:
    """The largest per-step loss difference of two runs of the same length (a NaN counts as an infinite one)."""
    assert len(first) == len(second), f"{len(first)} steps against {len(second)}"
    gaps = (torch.tensor(first, dtype=torch.float64) - torch.tensor(second, dtype=torch.float64)).abs()
    return torch.nan_to_num(gaps, nan=math.inf).max().item() if gaps.numel() else 0.0


def weight_gap(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> float:
    """The largest difference of two networks' weights, tensor by tensor (a NaN counts as an infinite one)."""
    assert first.keys() == second.keys(), sorted(first.keys() ^ second.keys())
    gaps = [torch.nan_to_num((first[k].double() - second[k].double()).abs(), nan=math.inf) for k in first]
    return max((gap.max().item() for gap in gaps if gap.numel()), default=0.0)


STOPPED_BY_SIGTERM = 128 + signal.SIGTERM
# The mid-epoch checkpoint switched on (the optional part mid_epoch): last.ckpt also when SIGTERM stops a run.
MID_EPOCH_ON = "callbacks.mid_epoch_checkpoint.enabled=true"


# What a run resumed without the test-only callback its first part ran with (tests/crash_callback.py) gives, as a user
# resuming a run without a callback of their own that its command line named would: the checkpoint's stored config
# names it, and only what the run names or trusts opens (docs/checkpoints.md).
TRUST_TEST_CODE = "+trusted_targets.test_code=tests.*"


def signal_at(step: int, name: str) -> list[str]:
    """The overrides by which rank 0 of a run signals itself once optimizer step `step` has finished
    (tests/crash_callback.py)."""
    return [
        "+callbacks.crash._target_=tests.crash_callback.SignalAtStep",
        f"+callbacks.crash.step={step}",
        f"+callbacks.crash.signal={name}",
    ]


def assert_resumed_exactly(resumed: Path, whole: Path, first_step: int, epochs: int = 3) -> None:
    """Every rank's losses after `first_step`, and the final weights, bitwise those of the run never stopped."""
    for again, once in zip(histories(resumed), histories(whole), strict=True):
        assert again["first_step"] == first_step
        assert again["step_losses"] == once["step_losses"][first_step:], "the resumed run trained other batches"
    expected, weights = last_weights(whole), last_weights(resumed)
    assert expected and weights.keys() == expected.keys()
    assert all(torch.equal(weights[name], tensor) for name, tensor in expected.items()), "weights differ"
    assert read_json(resumed / "results.json")["epochs"] == epochs


# The optional parts (project/optional/parts.yaml): a test of one that needs another skips where that one is deleted.
PARTS = yaml.safe_load((REPO / "project" / "optional" / "parts.yaml").read_text())


def part_present(name: str) -> bool:
    """Whether the optional part `name` is still here: its own place, the first of its paths."""
    return name in PARTS and (REPO / PARTS[name]["paths"][0]).exists()


def requires(*names: str) -> pytest.MarkDecorator:
    """Skips a test where one of the optional parts `names` was deleted."""
    missing = [name for name in names if not part_present(name)]
    return pytest.mark.skipif(bool(missing), reason=f"needs the optional part(s) {', '.join(missing)}, deleted here")


def histories(run_dir: Path) -> list[dict]:
    """Every rank's history file in `run_dir`, in rank order."""
    return [read_json(path) for path in sorted(run_dir.glob("history.rank*.json"))]


def shell_environment(env: dict | None = None) -> dict[str, str]:
    """`environment(env)` for a user's shell: `python` and `torchrun` are the venv's, as activated, through the
    preloaded Python (tests/preloaded_bin) unless the test is marked `fresh`."""
    full_env = environment(env)
    shims = [] if FRESH else [str(preloaded_python.SHIM.parent)]
    path = os.pathsep.join([*shims, str(Path(sys.executable).parent), full_env["PATH"]])
    return {**full_env, "PATH": path}


# A user's own modules (tests/foreign_modules.py), from their YAML files in a directory of theirs (`user_dir`).
REGRESSION = ["model=regression", "data=regression", "optimized_metric=val/mse", "optimized_mode=min"]


def assert_each_rank_trained_its_half(cwd: Path, first_epoch: int) -> None:
    """The one run under `cwd`'s outputs/ (REGRESSION, 4 epochs) trained on two ranks, each its half (24 of 48
    points) of every epoch from `first_epoch` on (where a restarted launch resumed)."""
    (run_dir,) = [path.parent for path in (cwd / "outputs").rglob("results.json")]
    ranks = histories(run_dir)
    assert [(h["rank"], h["world_size"], h["first_epoch"]) for h in ranks] == [(0, 2, first_epoch), (1, 2, first_epoch)]
    assert all(h["epoch_samples"] == [24] * (4 - first_epoch) for h in ranks)
    results = read_json(run_dir / "results.json")
    assert results["epochs"] == 4 and math.isfinite(results["val/mse"])


def train_own(cwd: Path, *args: str, module: str = "project.train") -> subprocess.CompletedProcess:
    """`python -m <module> <flags> hydra.searchpath=[file://<cwd>/my_conf] <overrides>` in the user's directory."""
    flags = [arg for arg in args if arg.startswith("-")]
    overrides = [arg for arg in args if not arg.startswith("-")]
    searchpath = f"hydra.searchpath=[file://{cwd / 'my_conf'}]"
    return run_module(module, *flags, searchpath, *overrides, cwd=cwd, env={"PYTHONPATH": str(REPO)})


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def git(repository: Path, *arguments: str) -> str:
    """git's output in `repository`, as a committer named "test"."""
    command = ["git", "-c", "user.name=test", "-c", "user.email=test@example.com", *arguments]
    return subprocess.run(command, cwd=repository, check=True, capture_output=True, text=True).stdout


def scratch_repository(destination: Path) -> Path:
    """This repository's code and config (as git lists them) in a git repository of its own, committed once: what a
    test may change and commit without touching this checkout."""
    listed = git(REPO, "ls-files", "--cached", "--others", "--exclude-standard")
    kept = ("project/", "conf/", "hydra_plugins/", "constraints-py", "pyproject.toml", ".gitignore")
    for name in listed.splitlines():
        if name.startswith(kept) and (REPO / name).is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, destination / name)
    git(destination, "init", "-q", "-b", "main")
    git(destination, "add", "-A")
    git(destination, "commit", "-q", "-m", "scratch")
    return destination
