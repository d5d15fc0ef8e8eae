"""Config values a recipe offers a constructor only where it takes them (`hints`), and what a replaced `_target_`
leaves out.

`hints:` mirrors the config: each value under it is given to the `_target_` of the node at the same place, but only
where that target's constructor names the argument, and unless the command line sets it itself. A recipe that knows
the data (its channels, image size, number of classes) so fits any network: `experiment=image_folder_cnn` hints
`model.network` with all three; the project's CNN takes them all, torchvision's `ResNet` class swapped in by its
`_target_` only `num_classes`, its `resnet18` builder (which passes `**kwargs` on, naming none) and a network of your
own perhaps none. Set on the network itself, each would fail a network without
that argument ("unexpected keyword argument").

A `_target_` replaced on the command line (`model.network._target_=torchvision.models.resnet18`,
`model.optimizer._target_=torch.optim.AdamW`) keeps the other keys its node had, written for what it replaces (the
CNN's `in_channels`, SGD's `momentum`): those the new target does not name are left out, and the run says which.
Keys typed on the command line are kept.

Every path that builds from the config applies these first (`project.engine.build`), and checkpoints store the
config they leave, so evaluation rebuilds the same objects.
"""

import inspect
from pathlib import Path

from hydra.utils import get_object
from lightning.pytorch.utilities import rank_zero_info
from omegaconf import DictConfig, OmegaConf, open_dict

from project.engine.hydra_versions import register_resolver
from project.engine.run_config import command_line_overrides, overridden_key


def give_hints(cfg: DictConfig) -> None:
    """Leave out what replaced `_target_`s do not take, then give each of `cfg.hints` where its target takes it."""
    typed = {overridden_key(override) for override in command_line_overrides()}
    for key in sorted(typed):
        path = key.removesuffix("._target_")
        node = OmegaConf.select(cfg, path) if path != key else None
        if isinstance(node, DictConfig) and isinstance(node.get("_target_"), str):
            leave_out_replaced_arguments(node, path, typed)
    hints = cfg.get("hints")
    if isinstance(hints, DictConfig):
        give(cfg, hints, "", typed)


def give(node: DictConfig, hints: DictConfig, path: str, typed: set[str]) -> None:
    """Set, in `node` (at `path`), each of `hints` its `_target_` takes; nested hints go to nested nodes."""
    target = node.get("_target_")
    taken = taken_arguments(get_object(target)) if isinstance(target, str) else set()
    for name, value in hints.items():
        inner = node.get(name)
        if isinstance(value, DictConfig) and isinstance(inner, DictConfig):
            give(inner, value, f"{path}{name}.", typed)
        elif name in taken and f"{path}{name}" not in typed:
            with open_dict(node):
                node[name] = value


def leave_out_replaced_arguments(node: DictConfig, path: str, typed: set[str]) -> None:
    """The keys of `node` (whose `_target_` the command line replaced) that the new target does not name, left out
    and said so (see the module docstring)."""
    kept = taken_arguments(get_object(node._target_)) | {"_target_", "_partial_"}
    kept |= {key.removeprefix(f"{path}.") for key in typed}
    replaced = [key for key in node if key not in kept]
    with open_dict(node):
        for key in replaced:
            del node[key]
    if replaced:
        rank_zero_info(
            f"{path}: {node._target_} names no {', '.join(replaced)} (set in the YAML for the one it replaces): left "
            f"out; {path}.<key>=<value> gives it one"
        )


def taken_arguments(target: object) -> set[str]:
    """The argument names a class or function declares (not those a `**kwargs` might take: it says nothing)."""
    try:
        parameters = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature
        return set()
    return {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def subfolders(directory: str) -> int:
    """`${subfolders:<dir>}`: the folders in `directory`; 0 where it does not exist yet (whatever reads it then says
    so in one line)."""
    folder = Path(directory)
    return sum(path.is_dir() for path in folder.iterdir()) if folder.is_dir() else 0


def register_resolvers() -> None:
    register_resolver("subfolders", subfolders, replace=True)
