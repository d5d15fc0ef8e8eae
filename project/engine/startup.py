"""A SIGTERM while a training run starts (imports, config, DDP's rendezvous, data) ends it in one `error:` line, exit
143, with no process left: Lightning's handler comes only with the first epoch. Standard library only (armed before
the libraries are imported)."""

import contextlib
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
# How long SIGKILLed children may take to end (one stuck in the kernel, on a hung network disk) before the line.
CHILDREN_END_WAIT = 10.0
RUN_AGAIN = "run the same command again"
STARTING = "stopped by SIGTERM while starting: nothing was trained and no checkpoint written"
# Python's one-letter options that take a value: in the next argument, or glued to the option (`-mproject.train`).
VALUE_OPTIONS = "cmWX"


def starting_line() -> str:
    return f"{STARTING}: {RUN_AGAIN}"


class StartupStop:
    """What the handler, its thread and the main thread share, changed under a re-entrant lock (the handler may run
    while the main thread holds it) so that one signal is acted on once."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.armed = False
        self.pending = False
        self.stopping = False
        self.handled = 0  # the handler's calls, Lightning's chained ones included
        self.line: Callable[[], str] = starting_line
        self.reader: threading.Thread | None = None

    def stop(self) -> None:
        """End the children, then the process in its line, if a SIGTERM came that is this module's (noted, or armed
        with no other handler, Lightning's, in place)."""
        with self.lock:
            ours = self.pending or (self.armed and signal.getsignal(signal.SIGTERM) is on_sigterm)
            if self.stopping or not ours:
                return
            self.stopping = True
            make_line = self.line  # the main thread may go on and change it
        # Else each read below waits the busy main thread's whole switch interval (5 ms) for the interpreter.
        sys.setswitchinterval(1e-5)
        end_children()
        line = f"error: {make_line()}"
        if started_by_rank_zero():
            to_log_file(line, logging.ERROR)
        else:
            report(line, sys.stderr, logging.ERROR)
        os._exit(STOPPED_STATUS)

    def settle(self) -> None:
        """Act on a noted SIGTERM before the line changes; where the thread is stopping already, wait for it to end
        the process."""
        if self.pending or self.stopping:
            self.stop()
            threading.Event().wait()  # the thread that claimed the stop ends the process

    def take(self, line: Callable[[], str]) -> None:
        """From now, a SIGTERM this module handles ends the process in `line()`."""
        self.settle()
        with self.lock:
            self.armed, self.line = True, line


STARTUP = StartupStop()


def end_children() -> None:
    """SIGKILL this process's children, as Linux /proc lists them, and wait until they have ended: what they were
    writing stays as they left it, for the line's maker to tidy. They are left unreaped, for their launcher."""
    me = os.readlink("/proc/self")  # this pid as its children's /proc/<pid>/stat names it
    killed = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as file:
                parent = file.read().rsplit(")", 1)[1].split()[1]
            if parent == me:
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
        except (OSError, IndexError):  # it ended meanwhile
            continue
    deadline = time.monotonic() + CHILDREN_END_WAIT
    for pid in killed:
        with contextlib.suppress(ChildProcessError):  # reaped already
            while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is None:
                if time.monotonic() > deadline:
                    return
                time.sleep(0.01)


def on_sigterm(signum: int, frame: object) -> None:
    """While armed, note the signal for the thread (a print here could break one it interrupted); once disarmed, do
    SIGTERM's default; chained by Lightning's handler, nothing."""
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
    """Act on a SIGTERM whose handler has not run within `HANDLER_WAIT`: the main thread is stuck in C++ (torch's
    rendezvous, an import)."""
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
    """Until `disarm`, a SIGTERM ends this process in the starting line, ending in `hint`; another program's handler
    (submitit's) is left in place."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, on_sigterm):
        return
    STARTUP.take(lambda: f"{STARTING}: {hint}")
    signal.signal(signal.SIGTERM, on_sigterm)
    if STARTUP.reader is None:
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)  # a full pipe must not block the C handler that writes to it
        signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        STARTUP.reader = threading.Thread(target=read_signals, args=(read_end,), daemon=True, name="startup-sigterm")
        STARTUP.reader.start()


def stop_on_sigterm(line: Callable[[], str]) -> None:
    """Until `disarm`, a SIGTERM that no handler of Lightning's takes ends the process in `line()`, made once its
    children have ended; only in a process a training launch armed."""
    if STARTUP.reader is not None:  # the handler stays: this one, or Lightning's, which chains it back
        STARTUP.take(line)


def disarm() -> None:
    """SIGTERM does its default again (the job has ended, or this process launches a sweep's jobs); one noted before
    is acted on here."""
    with STARTUP.lock:
        STARTUP.armed = False
    STARTUP.settle()
    with STARTUP.lock:
        STARTUP.line = starting_line  # nothing of the job it named is kept


def program_of(arguments: list[str]) -> tuple[str, str]:
    """What `python <arguments>` runs, read as Python reads its options: `("module", name)`, `("script", path)`, or
    `("", "")` for `-c`, stdin and the prompt."""
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
    """Whether this Python was started to run `project.train` (as a module or a script), asked before it runs."""
    kind, name = program_of(sys.orig_argv[1:])
    if kind == "script":
        return os.path.abspath(name).split(os.sep)[-2:] == ["project", "train.py"]
    return kind == "module" and name == "project.train"
