"""`python <args>` for the tests' launchers: forked by the tests' preloaded Python where it can be, else started.

tests/preloaded_bin/python runs this file (`-S`: the standard library only, no import of the libraries the run
needs) with its own arguments. Where they run a module (`-m ...`) or multiprocessing's spawned child, and the
environment names a preloaded Python (tests/preloaded_python.py), it hands the process over: this process's
working directory, environment and open descriptors (stdin, stdout, stderr, and the pipes multiprocessing passes
on; a process with more than one message carries starts afresh). It then stands in for the forked process: passes
on every signal it can catch, and ends as that process ended (a signal that killed it kills this process too).
Anything else replaces this process with the real interpreter.

Usage: python -S tests/preloaded_client.py ARG ...
"""

import json
import os
import signal
import sys

from preloaded_python import MAX_DESCRIPTORS, SOCKET_VARIABLE, forkable, send_request

# The signals a launcher or a user sends a process to stop or steer it; SIGKILL cannot be caught, which the server
# answers by killing the forked process once this one is gone.
PASSED_ON = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGCONT,
)


def open_descriptors() -> list[int]:
    """This process's open descriptors, as a program it started would inherit them."""
    listed = [int(name) for name in os.listdir("/proc/self/fd")]
    found = []
    for descriptor in listed:
        try:
            os.fstat(descriptor)
        except OSError:  # the listing's own, closed by now
            continue
        found.append(descriptor)
    return found


def main(python_args: list[str]) -> None:
    socket_path = os.environ.get(SOCKET_VARIABLE, "")
    target = forkable(python_args)
    descriptors = open_descriptors()
    # More descriptors than one message carries: a ddp_spawn worker inherits one per tensor its parent shares with it
    # (torch's shared memory), so the worker of a module with hundreds of weights and buffers starts afresh.
    if target is None or not os.path.exists(socket_path) or len(descriptors) > MAX_DESCRIPTORS:
        os.execv(sys.executable, [sys.executable, *python_args])
    request = {
        **target,
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        "fds": descriptors,
        "new_session": False,
        "affinity": sorted(os.sched_getaffinity(0)),  # a launcher's choice of cores for it (hydra/launcher=parallel)
        "stand_in": True,
        "sigint_ignored": signal.getsignal(signal.SIGINT) == signal.SIG_IGN,
    }
    connection = send_request(socket_path, request, descriptors)
    replies = connection.makefile("r")
    pid = json.loads(replies.readline())["pid"]
    for number in PASSED_ON:
        if signal.getsignal(number) != signal.SIG_IGN:
            signal.signal(number, lambda received, _frame: os.kill(pid, received))
    line = replies.readline()
    if not line:
        sys.exit(f"the preloaded Python ended while process {pid} ran")
    returncode = json.loads(line)["returncode"]
    if returncode < 0:  # killed by a signal: so is this process, for its parent to see alike
        if -returncode != signal.SIGKILL:  # (which has no handler to reset)
            signal.signal(-returncode, signal.SIG_DFL)
        os.kill(os.getpid(), -returncode)
    sys.exit(returncode)


if __name__ == "__main__":
    main(sys.argv[1:])
