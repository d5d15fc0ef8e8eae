"""Every rank of a distributed run must have composed the same config; this proves it once the ranks meet."""

import torch.distributed as dist

from project.errors import UserError


def check_same_config_on_every_rank(config: dict | None) -> None:
    """Stops a distributed run, in one line on every rank, when its ranks did not compose the same config.

    Each torchrun worker, Slurm task and DDP child composes the config itself; a different config dir, config
    name or override on one rank would otherwise train different things silently under one run. Called by every
    rank once the process group is up (`HydraDDPStrategy.setup_environment`).
    """
    configs: list[dict | None] = [None] * dist.get_world_size()
    dist.all_gather_object(configs, config)
    for rank, other in enumerate(configs):
        keys = differing_keys(configs[0], other)
        if keys:
            raise UserError(
                f"rank {rank} composed a different config than rank 0 (at {', '.join(keys[:5])}): start every "
                "rank with the same --config-dir, --config-name and overrides"
            )


def differing_keys(first: object, second: object, prefix: str = "") -> list[str]:
    """The dotted keys at which two plain configs (nested dicts and lists) differ."""
    if isinstance(first, dict) and isinstance(second, dict):
        keys = sorted(set(first) | set(second), key=str)
        return [key for k in keys for key in differing_keys(first.get(k), second.get(k), f"{prefix}{k}.")]
    return [] if first == second else [prefix.rstrip(".") or "<root>"]
