"""Holds a fresh interpreter inside its `import torch`, for good: how a test signals a run while Python imports the
libraries, a moment of seconds that no test could otherwise aim at (tests/test_faults.py).

With this directory on PYTHONPATH, Python imports this module as it starts, before the program runs. Where
HELD_IMPORT_MARKER names a file and the process is the local rank HELD_IMPORT_RANK (LOCAL_RANK, "0" where unset: the
process the user started), its first `import torch` writes its pid to that file and then waits there; the test
signals it and checks how the run ends. Every other process imports as usual.
"""

import os
import sys
import time

MARKER, RANK = os.environ.get("HELD_IMPORT_MARKER"), os.environ.get("HELD_IMPORT_RANK", "0")


class HeldTorchImport:
    """The first finder Python asks for a module: for torch it holds the process, for every module it finds nothing,
    leaving the import to the finders after it."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "torch":
            with open(MARKER, "w") as marker:
                marker.write(str(os.getpid()))
            while True:
                time.sleep(1)


if MARKER and os.environ.get("LOCAL_RANK", "0") == RANK:
    sys.meta_path.insert(0, HeldTorchImport())
