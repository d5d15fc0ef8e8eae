"""`compile=true`: `torch.compile` of the networks a LightningModule holds, on the Lightning path and the reference.

Networks are compiled in place (`nn.Module.compile`): the module keeps its class and its parameters' names, so a
checkpoint written with `compile=true` loads without it and the other way round, and nothing else in the project
(checkpoints, DDP, evaluate, predict) needs to know. What gets compiled is the LightningModule's networks
(`project.module_networks`: its submodules that hold parameters, not its metrics).

The Lightning side compiles in the `setup` hook, in the process that trains: a module pickled to the processes of
`trainer=ddp_spawn` arrives without its compiled code (torch does not pickle it).
"""

import lightning as L
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from project.errors import UserError
from project.module_networks import networks_of


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
