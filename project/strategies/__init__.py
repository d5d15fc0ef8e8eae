"""What Lightning lacks: a DataParallel strategy (`trainer=dp`) and Hydra-safe DDP launching (`trainer=ddp`)."""

from project.strategies.dp import DataParallelStrategy
from project.strategies.hydra_ddp import HydraDDPStrategy

__all__ = ["DataParallelStrategy", "HydraDDPStrategy"]
