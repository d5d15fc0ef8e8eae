"""Checks of config values that would otherwise fail deep inside Lightning with an unclear message."""

import inspect
import os
import types
import typing

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import get_class, get_object
from lightning.pytorch.strategies import StrategyRegistry
from omegaconf import DictConfig, OmegaConf

from project.engine.errors import UserError
from project.engine.run_config import command_line_overrides
from project.optional.dp.strategy import DataParallelStrategy
from project.optional.fsdp.strategy import FSDP_PRECISIONS, HydraFSDPStrategy


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
    learning_rate = cfg.model.get("optimizer", {}).get("lr")
    if learning_rate is not None and not (isinstance(learning_rate, (int, float)) and learning_rate > 0):
        raise UserError(f"model.optimizer.lr must be a number > 0, got {learning_rate!r}")
    val_size = cfg.data.get("val_size")
    if val_size is not None and not (_is_int(val_size) and val_size >= 0):
        raise UserError(
            f"data.val_size must be a whole number of images >= 0 (0: validate on the test set), got {val_size!r}"
        )
    if str(cfg.trainer.get("precision")) in ("16-mixed", "16") and not torch.cuda.is_available():
        raise UserError(
            f"trainer.precision={cfg.trainer.precision} is float16 autocast, which needs a CUDA GPU (Lightning would "
            "quietly train in bf16-mixed instead): on this machine use trainer.precision=bf16-mixed or 32-true"
        )
    if cfg.optimized_mode not in ("min", "max"):
        raise UserError(f"optimized_mode must be min or max, got {cfg.optimized_mode!r}")
    check_results_from(cfg)
    check_compile(cfg)
    check_fsdp_precision(cfg)
    strategy = cfg.trainer.get("strategy", "auto")
    if isinstance(strategy, str) and strategy != "auto" and strategy not in StrategyRegistry:
        raise UserError(
            f"trainer.strategy={strategy!r} is not a known strategy: pick a trainer config "
            "(trainer=default|cpu|gpu|dp|ddp|ddp_spawn|fsdp|slurm) or one of Lightning's strategy names"
        )
    check_added_keys()
    check_multi_node_launch(cfg)
    check_slurm_allocation(cfg)


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


def under_srun() -> bool:
    """Whether `srun` runs this process as one of a job's tasks (not a shell of `salloc` or `srun --pty bash`)."""
    return "SLURM_NTASKS" in os.environ and os.environ.get("SLURM_JOB_NAME") not in ("bash", "interactive")


def launched_on_every_node() -> bool:
    """Whether a launcher that starts processes on every node (srun, torchrun) started this one."""
    return under_srun() or "TORCHELASTIC_RUN_ID" in os.environ


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


def is_data_parallel(cfg: DictConfig) -> bool:
    """Whether `cfg.trainer` is DataParallel (`trainer=dp`): one process, whatever `devices` says."""
    return targets_subclass_of(cfg.trainer.get("strategy"), DataParallelStrategy)


def check_fsdp_precision(cfg: DictConfig) -> None:
    """FSDP2 mixes precision by its own policy (trainer=fsdp's strategy), which is written for these two; Lightning
    would accept others (bf16-true, 16-true) and train with weights that sharding does not expect."""
    precision = str(cfg.trainer.get("precision"))
    if targets_subclass_of(cfg.trainer.get("strategy"), HydraFSDPStrategy) and precision not in FSDP_PRECISIONS:
        raise UserError(
            f"trainer=fsdp trains in 32-true or bf16-mixed (FSDP2's mixed-precision policy), not "
            f"trainer.precision={precision}: set trainer.precision=32-true or bf16-mixed"
        )


def check_multi_node_launch(cfg: DictConfig) -> None:
    """More than one node needs each node's processes started there; otherwise rank 0 would wait for them forever."""
    if is_data_parallel(cfg):
        return  # one process on one machine: DataParallelStrategy refuses num_nodes > 1 itself, saying so
    num_nodes = cfg.trainer.get("num_nodes", 1)
    if _is_int(num_nodes) and num_nodes > 1 and not launched_on_every_node():
        raise UserError(
            f"trainer.num_nodes={num_nodes} but nothing starts the other nodes' processes: submit with "
            "scripts/slurm/train.sbatch (srun, trainer=slurm), or run scripts/torchrun/train.sh on every node; "
            "on this machine alone use trainer.num_nodes=1"
        )


def check_compile(cfg: DictConfig) -> None:
    """`compile` is a switch, and DataParallel cannot take a network compiled in place: its per-step copies of the
    network would all run the original's compiled code (`project.engine.networks`)."""
    compiled = cfg.get("compile", False)
    if not isinstance(compiled, bool):
        raise UserError(f"compile must be true or false, got {compiled!r}")
    if compiled and is_data_parallel(cfg):
        raise UserError(
            "compile=true with trainer=dp: DataParallel copies the network onto every GPU at each step, and the "
            "copies would run the original's compiled code; use trainer=ddp with compile=true, or compile=false"
        )


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


def check_slurm_allocation(cfg: DictConfig) -> None:
    """Under `srun`, the job's shape must be the config's: Lightning trusts Slurm for ranks and would hang or fail.

    DataParallel (`trainer=dp`) is one process whatever its `devices`, so it needs one task per node.
    """
    if not under_srun():
        return
    tasks_per_node = os.environ.get("SLURM_NTASKS_PER_NODE", "").split("(")[0]
    if is_data_parallel(cfg):
        if tasks_per_node.isdigit() and int(tasks_per_node) != 1:
            raise UserError(
                f"trainer=dp runs one process per node but Slurm runs {tasks_per_node} task(s) per node: "
                "submit with --ntasks-per-node=1 (or use trainer=slurm for one process per device)"
            )
    elif tasks_per_node.isdigit() and int(tasks_per_node) != cfg.trainer.devices:
        raise UserError(
            f"Slurm runs {tasks_per_node} task(s) per node (--ntasks-per-node) but trainer.devices="
            f"{cfg.trainer.devices}: set trainer.devices={tasks_per_node} or submit with "
            f"--ntasks-per-node={cfg.trainer.devices}"
        )
    nodes = os.environ.get("SLURM_NNODES", "")
    if nodes.isdigit() and int(nodes) != cfg.trainer.num_nodes:
        raise UserError(
            f"Slurm gave the job {nodes} node(s) (--nodes) but trainer.num_nodes={cfg.trainer.num_nodes}: "
            f"set trainer.num_nodes={nodes} or submit with --nodes={cfg.trainer.num_nodes}"
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
