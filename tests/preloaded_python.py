"""A Python that has already imported torch, Lightning, Hydra and torchvision, and forks a fresh process per run.

Most of the suite's processes are `python -m project.<entry> <args>`, and each fresh interpreter spends seconds
importing the same libraries before it does anything. `run_module` (tests/helpers.py) hands such runs to this
server instead: it forks a child that becomes the run as `python -m` would start it (its own pid, working
directory, environment, argv, stdin/stdout/stderr, session and signal dispositions, `__main__` the module), so
exit statuses, signals, the ranks it launches and the files it writes are those of a real process. Only the
libraries' import-time work is shared; the project itself is imported afresh in every child.

What is read at import time is the server's, so runs whose environment places them in a distributed job
(a rank or Slurm task number, which Lightning reads as it is imported) start a fresh interpreter instead.

Protocol, one connection per run over a Unix socket: the client sends one JSON line (module, args, cwd, env,
stdout and stderr file paths, new_session); the server answers `{"pid": N}` and, once the child has ended,
`{"returncode": N}` (negative: the signal that killed it, as `subprocess` reports it).
"""

import contextlib
import json
import os
import random
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types
from pathlib import Path

# Environment variables that make a process a rank of a distributed job from its import on.
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "GROUP_RANK", "NODE_RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID")


def can_start(env: dict[str, str]) -> bool:
    """Whether a run with this environment can be forked from the server (see the module docstring)."""
    return not any(name in RANK_VARIABLES or name.startswith(("SLURM_", "JSM_", "PMI_", "OMPI_")) for name in env)


# --- the server ---------------------------------------------------------------------------------------------------


def serve(socket_path: str) -> dict | None:
    """Accept runs until stdin closes (the test process is gone); in a forked child, return its request."""
    import hydra  # noqa: F401
    import lightning.pytorch  # noqa: F401
    import optuna  # noqa: F401  (the sweepers' plugins import it as Hydra looks for plugins)
    import torch  # noqa: F401
    import torchmetrics  # noqa: F401
    import torchvision  # noqa: F401

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(16)
    print("ready", flush=True)
    running: dict[int, socket.socket] = {}
    while True:
        readable, _, _ = select.select([listener, sys.stdin], [], [], 0.05)
        if sys.stdin in readable and not sys.stdin.buffer.read1(1):
            return None
        if listener in readable:
            connection, _ = listener.accept()
            request = json.loads(connection.makefile("r").readline())
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                listener.close()
                connection.close()
                for other in running.values():
                    other.close()
                return request
            send(connection, {"pid": pid})
            running[pid] = connection
        while running:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            connection = running.pop(pid)
            send(connection, {"returncode": os.waitstatus_to_exitcode(status)})
            connection.close()


def send(connection: socket.socket, message: dict) -> None:
    with contextlib.suppress(OSError):  # the test that asked may have gone
        connection.sendall((json.dumps(message) + "\n").encode())


def become(request: dict) -> None:
    """Make this forked child the process `python -m <module> <args>` would be, started as subprocess starts it."""
    if request["new_session"]:
        os.setsid()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    stdin = os.open(os.devnull, os.O_RDONLY)
    os.dup2(stdin, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    # What a fresh interpreter has: Python's own SIGINT handler (unless SIGINT is ignored), SIGPIPE ignored.
    signal.signal(signal.SIGINT, signal.SIG_IGN if request["sigint_ignored"] else signal.default_int_handler)
    for number in (signal.SIGTERM, signal.SIGCHLD, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP):
        signal.signal(number, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    pythonpath = [entry for entry in request["env"].get("PYTHONPATH", "").split(os.pathsep) if entry]
    sys.path[:] = [request["cwd"], *pythonpath, *BASE_PATH]
    sys.argv[:] = [request["module"], *request["args"]]
    # torch sized its thread pool as the server imported it (with no OMP_NUM_THREADS: one thread per core).
    threads = request["env"].get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))
    random.seed()
    tempfile.tempdir = None  # found again from this run's TMPDIR


# --- the client ---------------------------------------------------------------------------------------------------


class PreloadedPython:
    """The server of this test process, started on first use and stopped when the test process ends."""

    _instance: "PreloadedPython | None" = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.directory = Path(os.environ.get("TMPDIR", "/tmp")) / f"preloaded-python-{os.getpid()}"
        self.directory.mkdir(exist_ok=True)
        self.socket_path = str(self.directory / "socket")
        env = {name: value for name, value in os.environ.items() if name not in ("PYTHONPATH", "OMP_NUM_THREADS")}
        self.server = subprocess.Popen(
            [sys.executable, "-m", "tests.preloaded_python", self.socket_path],
            cwd=Path(__file__).resolve().parents[1],
            env={**env, "PYTHONUNBUFFERED": "1"},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        if self.server.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the preloaded Python did not start (exit {self.server.wait()})")

    @classmethod
    def get(cls) -> "PreloadedPython":
        with cls._lock:
            if cls._instance is None or cls._instance.server.poll() is not None:
                cls._instance = cls()
            return cls._instance

    def start(
        self,
        module: str,
        args: list[str],
        cwd: Path,
        env: dict[str, str],
        stdout: Path,
        stderr: Path,
        new_session: bool = False,
        sigint_ignored: bool = False,
    ) -> "ForkedProcess":
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connection.connect(self.socket_path)
        request = {
            "module": module,
            "args": list(args),
            "cwd": str(cwd),
            "env": env,
            "stdout": str(stdout),
            "stderr": str(stderr),
            "new_session": new_session,
            "sigint_ignored": sigint_ignored,
        }
        connection.sendall((json.dumps(request) + "\n").encode())
        return ForkedProcess(connection, [sys.executable, "-m", module, *args])


class ForkedProcess:
    """The part of `subprocess.Popen` the tests use, for a run the preloaded Python forked."""

    def __init__(self, connection: socket.socket, args: list[str]) -> None:
        self.connection = connection
        self.reader = connection.makefile("r")
        self.args = args
        self.returncode: int | None = None
        line = self.reader.readline()
        if not line:
            raise RuntimeError("the preloaded Python ended before it started the run")
        self.pid: int = json.loads(line)["pid"]

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self.connection], [], [], 0)[0]:
            self._read_returncode()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self.connection], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._read_returncode()
        return self.returncode

    def _read_returncode(self) -> None:
        line = self.reader.readline()
        if not line:
            raise RuntimeError(f"the preloaded Python ended while process {self.pid} ran")
        self.returncode = json.loads(line)["returncode"]
        self.connection.close()

    def send_signal(self, number: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, number)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def run(
    module: str, args: list[str], cwd: Path, env: dict[str, str], timeout: float, sigint_ignored: bool
) -> subprocess.CompletedProcess:
    """As `subprocess.run([python, -m, module, *args], capture_output=True, text=True, timeout=...)` would."""
    server = PreloadedPython.get()
    stamp = f"{threading.get_ident()}-{time.monotonic_ns()}"
    stdout, stderr = server.directory / f"{stamp}.out", server.directory / f"{stamp}.err"
    proc = server.start(module, args, cwd, env, stdout, stderr, sigint_ignored=sigint_ignored)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    finally:
        output = stdout.read_text(errors="replace"), stderr.read_text(errors="replace")
        stdout.unlink(missing_ok=True)
        stderr.unlink(missing_ok=True)
    return subprocess.CompletedProcess(proc.args, proc.returncode, *output)


if __name__ == "__main__":
    BASE_PATH = sys.path[1:]  # without this server's own directory, as `python -m` from elsewhere has it
    job = serve(sys.argv[1])
    if job is None:
        sys.exit(0)
    become(job)
    del job
    import runpy

    # What `python -m` itself calls, in a `__main__` of its own: the module runs as `__main__`, and so the child
    # ends (exit status, traceback, interpreter shutdown) as that process would.
    server_module = sys.modules["__main__"]  # keeps this code's globals while the run has `__main__`
    sys.modules["__main__"] = types.ModuleType("__main__")
    runpy._run_module_as_main(sys.argv[0])
