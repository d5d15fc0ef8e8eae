"""DistributedDataParallel, one process per device, started by torchrun:

    torchrun --nproc_per_node=2 -m project.optional.reference.ddp [overrides]

Compared with `single`: join the process group (gloo on CPU, nccl on GPU), give each rank its share of every
epoch with a `DistributedSampler` (the data module's `SeededOrder`, one that can also resume part-way
through an epoch; reshuffled by `set_epoch`), wrap the network in DDP (which averages gradients
across ranks in `backward`), let rank 0 alone evaluate and write, and leave the process group at the end. (The
epoch's loss and accuracy need no extra line: the shared metric sums them over ranks when they are computed.)
"""

from omegaconf import DictConfig
from torch.nn.parallel import DistributedDataParallel

from project.engine.errors import exit_on_user_error, run_hydra_app
from project.engine.history import TrainingHistory
from project.engine.trusted_targets import job_whitelist
from project.engine.upstream import hydra_main
from project.optional.reference.environment import joined_process_group, require_environment
from project.optional.reference.loop import Trainer, build, fit_and_report


def train_process(cfg: DictConfig, rank: int, local_rank: int, world_size: int) -> None:
    """One rank's work; `slurm` runs the same function in the processes it spawns."""
    with joined_process_group(rank, local_rank, world_size) as device:
        datamodule, network, optimizer, schedule = build(cfg, device)
        model = DistributedDataParallel(network, device_ids=[local_rank] if device.type == "cuda" else None)
        sampler = datamodule.train_sampler_class(datamodule.train_set, cfg.seed, world_size, rank)
        train_loader = datamodule.loader(datamodule.train_set, sampler, train=True)
        trainer = Trainer(model, optimizer, schedule, device, TrainingHistory(rank, world_size))
        fit_and_report(cfg, trainer, datamodule, train_loader, is_main=rank == 0)


@hydra_main("../../../conf", "train", job_whitelist)
@exit_on_user_error
def main(cfg: DictConfig) -> None:
    env = require_environment(
        "project.optional.reference.ddp",
        ("RANK", "LOCAL_RANK", "WORLD_SIZE"),
        "torchrun --nproc_per_node=N -m project.optional.reference.ddp [overrides]",
    )
    train_process(cfg, int(env["RANK"]), int(env["LOCAL_RANK"]), int(env["WORLD_SIZE"]))


if __name__ == "__main__":
    run_hydra_app(main)
