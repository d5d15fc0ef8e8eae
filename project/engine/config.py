"""The run's config before it builds and after: the engine's values checked, `hints` given and a replaced `_target_`'s
leftover keys left out, and the resolved whole stored in every checkpoint."""

import inspect
import sys
import types
import typing
from pathlib import Path

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import get_object
from lightning.pytorch.strategies import StrategyRegistry
from lightning.pytorch.utilities import rank_zero_info
from omegaconf import DictConfig, OmegaConf, open_dict

from project.engine.errors import UserError
from project.engine.run_log import process_rank
from project.engine.upstream import register_resolver

SIMPLE_TYPES = (bool, int, float, str, type(None))


class RunConfigCallback(L.Callback):
    """Writes `config` into every checkpoint as `checkpoint["config"]`, whatever the LightningModule: evaluation,
    prediction and resuming rebuild the run from it."""

    def __init__(self, config: dict) -> None:
        self.config = config

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        checkpoint["config"] = self.config


def run_config_of(trainer: L.Trainer) -> dict | None:
    """The config the run's `RunConfigCallback` stores, or None for a Trainer built without one."""
    return next((callback.config for callback in trainer.callbacks if isinstance(callback, RunConfigCallback)), None)


def command_line_overrides() -> list[str]:
    """The command line's overrides as typed (a `${...}` in one is its value's, not Hydra's config's)."""
    return OmegaConf.to_container(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def overridden_key(override: str) -> str:
    """The key an override sets or removes (`+model.optimizer.lr=0.1`, `~callbacks.history`)."""
    return override.lstrip("+~").split("=", 1)[0]


def config_source_arguments() -> list[str]:
    """`--config-name` and any `--config-dir` this process was started with, for a process it starts."""
    hydra = HydraConfig.get()
    config_dirs = [source.path for source in hydra.runtime.config_sources if source.provider == "command-line"]
    return [f"--config-name={hydra.job.config_name}", *(f"--config-dir={path}" for path in config_dirs)]


def switched_on(callback: dict | DictConfig | None) -> bool:
    """Whether a callback's config builds it: not null, nor switched off by `enabled: false` (a key of the config,
    not an argument of the callback)."""
    return callback is not None and callback.get("enabled", True)


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_config(cfg: DictConfig) -> None:
    """Raise `UserError` naming the key, the bad value and what is allowed, for an engine value that would otherwise
    fail deep inside Lightning."""
    OmegaConf.to_container(cfg, resolve=True)  # a `${...}` that names nothing fails here, naming its key
    if not (is_int(cfg.seed) and 0 <= cfg.seed < 2**32):
        raise UserError(f"seed must be an integer from 0 to 2**32 - 1, got {cfg.seed!r}")
    max_epochs = cfg.trainer.get("max_epochs")
    if not (is_int(max_epochs) and (max_epochs >= 1 or max_epochs == -1)):
        raise UserError(f"trainer.max_epochs must be an integer >= 1 (or -1 for no limit), got {max_epochs!r}")
    devices = cfg.trainer.get("devices")
    if is_int(devices) and devices < 1 and devices != -1:
        raise UserError(f"trainer.devices must be a positive number of devices (or -1 for all), got {devices!r}")
    if str(cfg.trainer.get("precision")) in ("16-mixed", "16") and not torch.cuda.is_available():
        raise UserError(
            f"trainer.precision={cfg.trainer.precision} is float16 autocast, which needs a CUDA GPU (Lightning would "
            "quietly train in bf16-mixed instead): on this machine use trainer.precision=bf16-mixed or 32-true"
        )
    if cfg.optimized_mode not in ("min", "max"):
        raise UserError(f"optimized_mode must be min or max, got {cfg.optimized_mode!r}")
    if cfg.results_from not in ("last", "best"):
        raise UserError(f"results_from must be last or best, got {cfg.results_from!r}")
    if cfg.results_from == "best" and "model_checkpoint" not in cfg.callbacks:
        raise UserError(
            "results_from=best needs the best checkpoint, which only callbacks=default saves: "
            "use callbacks=default, or results_from=last"
        )
    if cfg.results_from == "best" and cfg.trainer.get("fast_dev_run"):
        raise UserError(
            "trainer.fast_dev_run (debug=fast) saves no checkpoint, so results_from=best has none: "
            "add results_from=last"
        )
    if not isinstance(cfg.get("compile", False), bool):
        raise UserError(f"compile must be true or false, got {cfg.compile!r}")
    strategy = cfg.trainer.get("strategy", "auto")
    if isinstance(strategy, str) and strategy != "auto" and strategy not in StrategyRegistry:
        raise UserError(
            f"trainer.strategy={strategy!r} is not a known strategy: pick a trainer config (conf/trainer/) or one of "
            "Lightning's strategy names"
        )
    check_added_keys()
    check_a_search_is_a_sweep()


def check_added_keys() -> None:
    """Refuse `+name=value` for a top-level name that is no config group: a key nothing reads, most likely a typo."""
    if not HydraConfig.initialized():
        return
    groups = set(HydraConfig.get().runtime.choices)
    for override in command_line_overrides():
        key = override.split("=", 1)[0]
        if key.startswith("+") and not key.startswith("++") and "." not in key and key[1:] not in groups:
            raise UserError(
                f"{override} adds a top-level key that nothing reads; check its spelling against the config "
                f"(python -m project.train --cfg job), or write +{override} to add it on purpose"
            )


def check_a_search_is_a_sweep() -> None:
    """Refuse a sweeper chosen for a single run (`hparams_search=` without `-m`), which would train once; rank 0
    alone is asked. `hydra.mode=RUN` typed among the overrides says one run is meant: one trial of a search re-run
    with the search's settings (`project.verify` re-runs a search's job so)."""
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.RUN or process_rank() != 0:
        return
    if "hydra.mode=RUN" in sys.argv[1:]:  # as typed: Hydra records it among its overrides for every single run
        return
    choices = HydraConfig.get().runtime.choices
    sweeper = choices.get("hydra/sweeper")
    if sweeper in (None, "basic"):
        return
    chosen_by = f" (chosen by hparams_search={choices['hparams_search']})" if choices.get("hparams_search") else ""
    raise UserError(
        f"hydra/sweeper={sweeper}{chosen_by} runs a search, a sweep of runs, and this command starts one run: add -m "
        "before the overrides (python -m project.train -m <the same overrides>), or hydra.mode=MULTIRUN among them "
        "(hydra.mode=RUN: one run with the search's settings)"
    )


def check_launched_on_every_node(trainer) -> None:
    """Refuse more than one node where nothing starts each node's processes (srun, torchrun): rank 0 would wait
    forever. Asked of the built Trainer, whose cluster environment knows its launcher."""
    environment = getattr(trainer.strategy, "cluster_environment", None)
    if trainer.num_nodes > 1 and not (environment is not None and environment.creates_processes_externally):
        raise UserError(
            f"trainer.num_nodes={trainer.num_nodes} but nothing starts the other nodes' processes: start the run on "
            "every node with a launcher that does (srun with trainer=slurm, torchrun), or use trainer.num_nodes=1 on "
            "this machine alone"
        )


def fits(value: object, hint: object) -> bool | None:
    """Whether a config `value` fits a constructor argument's type `hint`; None for a hint not made of the plain
    types a command line can give."""
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    if not all(option in SIMPLE_TYPES for option in options):
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return type(value) in options
    return type(value) in options or (isinstance(value, int) and float in options)  # an int is a float too


def mistyped_value(node: object, key: str) -> str | None:
    """The line for the first value under config `node` (at `key`) of a type its `_target_`'s annotations refuse, or
    None: asked once a constructor has failed."""
    if not isinstance(node, DictConfig):
        return None
    hints = {}
    if isinstance(node.get("_target_"), str):
        try:
            target = get_object(node._target_)
            hints = typing.get_type_hints(target.__init__ if inspect.isclass(target) else target)
        except Exception:  # a name that does not import, or annotations that do not evaluate: nothing to judge by
            hints = {}
    for name, value in node.items():
        if isinstance(value, DictConfig):
            found = mistyped_value(value, f"{key}.{name}")
            if found:
                return found
        elif name in hints and fits(value, hints[name]) is False:
            options = typing.get_args(hints[name]) or (hints[name],)
            wanted = " or ".join("None" if option is type(None) else option.__name__ for option in options)
            owner = node._target_.rsplit(".", 1)[-1]
            given = type(value).__name__
            return f"{key}.{name}={value} is a {given}, but {owner}'s {name} takes {wanted}: give it {wanted}"
    return None


def give_hints(cfg: DictConfig) -> None:
    """Leave out what replaced `_target_`s do not take, then give each of `cfg.hints` where its target takes it and
    the command line does not set it."""
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
    """Leave out, and say so, the keys of `node` (whose `_target_` the command line replaced) that the new target
    does not name, unless typed on the command line."""
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
    """The argument names a class or function declares (not what a `**kwargs` might take)."""
    try:
        parameters = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature
        return set()
    return {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def subfolders(directory: str) -> int:
    """`${subfolders:<dir>}`: the folders in `directory`; 0 where it does not exist yet."""
    folder = Path(directory)
    return sum(path.is_dir() for path in folder.iterdir()) if folder.is_dir() else 0


def register_resolvers() -> None:
    register_resolver("subfolders", subfolders, replace=True)
