"""What Lightning lacks: `strategy="dp"` (registered on import) and Hydra-safe DDP launching."""

from project.strategies.dp import DataParallelStrategy, register
from project.strategies.hydra_ddp import HydraDDPStrategy

register()

__all__ = ["DataParallelStrategy", "HydraDDPStrategy"]
