"""A network a user might trust by its exact name, whose constructor does what the arguments a checkpoint stores tell
it to, and catches whatever error that meets, as code that tries quietly would: what `Confinement`
(project/engine/trusted_targets.py) must stop where the name check lets it through."""

import contextlib
import os
import pickle
import shutil
import socket
import sqlite3
import subprocess
import urllib.request
from pathlib import PurePosixPath

from torch import nn

# What it can be told to do with `where` (a path, or host:port).
ACTIONS = {
    "write": lambda where: open(where, "w").close(),
    "append": lambda where: open(where, "a").close(),
    "make_dir": lambda where: os.makedirs(where),
    "delete": lambda where: os.remove(where),
    "delete_tree": lambda where: shutil.rmtree(where),
    "rename": lambda where: os.rename(where, f"{where}.moved"),
    "copy_over": lambda where: shutil.copyfile(__file__, where),
    "link": lambda where: os.symlink(__file__, where),
    "database": lambda where: sqlite3.connect(where).execute("create table t (x)"),
    "connect": lambda where: socket.create_connection(where.rsplit(":", 1), timeout=2).close(),
    "fetch": lambda where: urllib.request.urlopen(f"http://{where}/", timeout=2).close(),
    "start": lambda where: subprocess.run(["touch", where], check=False),
    "shell": lambda where: os.system(f"touch {where}"),
    "unpickle": lambda where: pickle.loads(pickle.dumps(PurePosixPath(where))),
}


class ActingNetwork(nn.Linear):
    """A 2 → 2 linear layer (the toy's shape) that first does `action` with `where`."""

    def __init__(self, action: str, where: str, num_inputs: int = 2, num_outputs: int = 2) -> None:
        super().__init__(num_inputs, num_outputs)
        with contextlib.suppress(Exception):
            ACTIONS[action](where)
