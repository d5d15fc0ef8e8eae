"""The networks a LightningModule holds (`networks_of`), and `compile=true`: `torch.compile` of them.

A module's networks are its direct submodules that hold parameters (the classifier's `network`, or whatever a module
of your own keeps), not its metrics (torchmetrics modules, which hold counts, not weights): what is compiled here,
and what a strategy that shards them (`trainer=fsdp`) takes as its units.

Networks are compiled in place (`nn.Module.compile`): the module keeps its class and its parameters' names, so a
checkpoint written with `compile=true` loads without it and the other way round, and nothing else in the project
(checkpoints, DDP, evaluate, predict) needs to know.

The Lightning side compiles in the `setup` hook, in the process that trains: a module pickled to the processes of
`trainer=ddp_spawn` arrives without its compiled code (torch does not pickle it).
"""

import lightning as L
from lightning.pytorch.utilities import rank_zero_info
from torch import nn
from torchmetrics import Metric

from project.engine.errors import UserError


def networks_of(module: nn.Module) -> dict[str, nn.Module]:
    """`module`'s networks, by attribute name, in the order it registered them."""
    return {
        name: child
        for name, child in module.named_children()
        if not isinstance(child, Metric) and next(child.parameters(), None) is not None
    }


def compile_networks(module: nn.Module) -> list[str]:
    """Compile, in place, each of `module`'s networks (`networks_of`); return their names."""
    networks = networks_of(module)
    for network in networks.values():
        network.compile()
    if not networks:
        raise UserError(
            f"compile=true compiles the submodules of the model that hold parameters, and {type(module).__name__} "
            "has none (its layers are not nn.Module attributes of it): set compile=false, or keep the network in "
            "an attribute (self.network = ...)"
        )
    return list(networks)


class CompileNetworks(L.Callback):
    """Compiles the LightningModule's networks before the first of fitting, validating, testing or predicting."""

    def __init__(self) -> None:
        self.compiled: nn.Module | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.compiled is pl_module:  # fit, then test: compiled once
            return
        self.compiled = pl_module
        names = compile_networks(pl_module)
        rank_zero_info(f"compile=true: torch.compile of {', '.join(names)} (the first steps wait for the compiler)")
