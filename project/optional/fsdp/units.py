"""Which submodules of a model `trainer=fsdp` makes FSDP units of their own: the choice, apart from the sharding.

FSDP2 gathers a unit's parameters just before the unit's forward runs and frees them after it, so a parameter is
whole only inside its unit's forward. Two ways that goes wrong with a model written elsewhere, where units are chosen
by class alone (every `Linear`):
- a module that reads a submodule's weight without calling it: `nn.MultiheadAttention` hands `out_proj.weight` (a
  `Linear`) to its fused kernel, which then meets a weight still sharded ("mixed torch.Tensor and DTensor");
- a parameter two modules hold (input and output embeddings tied, as GPT-2's): each unit shards its own copy, and
  the two train apart.

So the default (`layer_classes: null`) makes units of whole blocks, those a model calls as a whole, as torchtitan
shards a transformer per block:
- torch's transformer layers (`TRANSFORMER_LAYERS`);
- the repeated blocks of a model: the items of a `ModuleList` or `Sequential` whose items holding parameters are
  two or more of one class (a GPT's blocks, a ResNet stage's, an MLP's layers);
- each of at least `min_unit_params` parameters: a smaller unit costs two gathers and a reduce-scatter per step for
  little memory, and stays in the unit around it;
- never a block that shares a parameter with a module outside it, nor one inside another unit.
What no unit takes belongs to the unit around it: the strategy makes one of each network of the LightningModule that
shares nothing with another (`network_units`), and one of the LightningModule itself, the root, which holds the rest:
a parameter two networks share (a language model's output layer tied to its embedding, `self.head.weight =
self.embed.weight`) is sharded once there, gathered for the whole step, and stays one.

`layer_classes` names the unit classes instead: every submodule of them, innermost first. A unit that would hold a
parameter shared outside it is then refused in one line, before training.
"""

from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from hydra.utils import get_class
from torch import nn

from project.engine.errors import UserError

TRANSFORMER_LAYERS = (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)
# Modules that hold others and that a model does not call (FSDP refuses to make a unit of one without a forward).
CONTAINERS = (nn.ModuleList, nn.ModuleDict)
KEY = "trainer.strategy.layer_classes"


# Who holds a parameter: the module object (by identity) and its attribute, with one name it is reachable by.
Holders = dict[int, dict[tuple[int, str], str]]


def parameter_holders(root: nn.Module) -> Holders:
    """Every parameter of `root` (by identity) and the modules holding it. FSDP replaces a parameter in each module
    object that holds it, once per unit: two holders are tied weights (`head.weight = embed.weight`); one module
    reached by two names (an alias, `self.backbone = self.model.backbone`) is one holder."""
    holders: Holders = {}
    for module_name, module in root.named_modules(remove_duplicate=False):
        for name, parameter in module.named_parameters(recurse=False):
            full_name = f"{module_name}.{name}" if module_name else name
            holders.setdefault(id(parameter), {}).setdefault((id(module), name), full_name)
    return holders


def shared_outside(module: nn.Module, holders: Holders) -> tuple[str, str] | None:
    """A parameter of `module` that a module outside it holds too: (a name of it inside, a name outside)."""
    inside = {id(submodule) for submodule in module.modules()}
    for parameter in module.parameters():
        held = holders[id(parameter)]
        outside = [name for (holder, _), name in held.items() if holder not in inside]
        if outside:
            return next(name for (holder, _), name in held.items() if holder in inside), outside[0]
    return None


def repeated_blocks(root: nn.Module) -> Iterable[str]:
    """The names of the items of each `ModuleList`/`Sequential` in `root` whose items that hold parameters are two
    or more of one class."""
    for container_name, container in root.named_modules():
        if not isinstance(container, (nn.ModuleList, nn.Sequential)):
            continue
        items = [(name, item) for name, item in container.named_children() if next(item.parameters(), None) is not None]
        if len(items) >= 2 and len({type(item) for _, item in items}) == 1:
            yield from (f"{container_name}.{name}" if container_name else name for name, _ in items)


def parameter_count(module: nn.Module) -> int:
    return sum(parameter.numel() for parameter in module.parameters())


def default_units(root: nn.Module, roots: Collection[str], min_unit_params: int, holders: Holders) -> list[str]:
    """The blocks the module docstring describes, outermost only, in the order `root` holds them. A block attached at
    two places (one module object held by two parents, or twice by one) is none: it stays in the unit around it,
    which holds it gathered for both calls. A block under an alias of its parent (`self.backbone = self.model`) is
    attached once, and is one."""
    # `_modules`, not `named_children()`, which names a child held twice by one parent once.
    places = Counter(id(child) for parent in root.modules() for child in parent._modules.values() if child is not None)
    blocks = set(repeated_blocks(root)) | {
        name for name, module in root.named_modules() if isinstance(module, TRANSFORMER_LAYERS)
    }
    fit = {
        name
        for name in blocks - set(roots) - {""}
        if parameter_count(module := root.get_submodule(name)) >= min_unit_params
        and places[id(module)] == 1
        and shared_outside(module, holders) is None
    }
    outermost = [name for name in fit if not any(name.startswith(f"{other}.") for other in fit)]
    order = {name: index for index, (name, _) in enumerate(root.named_modules())}
    return sorted(outermost, key=order.__getitem__)


def named_units(
    root: nn.Module, roots: Collection[str], layer_classes: tuple[type[nn.Module], ...], holders: Holders
) -> list[str]:
    """Every submodule of `layer_classes` but `root` and `roots`; refused where one holds a shared parameter."""
    units = []
    for name, module in root.named_modules():
        if name and name not in roots and isinstance(module, layer_classes):
            shared = shared_outside(module, holders)
            if shared is not None:
                raise UserError(
                    f"{KEY} makes {name} ({type(module).__name__}) an FSDP unit of its own, but its parameter "
                    f"{shared[0]} is also {shared[1]}, outside it, and FSDP would train the two apart: set {KEY} to "
                    f"classes whose units hold every module sharing it, or to null (whole blocks, the default)"
                )
            units.append(name)
    return units


@dataclass(frozen=True)
class UnitChoice:
    """How the units are chosen: `layer_classes`, or None for whole blocks of at least `min_unit_params`
    parameters (the module docstring)."""

    layer_classes: tuple[type[nn.Module], ...] | None
    min_unit_params: int

    @classmethod
    def from_config(cls, layer_classes: list[str] | None, min_unit_params: int) -> "UnitChoice":
        """From trainer=fsdp's keys: `layer_classes` as import paths."""
        classes = None if layer_classes is None else tuple(get_class(path) for path in layer_classes)
        return cls(classes, min_unit_params)

    def of(self, root: nn.Module, roots: Collection[str]) -> list[str]:
        """The names of the submodules of `root` to make FSDP units, innermost first (a unit's parameters are those
        its units inside it leave over, so they are sharded first). `roots`: the names of the children the caller
        shards as units itself (`network_units`)."""
        holders = parameter_holders(root)
        if self.layer_classes is None:
            units = default_units(root, roots, self.min_unit_params, holders)
        else:
            units = named_units(root, roots, self.layer_classes, holders)
        return units[::-1]


def network_units(module: nn.Module, networks: Collection[str]) -> list[str]:
    """The networks of `module` (`networks`: the names of its children that hold parameters) that become FSDP units of
    their own: all but one that shares a parameter with a module outside it (another network, the LightningModule)
    and a container with no forward of its own (`self.blocks = nn.ModuleList(...)`: FSDP gathers a unit as one of its
    modules' forward starts). What they leave over is the root unit's (the module docstring)."""
    holders = parameter_holders(module)
    return [
        name
        for name in networks
        if shared_outside(network := module.get_submodule(name), holders) is None
        and not (isinstance(network, CONTAINERS) and type(network).forward is nn.Module.forward)
    ]
