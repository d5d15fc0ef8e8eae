"""What a recipe knows of the data that a network may take (`network_hints`), given to the network only where its
constructor names that argument.

A recipe such as experiment=image_folder_cnn knows the images' channels and size and counts the class folders, but
`model=` may be any network: the project's CNN takes all three, torchvision's `ResNet` only `num_classes`, a network
of your own perhaps none. Set as `model.network.<argument>`, each would fail a network without that argument
("unexpected keyword argument"); listed under `network_hints`, each is given to the network whose constructor names
it, over the model's YAML, unless the command line sets that argument itself (`model.network.num_classes=7`).
Both paths build the network from the config this leaves (`project.train.build`, the reference loop's `build`), and
the checkpoint stores it, so evaluation rebuilds the same network.
"""

import inspect

from hydra.utils import get_object
from lightning.pytorch.utilities import rank_zero_info
from omegaconf import DictConfig, open_dict

from project.engine.run_config import command_line_overrides, overridden_key


def give_network_hints(cfg: DictConfig) -> None:
    """Set `cfg.model.network.<name>` from `cfg.network_hints` for each name its `_target_`'s signature has, after
    leaving out what the model's YAML gave a network or optimizer the command line replaced
    (`leave_out_replaced_arguments`)."""
    typed = {overridden_key(override) for override in command_line_overrides()}
    for part in ("optimizer", "network"):
        node = cfg.model.get(part)
        if isinstance(node, DictConfig) and isinstance(node.get("_target_"), str):
            leave_out_replaced_arguments(node, f"model.{part}", typed)
    network = cfg.model.get("network")
    if not isinstance(network, DictConfig) or not isinstance(network.get("_target_"), str):
        return
    taken = taken_arguments(get_object(network._target_))
    with open_dict(network):
        for name, value in (cfg.get("network_hints") or {}).items():
            if name in taken and f"model.network.{name}" not in typed:
                network[name] = value


def leave_out_replaced_arguments(node: DictConfig, path: str, typed: set[str]) -> None:
    """`model.network._target_=torchvision.models.resnet18` (or `model.optimizer._target_=torch.optim.AdamW`) keeps
    the model YAML's other keys, written for what it replaces (the CNN's `in_channels`, SGD's `momentum`): those the
    new class does not name are left out, and said so, rather than passed to it ("unexpected keyword argument").
    Keys typed on the command line are kept."""
    if f"{path}._target_" not in typed:
        return
    kept = taken_arguments(get_object(node._target_)) | {"_target_", "_partial_"}
    kept |= {key.removeprefix(f"{path}.") for key in typed}
    replaced = [key for key in node if key not in kept]
    with open_dict(node):
        for key in replaced:
            del node[key]
    if replaced:
        rank_zero_info(
            f"{path}: {node._target_} names no {', '.join(replaced)} (set in the model's YAML for the one it "
            f"replaces): left out; {path}.<key>=<value> gives it one"
        )


def taken_arguments(target: object) -> set[str]:
    """The argument names a class or function declares (not those a `**kwargs` might take: it says nothing)."""
    try:
        parameters = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature
        return set()
    return {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
