"""What Lightning lacks: a DataParallel strategy (`trainer=dp`), Hydra-safe DDP launching (`trainer=ddp`), and FSDP2
for any LightningModule (`trainer=fsdp`)."""

from project.strategies.dp import DataParallelStrategy
from project.strategies.fsdp import HydraFSDPStrategy
from project.strategies.hydra_ddp import HydraDDPStrategy

__all__ = ["DataParallelStrategy", "HydraDDPStrategy", "HydraFSDPStrategy"]
