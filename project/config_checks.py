"""Checks of config values that would otherwise fail deep inside Lightning with an unclear message."""

import os

from lightning.pytorch.strategies import StrategyRegistry
from omegaconf import DictConfig

import project.strategies  # noqa: F401  (registers strategy="dp")
from project.errors import UserError


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_config(cfg: DictConfig) -> None:
    """Raise `UserError` naming the key, the bad value and what is allowed."""
    if not _is_int(cfg.seed):
        raise UserError(f"seed must be an integer, got {cfg.seed!r}")
    max_epochs = cfg.trainer.get("max_epochs")
    if not (_is_int(max_epochs) and max_epochs >= -1):
        raise UserError(f"trainer.max_epochs must be an integer >= 1 (or -1 for no limit), got {max_epochs!r}")
    devices = cfg.trainer.get("devices")
    if _is_int(devices) and devices < 1 and devices != -1:
        raise UserError(f"trainer.devices must be a positive number of devices (or -1 for all), got {devices!r}")
    if cfg.optimized_mode not in ("min", "max"):
        raise UserError(f"optimized_mode must be min or max, got {cfg.optimized_mode!r}")
    strategy = cfg.trainer.get("strategy", "auto")
    if isinstance(strategy, str) and strategy != "auto" and strategy not in StrategyRegistry:
        raise UserError(
            f"trainer.strategy={strategy!r} is not a known strategy: pick a trainer config "
            "(trainer=default|cpu|gpu|dp|ddp|ddp_spawn|slurm) or one of Lightning's strategy names"
        )
    check_slurm_allocation(cfg)


def check_slurm_allocation(cfg: DictConfig) -> None:
    """Under `srun`, the job's shape must be the config's: Lightning trusts Slurm for ranks and would hang or fail."""
    if "SLURM_NTASKS" not in os.environ or os.environ.get("SLURM_JOB_NAME") in ("bash", "interactive"):
        return
    tasks_per_node = os.environ.get("SLURM_NTASKS_PER_NODE", "").split("(")[0]
    if tasks_per_node.isdigit() and int(tasks_per_node) != cfg.trainer.devices:
        raise UserError(
            f"Slurm runs {tasks_per_node} task(s) per node (--ntasks-per-node) but trainer.devices="
            f"{cfg.trainer.devices}: set trainer.devices={tasks_per_node} or submit with "
            f"--ntasks-per-node={cfg.trainer.devices}"
        )
    nodes = os.environ.get("SLURM_NNODES", "")
    if nodes.isdigit() and int(nodes) != cfg.trainer.num_nodes:
        raise UserError(
            f"Slurm gave the job {nodes} node(s) (--nodes) but trainer.num_nodes={cfg.trainer.num_nodes}: "
            f"set trainer.num_nodes={nodes} or submit with --nodes={cfg.trainer.num_nodes}"
        )
