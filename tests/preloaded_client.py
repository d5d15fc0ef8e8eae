"""`python -m <module> <args>` typed in a shell script, run by the preloaded Python of the test running the script.

tests/test_readme_commands.py runs the README's lines in bash as a user types them. Its shell defines `python` as
a function that hands `python -m project.<entry> ...` to this client (started with `-S`: the standard library
only, no import of the libraries the run needs), which asks the test's preloaded Python (tests/preloaded_python.py)
to fork the run with this process's working directory, environment and standard output and error (the pipes the
test reads), waits for it, passes on SIGINT and SIGTERM, and ends as the run ended.

Usage: python -S tests/preloaded_client.py SOCKET MODULE [ARG ...]
"""

import json
import os
import signal
import socket
import sys


def main(socket_path: str, module: str, args: list[str]) -> None:
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.connect(socket_path)
    request = {
        "module": module,
        "args": args,
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        # The run opens the same pipes (or terminal) this process writes to.
        "stdout": f"/proc/{os.getpid()}/fd/1",
        "stderr": f"/proc/{os.getpid()}/fd/2",
        "new_session": False,
        "sigint_ignored": signal.getsignal(signal.SIGINT) == signal.SIG_IGN,
    }
    connection.sendall((json.dumps(request) + "\n").encode())
    replies = connection.makefile("r")
    pid = json.loads(replies.readline())["pid"]
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, lambda received, _frame: os.kill(pid, received))
    line = replies.readline()
    if not line:
        sys.exit(f"the preloaded Python ended while process {pid} ran")
    returncode = json.loads(line)["returncode"]
    if returncode < 0:  # killed by a signal: so is this process, for the shell to report it alike
        signal.signal(-returncode, signal.SIG_DFL)
        os.kill(os.getpid(), -returncode)
    sys.exit(returncode)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
