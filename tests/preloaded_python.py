"""A Python that has already imported torch, Lightning, Hydra and torchvision, and forks a fresh process per run.

Most of the suite's processes are Python programs of the project: runs, the ranks a run or a launcher starts,
torchrun's agents and workers, Slurm tasks, `ddp_spawn`'s workers. Each fresh interpreter spends seconds importing
the same libraries before it does anything. The tests hand such processes to this server instead: it forks a child
that becomes the process `python -m <module>` (or multiprocessing's `python -c ... --multiprocessing-fork`) would be:
its own pid, working directory, CPU affinity, environment, argv, open files (stdin, stdout, stderr and any other
descriptor the caller passed on, so a pipe stays a pipe and a log file keeps its offset), session, signal
dispositions and, where the caller lives in other namespaces (a node of the local Slurm cluster), that node's
network, hostname and mounts. `__main__` is the module, so exit statuses, signals, the ranks it launches and the
files it writes are those of a real process. Only the libraries' import-time work is shared; the project itself is
imported afresh in every child, and what Lightning read from the environment as it was imported (the process's rank)
is read again.

Who asks:
- the tests themselves (`run_module`, `start_module` in tests/helpers.py), through `PreloadedPython`;
- any program that starts `preloaded_bin/python` (the tests give it to launchers as their Python: Lightning's DDP,
  torchrun's `PYTHON_EXEC`, sbatch's `PROJECT_PYTHON`, multiprocessing's spawn, the README's shell). That file
  runs tests/preloaded_client.py, which passes its arguments, working directory, environment and open descriptors
  here, passes on the signals it gets, and ends as the forked process ended. A process that cannot be forked
  (`python -c CODE`, a script, unknown options) is started as a fresh interpreter by the same client.
  Because the client stands in for the process, a client killed by SIGKILL (which it cannot pass on) takes its
  forked process with it: the server watches every client and kills the process of one that is gone.

Protocol, one connection per process over a Unix socket: an 8-byte length carrying the descriptors (SCM_RIGHTS),
then that many bytes of JSON (module or code, args, cwd, env, the descriptors' numbers, new_session,
sigint_ignored); the server answers `{"pid": N}` and, once the child has ended, `{"returncode": N}` (negative: the
signal that killed it, as `subprocess` reports it).
"""

import contextlib
import ctypes
import gc
import importlib
import json
import os
import random
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import types
from pathlib import Path

# What the tests give launchers as their Python, and the environment variables that lead it to this server.
SHIM = Path(__file__).resolve().parent / "preloaded_bin" / "python"
SOCKET_VARIABLE, REAL_PYTHON_VARIABLE = "PRELOADED_PYTHON_SOCKET", "PRELOADED_PYTHON_REAL"
# Interpreter options that change nothing a forked child would do differently (its output is unbuffered anyway).
HARMLESS_OPTIONS = ("-u", "-B", "-s", "-E")
MAX_DESCRIPTORS = 253  # the kernel's limit for one SCM_RIGHTS message
HEADER = struct.Struct("!Q")
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWNET = 0x00020000, 0x04000000, 0x40000000


def forkable(python_args: list[str]) -> dict | None:
    """What `python <python_args>` runs, if the server can fork it: {"module"|"script"|"code": ..., "args": [...]}."""
    index = 0
    while index < len(python_args) and python_args[index] in HARMLESS_OPTIONS:
        index += 1
    option, rest = python_args[index : index + 2], python_args[index + 2 :]
    if len(option) == 2 and option[0] == "-m":
        return {"module": option[1], "args": rest}
    if len(option) == 2 and option[0] == "-c" and "--multiprocessing-fork" in rest:
        return {"code": option[1], "args": rest}
    if option and option[0].endswith(".py"):
        return {"script": os.path.abspath(option[0]), "args": python_args[index + 1 :]}
    return None


def send_request(socket_path: str, request: dict, descriptors: list[int]) -> socket.socket:
    """Ask the server at `socket_path` to fork `request`, with `descriptors` as its open files (their numbers in
    `request["fds"]`); the connection its answers come on."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.connect(socket_path)
    payload = json.dumps(request).encode()
    socket.send_fds(connection, [HEADER.pack(len(payload))], descriptors)
    connection.sendall(payload)
    return connection


# --- the server ---------------------------------------------------------------------------------------------------


def serve(socket_path: str) -> tuple[dict, list[int], int] | None:
    """Accept runs until stdin closes (the test process is gone); in a forked child, return its request, the
    descriptors that came with it and the pid of the process that asked."""
    import hydra  # noqa: F401
    import lightning.pytorch  # noqa: F401
    import torch  # noqa: F401
    import torch.distributed.checkpoint.format_utils  # noqa: F401  (the engine's checkpoints)
    import torch.distributed.run  # noqa: F401  (torchrun's agents)
    import torch.utils.tensorboard  # noqa: F401  (the default logger's writer)
    import torchmetrics  # noqa: F401
    import torchvision  # noqa: F401

    # What the optional parts import, where their packages are still installed: logger=mlflow's client, and the study
    # storage of every Optuna search (the project's sweeper imports optuna as Hydra looks for plugins).
    for optional in ("mlflow.tracking", "optuna", "alembic.migration", "sqlalchemy.orm"):
        with contextlib.suppress(ImportError):
            importlib.import_module(optional)

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(64)
    # The imported objects live as long as any child: the children's collections need not walk them (each would
    # copy every page of the server's heap that holds one).
    gc.freeze()
    print("ready", flush=True)
    running: dict[int, tuple[socket.socket, int]] = {}  # child pid → (connection, pidfd of the client)
    while True:
        watched = {pidfd: pid for pid, (_, pidfd) in running.items()}
        readable, _, _ = select.select([listener, sys.stdin, *watched], [], [], 0.05)
        if sys.stdin in readable and not sys.stdin.buffer.read1(1):
            return None
        for pidfd in readable:
            if pidfd in watched:  # the client is gone before its process: so is the process, as its stand-in
                with contextlib.suppress(ProcessLookupError):
                    os.kill(watched[pidfd], signal.SIGKILL)
        if listener in readable:
            connection, _ = listener.accept()
            request, descriptors = receive(connection)
            client = struct.unpack("3i", connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                listener.close()
                connection.close()
                for other, pidfd in running.values():
                    other.close()
                    os.close(pidfd)
                return request, descriptors, client
            for descriptor in descriptors:
                os.close(descriptor)
            send(connection, {"pid": pid})
            running[pid] = (connection, os.pidfd_open(client))
        while running:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            connection, pidfd = running.pop(pid)
            os.close(pidfd)
            send(connection, {"returncode": os.waitstatus_to_exitcode(status)})
            connection.close()


def receive(connection: socket.socket) -> tuple[dict, list[int]]:
    header, descriptors, _, _ = socket.recv_fds(connection, HEADER.size, MAX_DESCRIPTORS)
    header += read_exactly(connection, HEADER.size - len(header))
    return json.loads(read_exactly(connection, HEADER.unpack(header)[0])), descriptors


def read_exactly(connection: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the client went away mid-request")
        data += chunk
    return data


def send(connection: socket.socket, message: dict) -> None:
    with contextlib.suppress(OSError):  # the client that asked may have gone
        connection.sendall((json.dumps(message) + "\n").encode())


def become(request: dict, descriptors: list[int], client: int) -> None:
    """Make this forked child the process the client asked for, started as the client was."""
    join_namespaces(client)
    if request["new_session"]:
        os.setsid()
    if "affinity" in request:
        os.sched_setaffinity(0, request["affinity"])
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    place_descriptors(descriptors, request["fds"])
    # What a fresh interpreter has: Python's own SIGINT handler (unless SIGINT is ignored), SIGPIPE ignored.
    signal.signal(signal.SIGINT, signal.SIG_IGN if request["sigint_ignored"] else signal.default_int_handler)
    for number in (signal.SIGTERM, signal.SIGCHLD, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP):
        signal.signal(number, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    pythonpath = [entry for entry in request["env"].get("PYTHONPATH", "").split(os.pathsep) if entry]
    if "module" in request:
        sys.path[:] = [request["cwd"], *pythonpath, *BASE_PATH]
        sys.argv[:] = [request["module"], *request["args"]]
        sys.orig_argv = [sys.executable, "-m", request["module"], *request["args"]]
    elif "script" in request:
        sys.path[:] = [os.path.dirname(os.path.realpath(request["script"])), *pythonpath, *BASE_PATH]
        sys.argv[:] = [request["script"], *request["args"]]
        sys.orig_argv = [sys.executable, request["script"], *request["args"]]
    else:
        sys.path[:] = ["", *pythonpath, *BASE_PATH]
        sys.argv[:] = ["-c", *request["args"]]
        sys.orig_argv = [sys.executable, "-c", request.get("code", ""), *request["args"]]
    # torch sized its thread pool as the server imported it (with no OMP_NUM_THREADS: one thread per core); a fresh
    # interpreter sizes it by OMP_NUM_THREADS, else by the cores it may run on (a launcher may give it fewer).
    import torch

    threads = request["env"].get("OMP_NUM_THREADS", "")
    torch.set_num_threads(int(threads) if threads.isdigit() and int(threads) > 0 else len(os.sched_getaffinity(0)))
    if request.get("stand_in"):
        take_the_identity_of(client)
    # Lightning read the process's rank from the environment as the server imported it.
    from lightning.fabric.utilities.rank_zero import _get_rank, rank_zero_only

    rank_zero_only.rank = _get_rank() or 0
    if SOCKET_VARIABLE in os.environ:  # the processes this one starts are forked too
        import multiprocessing

        sys.executable = str(SHIM)
        multiprocessing.set_executable(sys.executable)
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    tempfile.tempdir = None  # found again from this process's TMPDIR


def join_namespaces(pid: int) -> None:
    """Enter the network, hostname and mount namespaces of process `pid` where they are not this process's (a node
    of the local Slurm cluster; only root gets there). Must run while this process has one thread."""
    libc = ctypes.CDLL(None, use_errno=True)
    for kind, flag in (("net", CLONE_NEWNET), ("uts", CLONE_NEWUTS), ("mnt", CLONE_NEWNS)):
        theirs = f"/proc/{pid}/ns/{kind}"
        if os.stat(theirs).st_ino == os.stat(f"/proc/self/ns/{kind}").st_ino:
            continue
        descriptor = os.open(theirs, os.O_RDONLY)
        if libc.setns(descriptor, flag) != 0:
            raise OSError(ctypes.get_errno(), f"cannot enter the {kind} namespace of process {pid}")
        os.close(descriptor)


def take_the_identity_of(client: int) -> None:
    """Answer `os.getpid()` and `os.getppid()` with the client's: the pid its launcher knows, signals and waits for
    (the client passes signals on), and the parent that launched it (torchrun's workers name their launch after
    it, a Slurm task knows itself by SLURM_TASK_PID). Processes this one forks see their own."""
    this, real_getpid, real_getppid = os.getpid(), os.getpid, os.getppid

    def client_parent() -> int:
        with contextlib.suppress(OSError):
            return int(Path(f"/proc/{client}/stat").read_text().rsplit(")", 1)[1].split()[1])
        return real_getppid()

    os.getpid = lambda: client if real_getpid() == this else real_getpid()
    os.getppid = lambda: client_parent() if real_getpid() == this else real_getppid()


def place_descriptors(descriptors: list[int], numbers: list[int]) -> None:
    """Give each received descriptor the number it had in the client (first moved out of the way of each other)."""
    above = max([*descriptors, *numbers], default=2) + 1
    moved = [fcntl_dup(descriptor, above) for descriptor in descriptors]
    for descriptor in descriptors:
        os.close(descriptor)
    for descriptor, number in zip(moved, numbers, strict=True):
        os.dup2(descriptor, number)
        os.close(descriptor)


def fcntl_dup(descriptor: int, lowest: int) -> int:
    import fcntl

    return fcntl.fcntl(descriptor, fcntl.F_DUPFD, lowest)


# --- the tests' client --------------------------------------------------------------------------------------------


class PreloadedPython:
    """The server of this test process, started on first use and stopped when the test process ends."""

    _instance: "PreloadedPython | None" = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.directory = Path(os.environ.get("TMPDIR", "/tmp")) / f"preloaded-python-{os.getpid()}"
        self.directory.mkdir(exist_ok=True)
        self.socket_path = str(self.directory / "socket")
        Path(self.socket_path).unlink(missing_ok=True)  # left by a killed process that had this pid before
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

    def environment(self) -> dict[str, str]:
        """What leads `preloaded_bin/python`, and every launcher given it, to this server."""
        return {
            SOCKET_VARIABLE: self.socket_path,
            REAL_PYTHON_VARIABLE: sys.executable,
            "PYTHON_EXEC": str(SHIM),  # torchrun's workers
        }

    def start(
        self,
        command: list[str],
        cwd: Path,
        env: dict[str, str],
        stdout: Path,
        stderr: Path,
        new_session: bool = False,
        sigint_ignored: bool = False,
    ) -> "ForkedProcess":
        """`command` (this Python's `-m <module> ...`) forked, its output in the files `stdout` and `stderr`."""
        target = forkable(command[1:]) if command[0] == sys.executable else None
        if target is None:
            raise ValueError(f"not a command the preloaded Python runs: {command}")
        request = {
            **target,
            "cwd": str(cwd),
            "env": {**env, **self.environment()},
            "fds": [0, 1, 2],
            "new_session": new_session,
            "sigint_ignored": sigint_ignored,
        }
        files = [os.open(os.devnull, os.O_RDONLY)]
        files += [os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) for path in (stdout, stderr)]
        try:
            connection = send_request(self.socket_path, request, files)
        finally:
            for descriptor in files:
                os.close(descriptor)
        return ForkedProcess(connection, command)


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
    command: list[str], cwd: Path, env: dict[str, str], timeout: float, sigint_ignored: bool
) -> subprocess.CompletedProcess:
    """As `subprocess.run(command, capture_output=True, text=True, timeout=...)` would."""
    server = PreloadedPython.get()
    stamp = f"{threading.get_ident()}-{time.monotonic_ns()}"
    stdout, stderr = server.directory / f"{stamp}.out", server.directory / f"{stamp}.err"
    proc = server.start(command, cwd, env, stdout, stderr, sigint_ignored=sigint_ignored)
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


class ChildExit:
    """How a forked child ends: as its process would, up to the teardown of the modules it inherited.

    Python ends a program in this order: the exception that ended it printed, its non-daemon threads joined, the
    `atexit` handlers run (logging's flush among them), stdout and stderr flushed, then every module torn down object
    by object. In a child of this server that teardown frees the server's whole heap (torch, Lightning), touching
    each page it shares with the server: it costs about as much CPU as a toy run, and nothing a test can observe
    depends on it. So the server registers `end` as its first `atexit` handler, which Python runs last: in a child it
    flushes the output and leaves with the status Python would have left with, skipping the teardown alone.
    """

    status: int | None = None  # set in a child as its program ends (None: the server itself)
    interrupted = False  # ended by an uncaught KeyboardInterrupt, which Python reports by dying of SIGINT

    @classmethod
    def noted(cls, error: BaseException | None) -> None:
        """Note the status Python gives a program ended by `error` (None: it returned)."""
        cls.interrupted = isinstance(error, KeyboardInterrupt)
        if error is None:
            cls.status = 0
        elif isinstance(error, SystemExit):
            code = error.code
            cls.status = 0 if code is None else code if isinstance(code, int) else 1
        else:
            cls.status = 1

    @classmethod
    def end(cls) -> None:
        if cls.status is None:
            return
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        if cls.interrupted:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.raise_signal(signal.SIGINT)
        os._exit(cls.status & 0xFF)


if __name__ == "__main__":
    import atexit

    atexit.register(ChildExit.end)  # before the libraries register theirs: run after them
    BASE_PATH = sys.path[1:]  # without this server's own directory, as `python -m` from elsewhere has it
    job = serve(sys.argv[1])
    if job is None:
        sys.exit(0)
    become(*job)
    source = job[0].get("code")
    del job
    server_module = sys.modules["__main__"]  # keeps this code's globals while the run has `__main__`
    sys.modules["__main__"] = main = types.ModuleType("__main__")
    import runpy

    # What `python -m`, `python <script>` and `python -c` do themselves; the child ends (exit status, traceback,
    # threads, atexit) as that process would (`ChildExit`).
    try:
        if source is not None:
            main.__builtins__ = __builtins__
            exec(compile(source, "<string>", "exec"), main.__dict__)
        elif sys.argv[0].endswith(".py"):
            runpy.run_path(sys.argv[0], run_name="__main__")
        else:
            runpy._run_module_as_main(sys.argv[0])
    except BaseException as error:
        ChildExit.noted(error)
        raise
    ChildExit.noted(None)
