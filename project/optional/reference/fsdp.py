"""Fully sharded data parallel (FSDP2), one process per device, started by torchrun:

    torchrun --nproc_per_node=2 -m project.optional.reference.fsdp trainer=fsdp [overrides]

Compared with `ddp`: instead of wrapping the network in DDP, `shard` it with `fully_shard`, each layer of the classes
trainer=fsdp names and then the whole network, before the optimizer is built, so that each rank holds a 1/N share
of every weight, gradient and optimizer state (a forward all-gathers a layer's weights just before it runs; backward
reduce-scatters its gradients, averaged as DDP averages them). `ShardedTrainer` gathers the full state dicts from
the shards for the checkpoint and the final weights, and has every rank evaluate: each forward needs all of them.
"""

from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard

from project.engine.errors import UserError, exit_on_user_error, run_hydra_app
from project.engine.history import TrainingHistory
from project.engine.trusted_targets import job_whitelist
from project.engine.upstream import hydra_main
from project.optional.fsdp.strategy import mixed_precision_policy, shard_units, units_read_where_called
from project.optional.fsdp.units import UnitChoice
from project.optional.reference.environment import joined_process_group, require_environment
from project.optional.reference.loop import Trainer, build, fit_and_report

# Full (unsharded) tensors, on the CPU, on rank 0 alone: what the one file rank 0 writes needs.
FULL_ON_RANK_0 = StateDictOptions(full_state_dict=True, cpu_offload=True)


def shard(network: nn.Module, cfg: DictConfig, mesh: DeviceMesh) -> None:
    """The Lightning path's sharding of the units (`shard_units` of trainer=fsdp's strategy), with the network as the
    one root."""
    strategy = OmegaConf.select(cfg, "trainer.strategy")
    if not isinstance(strategy, DictConfig) or "min_unit_params" not in strategy:
        raise UserError(
            "project.optional.reference.fsdp shards the units trainer=fsdp chooses: run it with trainer=fsdp"
        )
    units = UnitChoice.from_config(strategy.layer_classes, strategy.min_unit_params)
    policy = mixed_precision_policy(str(cfg.trainer.precision))
    shard_units(network, units, mesh, policy, roots=set())
    fully_shard(network, mesh=mesh, mp_policy=policy)


class ShardedTrainer(Trainer):
    """The loop's Trainer, its state dicts gathered from (and loaded into) the ranks' shards."""

    every_rank_evaluates = True

    def network_state(self) -> dict[str, Tensor]:
        return get_model_state_dict(self.model, options=FULL_ON_RANK_0)

    def optimizer_state(self) -> dict:
        return get_optimizer_state_dict(self.model, self.optimizer, options=FULL_ON_RANK_0)

    def load_states(self, network: dict[str, Tensor], optimizer: dict) -> None:
        full = StateDictOptions(full_state_dict=True)  # every rank read the whole file and keeps its shard
        set_state_dict(self.model, self.optimizer, model_state_dict=network, optim_state_dict=optimizer, options=full)


def train_process(cfg: DictConfig, rank: int, local_rank: int, world_size: int) -> None:
    with joined_process_group(rank, local_rank, world_size) as device:
        mesh = init_device_mesh(device.type, (world_size,))
        datamodule, network, optimizer, schedule = build(cfg, device, shard=lambda net: shard(net, cfg, mesh))
        sampler = datamodule.train_sampler_class(datamodule.train_set, cfg.seed, world_size, rank)
        train_loader = datamodule.loader(datamodule.train_set, sampler, train=True)
        trainer = ShardedTrainer(network, optimizer, schedule, device, TrainingHistory(rank, world_size))
        with units_read_where_called():
            fit_and_report(cfg, trainer, datamodule, train_loader, is_main=rank == 0)


@hydra_main("../../../conf", "train", job_whitelist)
@exit_on_user_error
def main(cfg: DictConfig) -> None:
    env = require_environment(
        "project.optional.reference.fsdp",
        ("RANK", "LOCAL_RANK", "WORLD_SIZE"),
        "torchrun --nproc_per_node=N -m project.optional.reference.fsdp trainer=fsdp [overrides]",
    )
    train_process(cfg, int(env["RANK"]), int(env["LOCAL_RANK"]), int(env["WORLD_SIZE"]))


if __name__ == "__main__":
    run_hydra_app(main)
