"""The networks a LightningModule holds, found the same way by the machinery that acts on them whatever the module:
`compile=true` (`project.compiled_networks`) and `trainer=fsdp` (`project.strategies.fsdp`).

They are its direct submodules that hold parameters (the classifier's `network`, or whatever a module of your own
keeps), not its metrics (torchmetrics modules, which hold counts, not weights).
"""

from torch import nn
from torchmetrics import Metric


def networks_of(module: nn.Module) -> dict[str, nn.Module]:
    """`module`'s networks, by attribute name, in the order it registered them."""
    return {
        name: child
        for name, child in module.named_children()
        if not isinstance(child, Metric) and next(child.parameters(), None) is not None
    }
