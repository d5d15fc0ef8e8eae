"""A SIGTERM while a training run starts ends it in one line, exit 143, with no process left.

A run spends its first seconds (minutes, on a busy cluster) starting: Python imports torch and Lightning, Hydra
composes the config, DDP starts its ranks and they meet, the data is set up, a checkpoint is read. Lightning registers
its SIGTERM handler only after all that, so a SIGTERM then (a `kill`, Slurm's `scancel`, a time limit) would end the
run by Python's default: status 143 and not a word. From the first line `python -m project.train` runs
(`project/__init__.py`), and again as each job of a sweep starts (`project.engine.job.StartupStops`), until the first
training epoch starts, a SIGTERM ends the process here instead: rank 0, and every rank a launcher (srun, torchrun)
started, prints `error: stopped by SIGTERM while starting...`; the ranks rank 0 started itself end silently, as they
do for every stop it reports; Lightning's DDP children die with rank 0 (`project.engine.ddp`).

Python runs a signal handler only between bytecodes of its main thread, and the main thread spends seconds inside
torch's C++ rendezvous waiting for the other ranks (for good, if a signal to the whole group has ended them). So the
signal's number is also written to a pipe the moment it arrives (`signal.set_wakeup_fd`), where a thread reads it
and acts.

From the first epoch on, Lightning's handler is in charge while it trains, validates or tests; it calls this one
too, which then does nothing. Between those (after `fit`, Lightning restores this handler), until the job ends, a
SIGTERM ends the job in a line naming the checkpoint to resume from (`stop_on_sigterm`, `project.engine.job`). A
process whose ranks are processes it only waits for (ddp_spawn's) has no Lightning handler: there a SIGTERM ends
those processes where they stand, with such a line. Either way the process's children are ended before it exits,
whatever started them. After the job (between a sweep's jobs), SIGTERM does what it does by default.

Standard library only: it is armed before the libraries are imported.
"""

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

from project.engine.run_log import report, started_by_rank_zero, to_log_file

STOPPED_STATUS = 128 + signal.SIGTERM
# How long the thread gives the main thread's handler to run before it takes the main thread for stuck in C.
HANDLER_WAIT = 0.2
RUN_AGAIN = "run the same command again"
STARTING = "stopped by SIGTERM while starting: nothing was trained and no checkpoint written"


def starting_line() -> str:
    return f"{STARTING}: {RUN_AGAIN}"


class StartupStop:
    """The state this module's handler, its thread and the main thread's changes share: whether a SIGTERM now is
    this module's to act on, whether one came that is not acted on yet, and the line it ends the process with (made
    when the signal comes). Changed under a lock (one the handler may take again, should the signal come while the
    main thread holds it), so that one signal is acted on once."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.armed = False
        self.pending = False
        self.stopping = False
        self.handled = 0  # the handler's calls so far, Lightning's chained ones included
        self.line: Callable[[], str] = starting_line
        self.reader: threading.Thread | None = None

    def stop(self) -> None:
        """End the process as the module docstring says, if a SIGTERM came that is this module's to act on (the
        handler noted it, or it is armed and no other handler, Lightning's, has taken SIGTERM over); else nothing."""
        with self.lock:
            ours = self.pending or (self.armed and signal.getsignal(signal.SIGTERM) is on_sigterm)
            if self.stopping or not ours:
                return
            self.stopping = True
            make_line = self.line  # as it is now: the main thread may go on and change it
        # The main thread may be busy in Python meanwhile: without this, each of this thread's reads below would wait
        # for the main thread's whole switch interval (5 ms) to get the interpreter back, seconds in all.
        sys.setswitchinterval(1e-5)
        end_children()
        line = f"error: {make_line()}"
        if started_by_rank_zero():
            to_log_file(line, logging.ERROR)
        else:
            report(line, sys.stderr, logging.ERROR)
        os._exit(STOPPED_STATUS)

    def settle(self) -> None:
        """Act on a SIGTERM the handler noted and the thread has not acted on yet, before what the process is doing,
        and so the line, changes (`take`, `disarm`). Where the thread is acting on it already, wait for it to end the
        process: what the main thread would do next (write the run's results) must not come before the stop."""
        if self.pending or self.stopping:
            self.stop()
            threading.Event().wait()  # the thread that claimed the stop ends the process

    def take(self, line: Callable[[], str]) -> None:
        """From now, a SIGTERM this module handles ends the process in `line()` (one noted before, in its own)."""
        self.settle()
        with self.lock:
            self.armed, self.line = True, line


STARTUP = StartupStop()


def end_children() -> None:
    """SIGKILL this process's children (Linux /proc): ranks it started, their helpers, and a child forked a moment
    ago that has not yet asked to die with its parent (`project.engine.ddp`). A checkpoint is written whole or not at
    all (`project.engine.checkpoints`), so one being written is not lost: the last whole one stays."""
    me = os.readlink("/proc/self")  # the pid its children name as their parent, as /proc has it
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as file:
                parent = file.read().rsplit(")", 1)[1].split()[1]
            if parent == me:
                os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, IndexError):  # it ended meanwhile
            continue


def on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM's handler, run by the main thread between two steps of whatever it was doing, so it writes nothing (a
    print it interrupted would fail): while armed it notes the signal, for the thread to act on (or the next change
    of what the process is doing, should that come first: `StartupStop.settle`); called by itself once disarmed
    (after a job, between a sweep's jobs) it does what SIGTERM does by default; called by Lightning's handler,
    which chains it, nothing."""
    with STARTUP.lock:
        STARTUP.handled += 1
        if STARTUP.stopping or signal.getsignal(signal.SIGTERM) is not on_sigterm:
            return
        if STARTUP.armed:
            STARTUP.pending = True
            return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def read_signals(pipe: int) -> None:
    """The thread that acts on a SIGTERM while the main thread cannot (inside C++: torch's rendezvous, an import).

    Where the main thread runs Python, its handler runs within moments of the signal and decides (it notes one that
    is this module's; the thread then acts on the note); what the main thread does next may change what a signal
    would mean now (Lightning's handler put back after `fit`), so only where the handler has not run within
    `HANDLER_WAIT` is the signal taken by the state as it stands, which is then the state the signal found."""
    while True:
        handled = STARTUP.handled
        numbers = os.read(pipe, 64)
        if signal.SIGTERM not in numbers:
            continue
        deadline = time.monotonic() + HANDLER_WAIT
        while STARTUP.handled == handled and time.monotonic() < deadline:
            time.sleep(0.01)
        if STARTUP.handled == handled or STARTUP.pending:
            STARTUP.stop()


def arm(hint: str = RUN_AGAIN) -> None:
    """From now until `disarm`, a SIGTERM stops this process while it starts, its line ending in `hint` (how to start
    it again)."""
    watch_sigterm(lambda: f"{STARTING}: {hint}")


def stop_on_sigterm(line: Callable[[], str]) -> None:
    """From now until `disarm`, a SIGTERM that no handler of Lightning's takes ends this process's children (the
    ranks it waits for) and then the process, in `line()`: in a process a training launch armed, else nothing (a
    run a test or a benchmark builds in its own process)."""
    if STARTUP.reader is not None:  # the handler stays as it is: this one, or Lightning's, which chains it back
        STARTUP.take(line)


def watch_sigterm(line: Callable[[], str]) -> None:
    """Act on SIGTERM here, ending in `line()`. Only the main thread can install a signal handler; elsewhere this does
    nothing, and so it does where a handler of another program is installed (submitit's, in the jobs it starts)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, on_sigterm):
        return
    STARTUP.take(line)
    signal.signal(signal.SIGTERM, on_sigterm)
    if STARTUP.reader is None:
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)  # a full pipe must not block the C handler that writes to it
        signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        STARTUP.reader = threading.Thread(target=read_signals, args=(read_end,), daemon=True, name="startup-sigterm")
        STARTUP.reader.start()


def disarm() -> None:
    """The job has ended, or this process launches a sweep's jobs instead of training: a SIGTERM then does what it
    does by default. One that came before, and that the thread has not acted on yet, is acted on here."""
    with STARTUP.lock:
        STARTUP.armed = False
    STARTUP.settle()
    with STARTUP.lock:
        STARTUP.line = starting_line  # nothing of the job it named is kept


# Python's one-letter options that take a value: in the next argument, or glued to the option (`-mproject.train`).
VALUE_OPTIONS = "cmWX"


def program_of(arguments: list[str]) -> tuple[str, str]:
    """What `python <arguments>` runs, its options read as Python reads them: `("module", name)` for `-m name`
    (`-mname`, `-um name`, `-X importtime -m name` alike), `("script", path)`, or `("", "")` for `-c`, stdin and
    the prompt."""
    index = 0
    while index < len(arguments):
        argument = arguments[index]
        index += 1
        if argument == "--":  # the end of the options: the script follows
            break
        if not argument.startswith("-") or argument == "-":
            return ("script", argument) if argument != "-" else ("", "")
        if argument.startswith("--"):  # --help, --version; one takes a value
            index += argument == "--check-hash-based-pycs"
            continue
        for position, flag in enumerate(argument[1:], start=2):
            if flag in VALUE_OPTIONS:
                glued = argument[position:]
                value = glued or (arguments[index] if index < len(arguments) else "")
                index += not glued
                if flag in "cm":
                    return ("module", value) if flag == "m" else ("", "")
                break
    return ("script", arguments[index]) if index < len(arguments) else ("", "")


def launched_as_training() -> bool:
    """Whether this Python was started to run `project.train` (`python [options] -m project.train ...`, or
    `python [options] project/train.py ...`), as the package is imported, before that module runs."""
    kind, name = program_of(sys.orig_argv[1:])
    if kind == "script":
        return os.path.abspath(name).split(os.sep)[-2:] == ["project", "train.py"]
    return kind == "module" and name == "project.train"
