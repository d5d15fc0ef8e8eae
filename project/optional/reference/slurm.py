"""The Slurm tutorial's multi-node model: one task per node, each spawning one process per device.

    srun --nodes=2 --ntasks-per-node=1 python -m project.optional.reference.slurm trainer.devices=<per node> [overrides]

with MASTER_ADDR (the first node) and MASTER_PORT exported by the batch script (scripts/slurm/). Compared with
`ddp`: Slurm, not torchrun, starts one process per node; that process reads its node index (`SLURM_PROCID`) and
the node count (`SLURM_NTASKS`) and forks `trainer.devices` children with `torch.multiprocessing.spawn`; child
`local` gets the global rank `local + node * per_node`. From there on each child is a `ddp` rank.
"""

import os

import torch
import torch.multiprocessing as mp
from omegaconf import DictConfig, OmegaConf

from project.engine.errors import UserError, exit_on_user_error, run_hydra_app
from project.engine.trusted_targets import job_whitelist
from project.engine.upstream import hydra_main
from project.optional.reference.ddp import train_process
from project.optional.reference.environment import require_environment


def devices_per_node(devices: int | str) -> int:
    """`trainer.devices` as a process count: "auto" is every GPU here (or 1 without GPUs)."""
    if devices == "auto":
        return max(1, torch.cuda.device_count())
    if not isinstance(devices, int) or devices < 1:
        raise UserError(
            f"project.optional.reference.slurm needs trainer.devices as a number of processes per node, got {devices}"
        )
    return devices


def node_child(local_rank: int, cfg: DictConfig, node: int, per_node: int, world_size: int) -> None:
    """One spawned process: threads shared out between the node's children, then a ddp rank."""
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // per_node))
    train_process(cfg, rank=local_rank + node * per_node, local_rank=local_rank, world_size=world_size)


@hydra_main("../../../conf", "train", job_whitelist)
@exit_on_user_error
def main(cfg: DictConfig) -> None:
    env = require_environment(
        "project.optional.reference.slurm",
        ("SLURM_PROCID", "MASTER_ADDR", "MASTER_PORT"),
        "srun --nodes=N --ntasks-per-node=1 python -m project.optional.reference.slurm [overrides] "
        "with MASTER_ADDR and MASTER_PORT exported (see scripts/slurm/reference.sbatch)",
    )
    nodes = int(os.environ.get("SLURM_NTASKS", os.environ.get("SLURM_NPROCS", "1")))
    node = int(env["SLURM_PROCID"])
    per_node = devices_per_node(cfg.trainer.devices)
    # The children get a plain config: Hydra's ${hydra:...} values only resolve in this process.
    plain_cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    mp.spawn(node_child, args=(plain_cfg, node, per_node, per_node * nodes), nprocs=per_node, join=True)


if __name__ == "__main__":
    run_hydra_app(main)
