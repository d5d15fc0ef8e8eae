"""Sharded checkpoints (`trainer=fsdp`): their layout, their atomic replacement, and one as a plain file.

A sharded checkpoint is a directory that `torch.distributed.checkpoint` (DCP) writes, every rank its own shard at
once, with Lightning's layout (`ModelParallelStrategy`):

    checkpoints/last.ckpt -> .last.ckpt.<random>/     a symbolic link to the version in place
        __0_0.distcp, __1_0.distcp, ...               the weights and optimizer state, one file per rank
        .metadata                                     DCP's index of the shards
        meta.pt                                       everything else: step, loops, data position, run config

A directory cannot be renamed over another, so each save goes to a new hidden version directory, and only once every
rank has finished does rank 0 point the link at it (`os.replace` of a link is atomic) and delete the previous
version: a kill at any moment leaves `last.ckpt` pointing at a whole checkpoint. DCP resumes it on another number of
processes too (each rank reads the slices of the shards it now holds).

The engine reads such a checkpoint on one process (`project.engine.checkpoints.plain_checkpoint`: how evaluate and
predict load it, and how a run under another strategy resumes it); `python -m project.optional.fsdp.checkpoints
<checkpoint dir> <file.ckpt>` writes what it reads as one plain file, which `torch.load` and every strategy read. The
other way, `trainer=fsdp` resumes a single-file checkpoint too, each rank keeping its shard of it
(`optimizer_state_by_name`).
"""

import argparse
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from project.engine.checkpoints import METADATA_FILE, is_sharded, plain_checkpoint


def versions(path: Path) -> list[Path]:
    """The version directories written for the checkpoint `path`, whole or not."""
    return [version for version in path.parent.glob(f".{path.name}.*") if version.is_dir()]


def new_version_dir(path: Path) -> str:
    """An empty directory beside `path` for the next version (on rank 0), after deleting the versions that are not
    in place: left by a save that was killed before it finished."""
    path.parent.mkdir(parents=True, exist_ok=True)
    in_place = path.resolve() if path.is_symlink() else None
    for version in versions(path):
        if version.resolve() != in_place:
            shutil.rmtree(version, ignore_errors=True)
    version = tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent)
    os.chmod(version, 0o755)  # mkdtemp's 0o700 would hide the checkpoint from the others sharing the run dir
    return version


def publish(version: Path, path: Path) -> None:
    """Point `path` at the written `version`, in one atomic step, then delete the version it pointed at."""
    previous = path.resolve() if path.is_symlink() else None
    link = path.with_name(f"{version.name}.link")
    os.symlink(version.name, link)
    if path.exists() and not path.is_symlink():  # a file or directory of another layout: nothing atomic to keep
        remove(path)
    os.replace(link, path)
    if previous is not None and previous != version.resolve():
        shutil.rmtree(previous, ignore_errors=True)


def remove(path: Path) -> None:
    """Delete a checkpoint of any layout: the link and the version it points at, a directory, or a file."""
    if path.is_symlink():
        version = path.resolve()
        path.unlink()
        shutil.rmtree(version, ignore_errors=True)
    elif path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def optimizer_state_by_name(state: dict[str, Any], optimizer: torch.optim.Optimizer, module: nn.Module) -> dict:
    """The reverse of `optimizer_state_by_index`, for `optimizer`, built on `module`'s parameters: parameter number i
    of `state` is the i-th parameter of `optimizer`'s groups, named as `module` names it."""
    name_of = {id(parameter): name for name, parameter in module.named_parameters()}
    names = [name_of[id(parameter)] for group in optimizer.param_groups for parameter in group["params"]]
    groups = [group | {"params": [names[index] for index in group["params"]]} for group in state["param_groups"]]
    return {"state": {names[index]: value for index, value in state["state"].items()}, "param_groups": groups}


def main() -> None:
    parser = argparse.ArgumentParser(description="Write a sharded (trainer=fsdp) checkpoint as one plain file.")
    parser.add_argument("checkpoint", type=Path, help="the sharded checkpoint, e.g. <run dir>/checkpoints/last.ckpt")
    parser.add_argument("output", type=Path, help="the file to write, e.g. last-plain.ckpt")
    arguments = parser.parse_args()
    if not is_sharded(arguments.checkpoint):
        parser.error(f"{arguments.checkpoint} is not a sharded checkpoint (a directory with {METADATA_FILE})")
    torch.save(plain_checkpoint(arguments.checkpoint), arguments.output)
    print(f"wrote {arguments.output}")


if __name__ == "__main__":
    main()
