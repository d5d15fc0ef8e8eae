"""What a resumed checkpoint restores besides its weights (callback, loop, optimizer and schedule states), checked
before Lightning uses any of it: a checkpoint is data, handed around, and Lightning restores these states as they are.

- Paths. A `ModelCheckpoint` deletes the files its restored state names once newer ones replace them (through fsspec,
  recursively, any URL: `local:///home` deletes a home directory) and `results_from=best` loads its best file (a URL
  through torch.hub, unpickled). A path a restored callback state names is kept only where it plainly lies inside
  this run's dir (`trainer.default_root_dir`, which is `${run_dir}`): a requeued Slurm job, a carried-on sweep job or
  `hydra.run.dir=<dir> ckpt_path=last` resume their own dir's checkpoint, whose best and last checkpoints go on being
  kept. Any other (another run's or machine's files, a URL, `~`, `..` out of the run, a link out of it) is dropped
  before the callback loads its state, set to the callback's fresh value, with one warning line per checkpoint.
- Types. The loops', optimizers' and schedules' states are compared with the same states of the objects this run
  built: what those hold must be there, and of their kind (a number where a number is); else one `error:` line,
  exit 2, before anything trains, where Lightning would end in a traceback (or train on with a string for a rate).
- The data module's state is its own to check (`load_state_dict`), as the example's do.
"""

import sys
from collections.abc import Callable, Mapping
from pathlib import PurePath

import lightning as L
import torch
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.model_helpers import is_overridden
from packaging.version import InvalidVersion, Version
from torch import Tensor

from project.engine.checkpoints import check_weights_fit, is_sharded, read_metadata
from project.engine.errors import UserError, quoted
from project.engine.run_dir import names_a_url, plain_path_inside
from project.engine.run_log import report

# The loop state Lightning restores for each stage (`_CheckpointConnector.restore_loops`).
LOOP_OF_STAGE = {"fit": "fit_loop", "validate": "validate_loop", "test": "test_loop", "predict": "predict_loop"}
# A ModelCheckpoint's paths, each with the score that goes with its file (dropped with it).
CHECKPOINT_PATHS = {"best_model_path": "best_model_score", "kth_best_model_path": "kth_value"}
CHECKPOINT_DIRS = ("dirpath", "last_model_path")
CHECKPOINT_SCORES = ("best_model_score", "current_score", "kth_value")
DROPPED_SHOWN = 3
# The longest dropped path a warning shows (a checkpoint may hold any string).
LONGEST_PATH = 200


def kind(fresh: object) -> str:
    """What a value must be, said from the value this run's own object holds there."""
    if isinstance(fresh, bool):
        return "True or False"
    if isinstance(fresh, Tensor):
        return "a tensor or a number"
    if isinstance(fresh, (int, float)):
        return "a number"
    return "a string" if isinstance(fresh, str) else f"a {type(fresh).__name__}"


def is_number(value: object) -> bool:
    """A real number as an optimizer or loop takes one: int, float or a one-element tensor, never a bool."""
    if isinstance(value, Tensor):
        return value.numel() == 1 and not value.is_complex() and value.dtype != torch.bool
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def fits(stored: object, fresh: object) -> bool:
    """Whether a single `stored` value is of the kind `fresh` (this run's own) is; None there says nothing."""
    if isinstance(fresh, bool):
        return isinstance(stored, bool)
    if isinstance(fresh, Tensor):
        return isinstance(stored, Tensor) or is_number(stored)
    if isinstance(fresh, (int, float)):
        return is_number(stored)
    if isinstance(fresh, str):
        return isinstance(stored, str)
    return True


def unlike(stored: object, fresh: object, where: str, every_key: bool = True) -> str | None:
    """Where `stored` (a checkpoint's state) is not what `fresh` (the state of the object this run built) could be:
    the first key missing (where `every_key`) or of another kind, and what it holds; None where it fits. Keys only
    `stored` has, and list items beyond `fresh`'s, are left to their reader."""
    if isinstance(fresh, Mapping):
        if not isinstance(stored, Mapping):
            return f"{where} holds {quoted(stored)}, not a mapping"
        for key, value in fresh.items():
            if key not in stored:
                if every_key:
                    return f"{where} has no {quoted(key)}"
                continue
            problem = unlike(stored[key], value, f"{where}[{quoted(key)}]", every_key)
            if problem:
                return problem
        return None
    if isinstance(fresh, (list, tuple)):
        if not isinstance(stored, (list, tuple)):
            return f"{where} holds {quoted(stored)}, not a list"
        for index, (item, fresh_item) in enumerate(zip(stored, fresh, strict=False)):
            problem = unlike(item, fresh_item, f"{where}[{index}]", every_key)
            if problem:
                return problem
        return None
    return None if fits(stored, fresh) else f"{where} holds {quoted(stored)}, not {kind(fresh)}"


def refusal(path: object, problem: str) -> UserError:
    return UserError(
        f"ckpt_path={path}: {problem}, which this run's own objects cannot take: it is not a checkpoint training "
        "can go on from; resume from one project.train wrote, or train afresh (without ckpt_path)"
    )


def check_lightning_can_read(stored: Mapping, path: object, restores_optimizers: bool) -> None:
    """Refuse what Lightning and the module's hooks read before any callback sees the checkpoint (its version, to
    migrate it; the callback states' mapping; the schedules the module's `on_load_checkpoint` may take), and the
    states a resume needs that a weights-only checkpoint lacks."""
    try:
        Version(stored["pytorch-lightning_version"])
    except (KeyError, TypeError, InvalidVersion):
        version = quoted(stored.get("pytorch-lightning_version"))
        raise refusal(path, f"its pytorch-lightning_version holds {version}, not the version that wrote it") from None
    callbacks = stored.get("callbacks", {})
    if not isinstance(callbacks, Mapping) or not all(isinstance(state, Mapping) for state in callbacks.values()):
        raise refusal(path, f"its callbacks hold {quoted(callbacks)}, not a state per callback")
    needed = ("optimizer_states", "lr_schedulers") if restores_optimizers else ("lr_schedulers",)
    for key in needed:
        states = stored.get(key)
        if not isinstance(states, list) or not all(isinstance(state, Mapping) for state in states):
            what = "has none" if states is None else f"holds {quoted(states)}"
            raise refusal(path, f"its {key} {what}, not a list of states (a checkpoint of the weights alone?)")


def check_loop(checkpoint: Mapping, trainer: L.Trainer) -> None:
    """Refuse the loop state Lightning restores for this stage where it lacks a key of this run's loop, or holds
    another kind of value (Lightning would fail in a traceback, or restart a count it skipped)."""
    loops = checkpoint.get("loops")
    name = LOOP_OF_STAGE.get(trainer.state.fn)
    if loops is None or name is None:
        return  # Lightning restores no loop: a checkpoint of the weights alone
    problem = unlike(loops, {name: getattr(trainer, name).state_dict()}, "loops")
    if problem:
        raise refusal(trainer.ckpt_path, f"its {problem}")


def check_training_state(checkpoint: Mapping, trainer: L.Trainer) -> None:
    """Refuse optimizer and schedule states this run's optimizers and schedules cannot take: another count of groups
    or parameters (torch refuses with a traceback), or a value of another kind than theirs (a rate that is a string:
    torch loads it and fails at the first step). Keys only one side has are torch's to settle (an older torch's
    checkpoint lacks a newer option, which torch fills in)."""
    optimizers = zip(checkpoint.get("optimizer_states", []), trainer.optimizers, strict=False)  # as Lightning zips
    for index, (stored, optimizer) in enumerate(optimizers):
        problem = optimizer_unlike(stored, optimizer.state_dict(), f"optimizer_states[{index}]")
        if problem:
            raise refusal(trainer.ckpt_path, f"its {problem}")
    schedules = zip(checkpoint.get("lr_schedulers", []), trainer.lr_scheduler_configs, strict=False)
    for index, (stored, config) in enumerate(schedules):
        problem = unlike(stored, config.scheduler.state_dict(), f"lr_schedulers[{index}]", every_key=False)
        if problem:
            raise refusal(trainer.ckpt_path, f"its {problem}")


def optimizer_unlike(stored: object, fresh: dict, where: str) -> str | None:
    """`unlike` for an optimizer's state, with torch's own rule: as many groups, each of as many parameters."""
    if not (isinstance(stored, Mapping) and isinstance(stored.get("state"), Mapping)):
        return f"{where} holds {quoted(stored)}, not an optimizer's state and param_groups"
    groups, fresh_groups = stored.get("param_groups"), fresh["param_groups"]
    if not isinstance(groups, list) or len(groups) != len(fresh_groups):
        return f"{where}['param_groups'] holds {quoted(groups)}, not this run's {len(fresh_groups)} group(s)"
    for index, (group, fresh_group) in enumerate(zip(groups, fresh_groups, strict=True)):
        here = f"{where}['param_groups'][{index}]"
        params = group.get("params") if isinstance(group, Mapping) else None
        if not (isinstance(params, list) and all(type(number) is int for number in params)):
            return f"{here} holds {quoted(group)}, not a group of numbered parameters"
        if len(params) != len(fresh_group["params"]):
            return f"{here} holds {len(params)} parameters, this run's group {len(fresh_group['params'])}"
        problem = unlike(group, fresh_group, here, every_key=False)
        if problem:
            return problem
    return None


def checkpoint_state_unlike(state: Mapping, where: str) -> str | None:
    """Where a ModelCheckpoint's state is not one it can take: its paths strings (or None), its scores numbers (or
    None), the two keys it always reads there."""
    for key in ("best_model_path", "best_model_score"):
        if key not in state:
            return f"{where} has no {key!r}"
    for key in (*CHECKPOINT_PATHS, *CHECKPOINT_DIRS):
        if not (state.get(key) is None or isinstance(state[key], str)):
            return f"{where}[{key!r}] holds {quoted(state[key])}, not a path"
    for key in CHECKPOINT_SCORES:
        if not (state.get(key) is None or is_number(state[key])):
            return f"{where}[{key!r}] holds {quoted(state[key])}, not a score"
    best = state.get("best_k_models", {})
    if not isinstance(best, Mapping) or not all(isinstance(p, str) and is_number(s) for p, s in best.items()):
        return f"{where}['best_k_models'] holds {quoted(best)}, not scores by path"
    return None


def names_a_path(text: str) -> bool:
    """Whether a string in a callback's state reads as a path that may lie outside the run: a URL, an absolute path,
    one of `~`, or one with a `..`. (A relative one, `val/acc`, is any callback's name for anything.)"""
    return names_a_url(text) or text.startswith(("/", "~")) or ".." in PurePath(text).parts


def drop_foreign_checkpoint_paths(state: dict, fresh: dict, inside: Callable[[str], bool], dropped: list) -> None:
    """Set each path of a ModelCheckpoint's `state` outside the run (and its file's score) to the callback's own
    `fresh` value, and leave foreign files out of its best ones; `dropped` gets each path dropped."""
    for key in (*CHECKPOINT_PATHS, *CHECKPOINT_DIRS):
        if state.get(key) and not inside(state[key]):
            dropped.append(state[key])
            state[key] = fresh[key]
            if key in CHECKPOINT_PATHS:
                state[CHECKPOINT_PATHS[key]] = fresh[CHECKPOINT_PATHS[key]]
    best = state.get("best_k_models", {})
    for path in [path for path in best if not inside(path)]:
        dropped.append(path)
        del best[path]


def without_foreign_paths(value: object, fresh: object, inside: Callable[[str], bool], dropped: list) -> object:
    """`value` (any callback's state) without the strings that read as paths outside the run, each replaced by the
    value `fresh` (the callback's own state) holds there, or left out where it holds none; `dropped` gets each."""

    def foreign(item: object) -> bool:
        return isinstance(item, str) and names_a_path(item) and not inside(item)

    if isinstance(value, Mapping):
        own = fresh if isinstance(fresh, Mapping) else {}
        kept = {}
        for key, item in value.items():
            if foreign(key) or foreign(item):
                dropped.append(key if foreign(key) else item)
                if foreign(item) and key in own:
                    kept[key] = own[key]
            else:
                kept[key] = without_foreign_paths(item, own.get(key), inside, dropped)
        return kept
    if isinstance(value, (list, tuple)):
        dropped += [item for item in value if foreign(item)]
        return type(value)(without_foreign_paths(item, None, inside, dropped) for item in value if not foreign(item))
    return value


def drop_foreign_paths(checkpoint: dict, trainer: L.Trainer) -> list[str]:
    """Drop, from the states of the trainer's callbacks in `checkpoint`, every path outside its run dir (the module
    docstring), after refusing a ModelCheckpoint state that is not one; the paths dropped, each once."""
    states = checkpoint.get("callbacks") or {}
    dropped: list[str] = []

    def inside(path: str) -> bool:
        return plain_path_inside(path, trainer.default_root_dir)

    for callback in trainer.callbacks:
        state = states.get(callback.state_key)
        if not state:
            continue  # Lightning restores none
        if isinstance(callback, ModelCheckpoint):
            problem = checkpoint_state_unlike(state, f"callbacks[{type(callback).__name__}]")
            if problem:
                raise refusal(trainer.ckpt_path, f"its {problem}")
            drop_foreign_checkpoint_paths(state, callback.state_dict(), inside, dropped)
        else:
            states[callback.state_key] = without_foreign_paths(state, callback.state_dict(), inside, dropped)
    return list(dict.fromkeys(dropped))


class RestoredStateCheck(Callback):
    """Checks the checkpoint a run resumes from, and any a later stage loads (`results_from=best`), before Lightning
    restores it (the module docstring): the weights at `setup` (strictly, as the module will load them), what
    Lightning reads first there too, callback paths and the loop as each checkpoint is loaded, the optimizers and
    schedules once this run's exist, before theirs are restored."""

    def __init__(self, ckpt_path: str | None) -> None:
        self.ckpt_path = ckpt_path  # what `fit` resumes from (Lightning sets `trainer.ckpt_path` after `setup`)
        # The resumed checkpoint (its tensors mapped from disk), until this run's optimizers exist to compare with.
        self.resumed: Mapping | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        path = self.ckpt_path
        if stage != "fit" or path is None:
            return
        sharded = is_sharded(path)  # its optimizer states are in its shards, which DCP reads
        stored = read_metadata(path) if sharded else torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        check_lightning_can_read(stored, path, trainer.strategy.lightning_restore_optimizer and not sharded)
        self.resumed = stored
        if not sharded and pl_module.strict_loading and not is_overridden("configure_model", pl_module):
            check_resumed_weights(stored, pl_module, path)  # (a configure_model's layers do not exist yet)

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        """As Lightning loads a checkpoint, before any callback, loop, optimizer or schedule takes its state."""
        check_loop(checkpoint, trainer)
        dropped = drop_foreign_paths(checkpoint, trainer)
        if dropped and trainer.is_global_zero:
            shown = ", ".join(quoted(path, LONGEST_PATH) for path in dropped[:DROPPED_SHOWN])
            more = f" and {len(dropped) - DROPPED_SHOWN} more" if len(dropped) > DROPPED_SHOWN else ""
            report(
                f"warning: ckpt_path={trainer.ckpt_path}: its callback states name files outside this run's dir "
                f"{trainer.default_root_dir} ({shown}{more}), another run's or another machine's, which are not "
                "this run's: dropped, never opened or deleted; this run keeps its own best and last checkpoints "
                "from here",
                sys.stderr,
            )
        if trainer.state.fn == "fit" and not trainer.strategy.restore_checkpoint_after_setup:
            self.resumed = checkpoint  # what Lightning restores from (a sharded one assembled; Slurm's own)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """This run's optimizers and schedules exist, the checkpoint's are restored after this (a sharding strategy's
        `restore_checkpoint_after_setup`: the whole checkpoint)."""
        if self.resumed is not None:
            check_training_state(self.resumed, trainer)
        self.resumed = None


def check_resumed_weights(stored: Mapping, module: L.LightningModule, path: str) -> None:
    """Refuse, before anything trains, weights the module cannot load strictly (Lightning's traceback, once `fit` has
    set up), taking them as the module's `on_load_checkpoint` passes them on (applied to a copy)."""
    if is_overridden("on_load_checkpoint", module):
        stored = {**stored, "state_dict": dict(stored["state_dict"])}
        module.on_load_checkpoint(stored)
    advice = (
        "resume with the checkpoint's own model (its run's .hydra/overrides.yaml), or train afresh (without ckpt_path)"
        if "config" in stored
        else "give the model= (and model.<key>=) that trained it, or train afresh (without ckpt_path)"
    )
    check_weights_fit(module, stored["state_dict"], path, advice)
