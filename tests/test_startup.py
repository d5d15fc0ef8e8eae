"""project/engine/startup.py's decisions, in-process: which SIGTERM it acts on, who says the line, and when it steps
aside. Real signals to real runs (imports, DDP's rendezvous, a sweep's job, ddp_spawn) are in tests/test_faults.py;
here the moments those tests cannot aim at: a SIGTERM the handler noted just before training started."""

import io
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest

from project.engine import startup
from tests.helpers import REPO, environment, python


class Exited(Exception):
    """What `os._exit` raises here, with its status."""


@pytest.fixture
def armed(monkeypatch: pytest.MonkeyPatch) -> startup.StartupStop:
    """A fresh start-up state, armed, its handler taken to be the process's (no real handler installed), ending the
    test rather than the process, and starting no thread."""
    state = startup.StartupStop()
    state.armed = True
    state.reader = object()  # taken as started
    monkeypatch.setattr(startup, "STARTUP", state)
    monkeypatch.setattr(startup.signal, "getsignal", lambda number: startup.on_sigterm)
    monkeypatch.setattr(startup, "end_children", lambda: None)

    def exit_status(status: int) -> None:
        raise Exited(status)

    monkeypatch.setattr(startup.os, "_exit", exit_status)
    for variable in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(variable, raising=False)
    return state


def test_a_sigterm_noted_as_training_starts_is_acted_on_there(armed, capsys):
    """The handler only notes the signal; where the start-up ends before the thread acts, `disarm` does."""
    startup.on_sigterm(signal.SIGTERM, None)
    assert armed.pending and not armed.stopping
    with pytest.raises(Exited) as exited:
        startup.disarm()
    assert exited.value.args == (143,)
    assert capsys.readouterr().err.splitlines()[-1] == f"error: {startup.STARTING}: {startup.RUN_AGAIN}"


def test_the_thread_acts_once_for_a_signal_the_handler_noted_too(armed, capsys):
    startup.on_sigterm(signal.SIGTERM, None)
    with pytest.raises(Exited):
        armed.stop()
    armed.stop()  # the other of the two: nothing more
    startup.on_sigterm(signal.SIGTERM, None)  # a second signal meanwhile: nothing more either
    assert [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")] == [
        f"error: {startup.STARTING}: {startup.RUN_AGAIN}"
    ]


def test_a_sigterm_noted_while_starting_is_reported_as_such_when_training_starts_before_the_thread_acts(armed, capsys):
    """Training starting changes the line; a signal that came before is acted on first, with the line it came under
    (the thread can lag the main thread by many steps)."""
    startup.on_sigterm(signal.SIGTERM, None)
    with pytest.raises(Exited):
        startup.stop_on_sigterm(lambda: "stopped by SIGTERM after training")
    assert capsys.readouterr().err.splitlines()[-1] == f"error: {startup.STARTING}: {startup.RUN_AGAIN}"


def test_the_end_of_a_job_waits_for_a_stop_the_thread_is_making(armed, monkeypatch):
    """A stop the thread has claimed ends the process shortly; the job's end must not write the run's results first."""

    class Waited(Exception):
        pass

    class Forever:
        def wait(self) -> None:
            raise Waited

    monkeypatch.setattr(startup.threading, "Event", Forever)
    armed.stopping = True  # the thread's, mid-way
    with pytest.raises(Waited):
        startup.disarm()


def test_once_started_a_sigterm_does_what_it_does_by_default(armed, monkeypatch, capsys):
    """After the start-up, Lightning restores this handler after `fit`: called by itself it ends the process as
    Python's default would, without a line."""
    done = []
    monkeypatch.setattr(startup.signal, "signal", lambda number, handler: done.append(("handler", handler)))
    monkeypatch.setattr(startup.os, "kill", lambda pid, number: done.append(("kill", number)))
    startup.disarm()
    startup.on_sigterm(signal.SIGTERM, None)
    armed.stop()
    assert done == [("handler", signal.SIG_DFL), ("kill", signal.SIGTERM)]
    assert capsys.readouterr().err == ""


def test_under_lightnings_handler_it_does_nothing(armed, monkeypatch, capsys):
    """Lightning's handler, registered just before the first epoch, calls the one it found: that one then leaves the
    stop to Lightning, even while still armed."""
    monkeypatch.setattr(startup.signal, "getsignal", lambda number: signal.default_int_handler)
    startup.on_sigterm(signal.SIGTERM, None)
    armed.stop()
    assert not armed.pending and not armed.stopping
    assert capsys.readouterr().err == ""


def test_a_rank_that_rank_zero_started_ends_without_a_line(armed, monkeypatch, capsys):
    """Rank 0 says it for the run; a rank srun or torchrun started says it itself."""
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(Exited):
        armed.stop()
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("SLURM_PROCID", "1")
    armed.stopping = False
    with pytest.raises(Exited):
        armed.stop()
    assert capsys.readouterr().err.startswith("error: stopped by SIGTERM while starting")


@contextmanager
def thread_reading() -> Iterator[tuple[int, threading.Thread, list[int]]]:
    """The start-up's signal thread, started on a pipe standing for Python's wake-up fd: the pipe's write end, the
    thread, and the status it ended the process with, once it has. Both ends are closed at the block's end."""
    read_end, write_end = os.pipe()
    ended: list[int] = []

    def read() -> None:
        try:
            startup.read_signals(read_end)
        except Exited as exited:
            ended.extend(exited.args)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    try:
        yield write_end, thread, ended
    finally:
        os.close(write_end)
        os.close(read_end)


def test_the_thread_ends_the_run_where_the_handler_does_not_run_as_in_a_call_of_c(armed, capsys):
    """Inside torch's rendezvous or an import of C, Python runs no handler until the call returns: the thread waits
    its `HANDLER_WAIT` for the handler, then ends the run itself."""
    with thread_reading() as (write_end, thread, ended):
        os.write(write_end, bytes([signal.SIGTERM]))  # what Python's C handler writes to the wake-up fd
        thread.join(timeout=10)
    assert ended == [143], "the thread ended the run (10 s bounds a hang; it waits 0.2 s)"
    assert capsys.readouterr().err.splitlines()[-1] == f"error: {startup.STARTING}: {startup.RUN_AGAIN}"


def test_the_thread_leaves_a_signal_to_the_handler_that_runs_within_its_wait(armed, monkeypatch, capsys):
    """The thread wakes as the signal comes, before Python runs any handler: it gives the handler `HANDLER_WAIT` to
    run. Here the handler that runs is Lightning's, set meanwhile (its graceful stop), chaining this module's: the
    thread leaves the stop to it, and acts on the next signal no handler takes."""
    monkeypatch.setattr(startup, "HANDLER_WAIT", 0.9)  # a wait of under a second, longer than this test's steps
    with thread_reading() as (write_end, thread, ended):
        os.write(write_end, bytes([signal.SIGTERM]))
        thread.join(timeout=0.3)  # a thread that acts at once has ended the run by now
        assert ended == [], "the thread waited for the handler"
        monkeypatch.setattr(startup.signal, "getsignal", lambda number: signal.default_int_handler)
        startup.on_sigterm(signal.SIGTERM, None)  # as Lightning's handler calls the one it found
        monkeypatch.setattr(startup.signal, "getsignal", lambda number: startup.on_sigterm)
        monkeypatch.setattr(startup, "HANDLER_WAIT", 0.0)  # the first signal's wait is under way: this test waits less
        os.write(write_end, bytes([signal.SIGTERM]))  # the next, taken by no handler
        thread.join(timeout=10)
    assert ended == [143], "the thread ended the run on the next signal"
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and err.splitlines()[-1] == f"error: {startup.STARTING}: {startup.RUN_AGAIN}"


# A process of the run's that ends its start-up: one child of its own, then `end_children` once told to; it prints
# the child's state as `end_children` returns (Z: ended, not yet reaped), then how it ended.
# Its child names itself with a ") " in its name: /proc/<pid>/stat gives the name in parentheses, unescaped. It holds
# 512 MiB written, which the kernel takes a while to free as it ends: a kill alone returns before the child has ended.
ENDS_ITS_CHILDREN = """
import subprocess, sys
from project.engine.startup import end_children
named = (
    "open('/proc/self/comm', 'w').write('worker) 1 2'); held = bytearray(b'x') * (512 << 20); print(flush=True);"
    "import time; time.sleep(60)"
)
child = subprocess.Popen([sys.executable, "-S", "-c", named], stdout=subprocess.PIPE)
child.stdout.readline()
print(child.pid, flush=True)
sys.stdin.readline()
end_children()
with open(f"/proc/{child.pid}/stat") as stat:
    print(stat.read().rsplit(")", 1)[1].split()[0], flush=True)
print(child.wait(), flush=True)
"""


def running(pid: int) -> bool:
    """Whether process `pid` runs (killed, it is gone or a zombie until its parent reaps it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_stopped_start_kills_its_own_children_and_no_other_process(tmp_path: Path):
    """A SIGTERM while starting ends the process's children (a DataLoader's workers, ranks it launched) with it,
    whatever their names hold, and waits until they have ended (before the line's maker tidies what they left); any
    other process, here a later one's child (a pid that sorts after its own), is not its to end."""
    script = tmp_path / "ends_its_children.py"
    script.write_text(ENDS_ITS_CHILDREN)
    stopping = subprocess.Popen(
        [python(), str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=environment(), cwd=REPO
    )
    assert stopping.stdout.readline().strip().isdigit(), "its child started"
    others = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!; wait"], stdout=subprocess.PIPE, text=True)
    try:
        others_child = int(others.stdout.readline())
        stopping.stdin.write("\n")
        stopping.stdin.flush()
        assert stopping.stdout.readline().strip() == "Z", "its own child had ended as end_children returned"
        assert stopping.stdout.readline().strip() == str(-signal.SIGKILL), "its own child was killed"
        assert stopping.wait(timeout=30) == 0
        assert running(others_child), "the other process's child lives on"
    finally:
        stopping.kill()
        others.kill()
        subprocess.run(["pkill", "-KILL", "-P", str(others.pid)])
        others.wait()


def test_the_thread_acts_on_a_sigterm_after_other_signals(armed, monkeypatch, capsys):
    """Python's C handler writes every handled signal to the wake-up fd (a SIGINT too): the thread reads past them."""
    monkeypatch.setattr(startup, "HANDLER_WAIT", 0.0)
    with thread_reading() as (write_end, thread, ended):
        os.write(write_end, bytes([signal.SIGINT]))
        thread.join(timeout=0.3)
        assert thread.is_alive(), "the thread reads on"
        os.write(write_end, bytes([signal.SIGTERM]))
        thread.join(timeout=10)
    assert ended == [143]


# A started process whose signal thread is inside its wait (reading nothing) while signals keep coming: the pipe of
# Python's wake-up fd fills, and one more signal finds it full.
FILLS_THE_WAKE_UP_PIPE = """
import fcntl, os, signal, struct, termios, threading
from project.engine import startup
pipes = []
waiting = threading.Event()
startup.read_signals = lambda pipe: (pipes.append(pipe), waiting.wait())
signal.signal(signal.SIGUSR1, lambda number, frame: None)
startup.arm()
while not pipes:
    pass
def unread():
    return struct.unpack("i", fcntl.ioctl(pipes[0], termios.FIONREAD, bytes(4)))[0]
while unread() < fcntl.fcntl(pipes[0], fcntl.F_GETPIPE_SZ):
    os.kill(os.getpid(), signal.SIGUSR1)
for _ in range(3):
    os.kill(os.getpid(), signal.SIGUSR1)
print("full", flush=True)
"""


def test_signals_that_fill_the_wake_up_pipe_print_nothing(tmp_path: Path):
    """While the thread waits for the handler it reads nothing, and a burst of signals (Ctrl-C held down, a launcher's
    SIGUSR1s) may fill the pipe meanwhile. The bytes it cannot take are dropped: the thread is about to act on the
    SIGTERM that started its wait. They leave no warning in the run's output, whose last line is its error line."""
    script = tmp_path / "fills_the_wake_up_pipe.py"
    script.write_text(FILLS_THE_WAKE_UP_PIPE)
    ran = subprocess.run(
        [python(), str(script)], capture_output=True, text=True, env=environment(), cwd=REPO, timeout=60
    )
    assert ran.returncode == 0 and ran.stdout == "full\n", ran.stderr
    assert ran.stderr == ""


def test_a_process_that_ends_while_the_children_are_sought_stops_no_search(monkeypatch):
    """`/proc` lists a process that is gone by the time its stat is read: the search goes on to the others."""
    me = os.readlink("/proc/self")
    names = ["self", "999999999", "555", "4242"]  # 555 ended between its stat's open and read: it reads empty
    entries = [SimpleNamespace(name=name) for name in names]
    stats = {"/proc/555/stat": "", "/proc/4242/stat": f"4242 (sleep) S {me} 1 1"}

    def opened(path: str) -> io.StringIO:
        if path not in stats:
            raise FileNotFoundError(path)
        return io.StringIO(stats[path])

    killed = []
    monkeypatch.setattr(startup.os, "scandir", lambda path: iter(entries))
    monkeypatch.setattr(startup, "open", opened, raising=False)
    monkeypatch.setattr(startup.os, "kill", lambda pid, number: killed.append((pid, number)))
    startup.end_children()
    assert killed == [(4242, signal.SIGKILL)]


def test_arming_from_a_thread_other_than_the_main_one_leaves_sigterm_as_it_was(monkeypatch):
    """Only the main thread may set a signal's handler (elsewhere `signal.signal` raises): from another thread `arm`
    does nothing, rather than fail or take the process for armed with no handler set."""
    state = startup.StartupStop()
    monkeypatch.setattr(startup, "STARTUP", state)
    monkeypatch.setattr(startup.signal, "getsignal", lambda number: signal.SIG_DFL)
    handlers = []
    monkeypatch.setattr(startup.signal, "signal", lambda number, handler: handlers.append(handler))
    returned = []
    arming = threading.Thread(target=lambda: returned.append(startup.arm()))
    arming.start()
    arming.join()
    assert returned == [None], "arm returned, raising nothing"
    assert handlers == [] and not state.armed and state.reader is None
    state.reader = object()  # taken as started: the main thread's call below starts no thread
    startup.arm()
    assert handlers == [startup.on_sigterm] and state.armed, "the same call from the main thread arms"


@pytest.mark.parametrize(
    ("command", "training"),
    [
        (["python", "-m", "project.train", "trainer=ddp"], True),
        (["python", "-mproject.train", "trainer=ddp"], True),
        (["python", "-um", "project.train"], True),
        (["python", "-u", "-X", "importtime", "-Wignore", "-m", "project.train"], True),
        (["python", "-Xfrozen_modules=off", "-m", "project.train"], True),  # an `m` inside a glued value
        (["/usr/bin/python3", "project/train.py", "logger=none"], True),
        (["python", "-B", "--", "project/train.py"], True),
        (["python", "-m", "project.evaluate", "ckpt_path=x"], False),
        (["python", "-mproject.evaluate", "ckpt_path=x"], False),
        (["python", "-m", "pytest", "project.train"], False),
        (["python", "-m", "pytest", "project/train.py"], False),
        (["python", "-c", "import project", "-m", "project.train"], False),
        (["python", "-c", "project.train"], False),  # code that names the module runs no module
        (["python", "-X", "-m", "project/train.py"], True),  # -X takes the next argument, "-m", as its value
        (["python", "-c", "from multiprocessing.spawn import spawn_main", "--multiprocessing-fork"], False),
        (["python", "--check-hash-based-pycs", "always", "-m", "project.train"], True),  # the one long option's value
        (["python", "--check-hash-based-pycs", "never", "project/train.py"], True),
        (["python", "--", "-mproject.train"], False),  # after `--`, a script's name, whatever it starts with
        (["python", "-", "project/train.py"], False),  # `-`: the program is stdin, the rest its arguments
        (["python", "scripts/train.py"], False),  # a train.py of the user's own, in another folder
        (["python", "-u"], False),  # the prompt, after an option
    ],
)
def test_only_a_training_launch_is_armed_as_the_package_is_imported(monkeypatch, command, training):
    monkeypatch.setattr(sys, "orig_argv", command)
    assert startup.launched_as_training() is training
