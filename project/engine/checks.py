"""Checks of the engine's config values that would otherwise fail deep inside Lightning with an unclear message.

What a module, a data module or a strategy takes is checked by each in its own constructor (the classifier's learning
rate, MNIST's `val_size`, DataParallel's one process, FSDP's precision); `mistyped_value` names a value of the wrong
type for any class, once its constructor has failed.
"""

import inspect
import types
import typing

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import get_class, get_object
from lightning.pytorch.strategies import StrategyRegistry
from omegaconf import DictConfig, OmegaConf

from project.engine.errors import UserError
from project.engine.ranks import process_rank
from project.engine.run_config import command_line_overrides


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_config(cfg: DictConfig) -> None:
    """Raise `UserError` naming the key, the bad value and what is allowed."""
    OmegaConf.to_container(cfg, resolve=True)  # a `${...}` that names nothing fails here, naming its key
    if not (_is_int(cfg.seed) and 0 <= cfg.seed < 2**32):
        raise UserError(f"seed must be an integer from 0 to 2**32 - 1, got {cfg.seed!r}")
    max_epochs = cfg.trainer.get("max_epochs")
    if not (_is_int(max_epochs) and (max_epochs >= 1 or max_epochs == -1)):
        raise UserError(f"trainer.max_epochs must be an integer >= 1 (or -1 for no limit), got {max_epochs!r}")
    devices = cfg.trainer.get("devices")
    if _is_int(devices) and devices < 1 and devices != -1:
        raise UserError(f"trainer.devices must be a positive number of devices (or -1 for all), got {devices!r}")
    if str(cfg.trainer.get("precision")) in ("16-mixed", "16") and not torch.cuda.is_available():
        raise UserError(
            f"trainer.precision={cfg.trainer.precision} is float16 autocast, which needs a CUDA GPU (Lightning would "
            "quietly train in bf16-mixed instead): on this machine use trainer.precision=bf16-mixed or 32-true"
        )
    if cfg.optimized_mode not in ("min", "max"):
        raise UserError(f"optimized_mode must be min or max, got {cfg.optimized_mode!r}")
    check_results_from(cfg)
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


def check_a_search_is_a_sweep() -> None:
    """A sweeper chosen for a single run (`hparams_search=` chooses Optuna's) would be ignored: the run would train
    once, with the search's defaults. Hydra 1.4 lets no config file make a run a sweep (`hydra.mode`), so a search
    takes `-m` on the command line, on either Hydra. (A DDP rank that rank 0 starts for a search's job is a single
    run of that job: rank 0 alone is asked.)"""
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.RUN or process_rank() != 0:
        return
    choices = HydraConfig.get().runtime.choices
    sweeper = choices.get("hydra/sweeper")
    if sweeper in (None, "basic"):
        return
    chosen_by = f" (chosen by hparams_search={choices['hparams_search']})" if choices.get("hparams_search") else ""
    raise UserError(
        f"hydra/sweeper={sweeper}{chosen_by} runs a search, a sweep of runs, and this command starts one run: add -m "
        "before the overrides (python -m project.train -m <the same overrides>), or hydra.mode=MULTIRUN among them"
    )


def check_added_keys() -> None:
    """`+name=value` for a top-level name that is no config group adds a key nothing reads: most likely a typo."""
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


def targets_subclass_of(node: object, expected: type) -> bool:
    """Whether config `node` has a `_target_` naming `expected` or a subclass of it.

    A misspelt class is no: instantiating it names it in one line.
    """
    if not isinstance(node, DictConfig) or not isinstance(node.get("_target_"), str):
        return False
    try:
        return issubclass(get_class(node._target_), expected)
    except (ImportError, ValueError):
        return False


def check_results_from(cfg: DictConfig) -> None:
    """`results_from=best` needs the checkpoint callback that keeps the best weights, and a run that saves it."""
    if cfg.results_from not in ("last", "best"):
        raise UserError(f"results_from must be last or best, got {cfg.results_from!r}")
    if cfg.results_from != "best":
        return
    if "model_checkpoint" not in cfg.callbacks:
        raise UserError(
            "results_from=best needs the best checkpoint, which only callbacks=default saves: "
            "use callbacks=default, or results_from=last"
        )
    if cfg.trainer.get("fast_dev_run"):
        raise UserError(
            "trainer.fast_dev_run (debug=fast) saves no checkpoint, so results_from=best has none: "
            "add results_from=last"
        )


def check_launched_on_every_node(trainer) -> None:
    """More than one node needs each node's processes started there (srun, torchrun), or rank 0 would wait for them
    forever. Asked of the built Trainer, whatever its strategy (the launcher is its cluster environment's to know)."""
    environment = getattr(trainer.strategy, "cluster_environment", None)
    if trainer.num_nodes > 1 and not (environment is not None and environment.creates_processes_externally):
        raise UserError(
            f"trainer.num_nodes={trainer.num_nodes} but nothing starts the other nodes' processes: start the run on "
            "every node with a launcher that does (srun with trainer=slurm, torchrun), or use trainer.num_nodes=1 on "
            "this machine alone"
        )


SIMPLE_TYPES = (bool, int, float, str, type(None))


def fits(value: object, hint: object) -> bool | None:
    """Whether a config `value` fits a constructor argument's type `hint`; None where the hint is not made of plain
    types (bool, int, float, str, None), which are all a command line can give and all this can judge."""
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    if not all(option in SIMPLE_TYPES for option in options):
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return type(value) in options
    return type(value) in options or (isinstance(value, int) and float in options)  # an int is a float too


def mistyped_value(node: object, key: str) -> str | None:
    """The line for the first value of config `node` (at `key`, and the nodes within it) that its `_target_`'s
    annotations say is of the wrong type (`key=value is a str, but <Target>'s <argument> takes int: ...`), or None.

    Asked once a constructor has failed, to name the value behind a message such as "'<' not supported between
    instances of 'str' and 'int'", whatever the class (the user's own too).
    """
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
