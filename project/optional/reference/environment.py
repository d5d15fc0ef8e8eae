"""What the multi-process reference scripts take from their launcher (torchrun, srun): its variables, checked first,
and the process group its ranks join."""

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist

from project.engine.errors import UserError
from project.optional.reference.loop import pick_device


def require_environment(script: str, variables: tuple[str, ...], how_to_launch: str) -> dict[str, str]:
    """The launcher's variables, or a `UserError` saying how `script` must be started."""
    missing = [name for name in variables if name not in os.environ]
    if missing:
        raise UserError(f"{script} needs {', '.join(missing)} from its launcher: start it as `{how_to_launch}`")
    return {name: os.environ[name] for name in variables}


@contextmanager
def joined_process_group(rank: int, local_rank: int, world_size: int) -> Iterator[torch.device]:
    """This rank's device, with the process group joined for the block (nccl on GPUs, gloo on CPUs; MASTER_ADDR and
    MASTER_PORT come from the environment, which torchrun or the Slurm script sets) and left after it."""
    device = pick_device(local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world_size)
    try:
        yield device
    finally:
        dist.destroy_process_group()
