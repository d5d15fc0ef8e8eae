"""[typos] What to say of an override Hydra could not apply because the config has no such key (`trainer.max_epoch=3`) or its
group no such option (`trainer=ddpp`): the nearest keys or options that do exist.

Hydra's own message ends by advising `+trainer.max_epoch=3`, which would add a key that nothing reads; where a key
or option is near, the line names it instead, and gives the `+` only where none is. `errors.run_hydra_app` calls
`typo_message` on Hydra's composition errors.


[errors] The exceptions for runs that end early through no bug, and the entry points' way of reporting any failure.

Entry points wrap their work in `exit_on_user_error`:
- a `UserError` (or Lightning's own misconfiguration error), even when Hydra's `instantiate` has wrapped it,
  becomes one `error: ...` line on stderr (and in the run's log file) and exit status 2; a `RunStopped` (a signal,
  Ctrl-C) likewise, with its own status. Anything else is a bug and keeps its traceback.
- inside a sweep (`-m`, an Optuna search, the jobs of `hydra/launcher=slurm`) one failing job must not end the
  sweep: the job reports its error the same way (a bug's traceback first), writes the error line to `error.txt`
  in its directory and returns None, which Optuna records as a failed trial; the sweep's summary lists the job as
  failed, and the sweep exits non-zero (`project.engine.sweeps`). Only an error every job would meet alike
  (`UserError.ends_the_sweep`: a stop, a search's objective not logged) ends the sweep, with its line and status.
They call their `@hydra.main` function through `run_hydra_app`, so that a config file Hydra cannot even read is one
such line too.

"""

import difflib
import errno
import functools
import importlib
import logging
import os
import re
import shutil
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn, ParamSpec, TypeVar

import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.errors import (
    CompactHydraException,
    ConfigCompositionException,
    InstantiationException,
    MissingConfigException,
)
from hydra.types import RunMode
from lightning.fabric.utilities.exceptions import MisconfigurationException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError, OmegaConfBaseException
from torch.multiprocessing.spawn import ProcessRaisedException

from project.engine.run_log import DISK_ERRORS, process_rank, report, started_by_rank_zero, to_log_file
from project.engine.upstream import STAGE_FUNCTIONS, config_root

# ---- from typos.py
# Hydra 1.3's words for an override of a key the config does not have, with the command-line text of the override.
NOT_APPLIED = re.compile(r"Could not override '(?P<key>[^']+)'\.\nTo append to your config use \+(?P<override>.+)")
PRINTS_THE_CONFIG = "--cfg job prints the config"
# How alike (difflib's ratio) a name must be to be suggested: `max_epoch` and `max_epochs` are, `max_steps` is not.
CUTOFF = 0.75


def typo_message(error: ConfigCompositionException) -> str | None:
    """The message (without `error: `) for a key or option the config does not have; None for any other error."""
    if isinstance(error, MissingConfigException):
        if error.options and error.missing_cfg_file and "/" in error.missing_cfg_file:
            return unknown_option(error.missing_cfg_file, list(error.options))
        return None
    not_applied = NOT_APPLIED.match(str(error))
    cause = error.__cause__
    if not_applied is None or not isinstance(cause, OmegaConfBaseException) or cause.parent_node is None:
        return None
    keys = dotted_keys(config_root(cause.parent_node))
    return unknown_key(not_applied["key"], keys, not_applied["override"])


def unknown_key(key: str, keys: list[str], override: str) -> str:
    near = nearest_keys(key, keys)
    if near:
        return f"{key} is not a key of the config: did you mean {' or '.join(near)}? ({PRINTS_THE_CONFIG})"
    return (
        f"{key} is not a key of the config, nor near one ({PRINTS_THE_CONFIG}): check its spelling, or write "
        f"+{override} to add a key that your code reads"
    )


def unknown_option(config_file: str, options: list[str]) -> str:
    group, _, name = config_file.rpartition("/")
    near = difflib.get_close_matches(name, options, n=3, cutoff=CUTOFF)
    choices = f"{group} has: {', '.join(options)}"
    if near:
        suggestions = " or ".join(f"{group}={option}" for option in near)
        return f"{group}={name} is not an option of {group}: did you mean {suggestions}? ({choices})"
    return f"{group}={name} is not an option of {group} ({choices}): check its spelling, or add {config_file}.yaml"


def nearest_keys(key: str, keys: list[str]) -> list[str]:
    """The keys nearest to `key`, best first: keys beside it of a similar name (`trainer.max_epochs` for
    `trainer.max_epoch`), found under the nearest existing parents where its own parent is a typo too
    (`trainer.max_epochs` for `trainr.max_epochs`)."""
    parent, _, name = key.rpartition(".")
    parents = [parent] if not parent or parent in keys else nearest_keys(parent, keys)
    beside: dict[str, list[str]] = {}
    for existing in keys:
        existing_parent, _, existing_name = existing.rpartition(".")
        if existing_parent in parents:
            beside.setdefault(existing_name, []).append(existing)
    return [found for near in difflib.get_close_matches(name, beside, n=3, cutoff=CUTOFF) for found in beside[near]]


def dotted_keys(config: object, prefix: str = "") -> list[str]:
    """Every key of a config (a DictConfig, or nested dicts), nested ones dotted (`trainer.max_epochs`), unresolved."""
    if isinstance(config, DictConfig):
        config = OmegaConf.to_container(config, resolve=False)
    if not isinstance(config, dict):
        return []
    return [
        found for key, value in config.items() for found in (f"{prefix}{key}", *dotted_keys(value, f"{prefix}{key}."))
    ]


# ---- from errors.py
P = ParamSpec("P")
# A failed sweep job's error line, in its directory, where the sweep's table finds it.
ERROR_FILE = "error.txt"
# Less free space than this is a full disk (torch.save's own report of one carries no errno).
FULL_BELOW_BYTES = 1 << 20
# What `instantiate` raises where a constructor refuses its config: Hydra 1.3 wraps the constructor's own TypeError or
# ValueError in an InstantiationException, Hydra 1.4 raises it as it is.
CONSTRUCTOR_ERRORS = (InstantiationException, TypeError, ValueError)
R = TypeVar("R")


class UserError(Exception):
    """A problem in the user's input or environment; its message says what to change.

    `ends_the_sweep`: inside a sweep, one that every job would meet alike ends the sweep at the first job that meets
    it (a stop; a search's objective that the module does not log), rather than failing that job alone."""

    exit_status = 2
    ends_the_sweep = False


class RunStopped(UserError):
    """The run was stopped from outside (SIGTERM, Ctrl-C); its message says how to resume.

    `on_every_rank`: a stop all ranks agreed on (a signal), met by each at the same step; where rank 0 started the
    other ranks it alone prints its line, the others write theirs to their log files (each rank's line would be the
    same, or a single run's hint where rank 0's is the sweep's)."""

    ends_the_sweep = True

    def __init__(self, message: str, exit_status: int, on_every_rank: bool = False) -> None:
        super().__init__(message)
        self.exit_status = exit_status
        self.on_every_rank = on_every_rank


def find_user_error(error: BaseException | None) -> BaseException | None:
    """The `UserError` (or Lightning misconfiguration) behind `error`, following `raise ... from` chains; a disk that
    is full or read-only (whichever writer found it: a log, TensorBoard, a checkpoint) is one too, and so are a config
    value whose `${...}` cannot be resolved, memory running out, a module that DDP needs told about (parameters
    a loss leaves out), and a user error a ddp_spawn worker raised."""
    while error is not None:
        if isinstance(error, (UserError, MisconfigurationException)):
            return error
        if isinstance(error, InterpolationResolutionError):
            return resolvers_refusal(error) or unresolved(error)
        if isinstance(error, OSError) and error.errno in DISK_ERRORS:
            return disk_error(error)
        if is_out_of_memory(error):
            return out_of_memory(error)
        if UNUSED_PARAMETERS in str(error) or TORCH_UNUSED_PARAMETERS in str(error):
            return unused_parameters()
        if GRAPH_CHANGED in str(error):
            return graph_changed()
        if isinstance(error, ProcessRaisedException):
            return raised_in_a_worker(str(error))
        error = error.__cause__ or error.__context__
    return None


# The line of a worker's traceback that names its exception: `project.engine.history.Diverged: training ...`.
EXCEPTION_LINE = re.compile(r"^(?P<module>[A-Za-z_][\w.]*)\.(?P<name>[A-Za-z_]\w*): (?P<message>.*)", re.MULTILINE)


def raised_in_a_worker(traceback_text: str) -> UserError | None:
    """The user error a process that `torch.multiprocessing.spawn` started (ddp_spawn's ranks) raised, rebuilt from
    the traceback text that is all its parent gets back (`ProcessRaisedException`); None for any other exception."""
    found = list(EXCEPTION_LINE.finditer(traceback_text))
    if not found:
        return None
    last = found[-1]
    try:
        raised = getattr(importlib.import_module(last["module"]), last["name"])
    except (ImportError, AttributeError):
        return None
    if not (isinstance(raised, type) and issubclass(raised, (UserError, MisconfigurationException))):
        return None
    refusal = UserError(traceback_text[last.start("message") :].strip())
    refusal.exit_status = getattr(raised, "exit_status", UserError.exit_status)
    return refusal


# DDP's reducer found parameters no loss reached (a GAN's step training one of its networks, a head switched off): in
# Lightning's words (its DDP strategy rewrites torch's message), and in torch's (a DDP of another strategy). Under
# ddp_spawn the message comes back from the worker as the text of a `ProcessRaisedException`, hence text, not type.
UNUSED_PARAMETERS = "parameters that were not used in producing the loss"
TORCH_UNUSED_PARAMETERS = "module has parameters that were not used in producing loss"
# The same with `static_graph=True`, where the set of parameters a loss reaches changes from step to step.
GRAPH_CHANGED = "not compatible with static_graph set to True"


def unused_parameters() -> UserError:
    """The one line for DDP meeting parameters that a training step left out of its loss."""
    return UserError(
        "DDP found parameters that were not used in producing the loss (a GAN's networks trained in turn, a head or "
        "branch no loss reaches): set trainer.strategy.find_unused_parameters=true"
    )


def graph_changed() -> UserError:
    """The one line for `static_graph=True` under a module whose steps do not all use the same parameters."""
    return UserError(
        "DDP with trainer.strategy.static_graph=true met a step that used other parameters than the first: set "
        "trainer.strategy.static_graph=false (and trainer.strategy.find_unused_parameters=true where steps leave "
        "parameters out of the loss)"
    )


def is_out_of_memory(error: BaseException) -> bool:
    """torch's allocators (the CPU's, CUDA's) and Python's own, out of memory."""
    message = str(error)
    return isinstance(error, MemoryError) or (
        isinstance(error, RuntimeError) and ("can't allocate memory" in message or "out of memory" in message)
    )


def out_of_memory(error: BaseException) -> UserError:
    """The one line for memory running out: where, how much was asked for, and what to make smaller."""
    functions = {frame.name for frame in traceback.extract_tb(error.__traceback__)}
    stage = next((stage for function, stage in STAGE_FUNCTIONS.items() if function in functions), "")
    asked = re.search(r"[Tt]ried to allocate ([\d.]+(?: bytes| ?[KMGT]i?B)?)", str(error))
    amount = asked.group(1).removesuffix(" bytes") if asked else ""
    size = f"{int(amount) / 2**30:.3g} GiB" if amount.isdigit() else amount
    return UserError(
        " ".join(part for part in ("out of memory", stage) if part)
        + (f" ({size} asked for)" if size else "")
        + ": lower the batch size or the model's size, or run where there is more memory"
    )


def disk_error(error: OSError) -> UserError:
    """The one line for a disk that cannot take the run's files, whichever writer met it first (a log, TensorBoard, a
    checkpoint): `unwritable`'s."""
    where = error.filename or (HydraConfig.get().runtime.output_dir if HydraConfig.initialized() else "the run dir")
    return unwritable(Path(where), error.errno)


def unwritable(path: Path, error_number: int | None, detail: str = "") -> UserError:
    """The line for a file the disk would not take: the folder and why (full, over its quota, read-only, or `detail`
    where the disk is none of those), what to do, and which checkpoints are kept (a write never touches them).

    The same whichever write met the disk first: a checkpoint, the run's log, TensorBoard's events.
    """
    directory = nearest_existing(path)
    free = shutil.disk_usage(directory).free
    if error_number == errno.ENOSPC or free < FULL_BELOW_BYTES:
        why, fix = f"no space left on the disk of {directory} ({free} bytes free)", "make room there, or"
    elif error_number == errno.EDQUOT:
        why, fix = f"the disk quota of {directory} is used up", "make room there, or"
    elif error_number == errno.EROFS or not os.access(directory, os.W_OK):
        why, fix = f"{directory} cannot be written (a read-only disk, or no permission)", "make it writable, or"
    else:
        why, fix = " ".join(detail.split()) or f"{directory} refused it", ""
    return UserError(f"could not write {path}: {why}: {fix} write the run elsewhere (hydra.run.dir); {kept(path)}")


def disk_refuses(path: Path) -> bool:
    """Whether the disk of `path` is full, or its folder cannot be written."""
    directory = nearest_existing(path)
    return shutil.disk_usage(directory).free < FULL_BELOW_BYTES or not os.access(directory, os.W_OK)


def kept(path: Path) -> str:
    """ "kept: <the checkpoint files>" of the checkpoints folder of a run that failed to write `path`: the folder of
    the checkpoint that failed, or else of the run dir."""
    folder = path.parent
    if path.suffix != ".ckpt" and HydraConfig.initialized():
        folder = Path(HydraConfig.get().runtime.output_dir) / "checkpoints"
    written = sorted(file.name for file in folder.glob("*.ckpt")) if folder.is_dir() else []
    return f"kept: {', '.join(written)}" if written else "no checkpoint was written there before it"


def nearest_existing(path: Path) -> Path:
    """`path`'s nearest folder that exists: the one a write there needs to be allowed in."""
    return next(folder for folder in path.parents if folder.exists())


def resolvers_refusal(error: BaseException | None) -> UserError | None:
    """The `UserError` a resolver raised (`${run_steps:2}`), worded already, behind OmegaConf's errors, if any."""
    while error is not None and not isinstance(error, UserError):
        error = error.__cause__ or error.__context__
    return error


def unresolved(error: InterpolationResolutionError) -> UserError:
    """The one line for a `${...}` in the config (the command line's or a YAML file's) that names nothing there."""
    where, problem = error.full_key or "a ${...} of the config", str(error).splitlines()[0]
    return UserError(
        f"{where}: {problem}: point the ${{...}} at a key the config has (--cfg job prints the config unresolved), "
        "or give the value itself"
    )


def in_sweep_job() -> bool:
    """Whether this process runs one job of a Hydra sweep (its extra DDP ranks run as single runs)."""
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def error_line(error: BaseException) -> str:
    """The one line that reports `error`: its message, whitespace folded."""
    user_error = find_user_error(error)
    if user_error is not None:
        message = str(user_error)
        if "Original Traceback" in message:  # raised in a DataLoader worker, re-raised here with its traceback
            message = message.rstrip().rsplit(f"{type(user_error).__name__}: ", 1)[-1]
        return "error: " + " ".join(message.split())
    return "error: " + " ".join(traceback.format_exception_only(error)[-1].split())


def record_failed_job(line: str) -> None:
    """Leave the error line in the sweep job's directory, where the sweep summary finds it."""
    if process_rank() == 0:
        Path(HydraConfig.get().runtime.output_dir, ERROR_FILE).write_text(line + "\n")


def refuse(line: str, status: int = 2) -> NoReturn:
    """End the process in one `error:` line, where no `exit_on_user_error` is around to turn a `UserError` into one
    (Hydra's resolvers and callbacks, a sweeper, reading the config files)."""
    print(f"error: {line}", file=sys.stderr, flush=True)
    sys.exit(status)


def exit_on_user_error(function: Callable[P, R]) -> Callable[P, R]:
    """Run `function`; report a failure as the module docstring says."""

    @functools.wraps(function)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return function(*args, **kwargs)
        except Exception as error:
            user_error = find_user_error(error)
            sweep_job = in_sweep_job()
            sweep_goes_on = sweep_job and not getattr(user_error, "ends_the_sweep", False)
            if user_error is None:  # a bug: its traceback, in the log file too
                to_log_file("".join(traceback.format_exception(error)), logging.ERROR)
                if not sweep_goes_on:
                    raise
                traceback.print_exc()
            line = error_line(error)
            if getattr(user_error, "on_every_rank", False) and started_by_rank_zero():
                to_log_file(line, logging.ERROR)
            else:
                report(line, sys.stderr, logging.ERROR)
            if sweep_job and not isinstance(user_error, RunStopped):  # a stopped job is not a failed one
                record_failed_job(line)
            if sweep_goes_on:
                return None
            sys.exit(getattr(user_error, "exit_status", 2))

    return wrapper


def run_hydra_app(main: Callable[[], object]) -> None:
    """Call an entry point's `@hydra.main` function so that a config file that is not valid YAML (in conf/ or a
    `hydra.searchpath` dir) ends in one `error:` line naming the file and the place, exit 2, as any user error does;
    so does an override of a key or option the config does not have, naming the nearest that exist (`typos`).

    Hydra reads the files inside its own error report (`run_and_report`), which shows a parse error as a traceback;
    with HYDRA_FULL_ERROR=1, a setting it documents, it leaves every error to its caller, here. Its other messages
    are then printed as Hydra prints them, exit 1, and a bug keeps its traceback.
    A user who set HYDRA_FULL_ERROR gets Hydra's full tracebacks, as asked.
    """
    asked_for_tracebacks = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        main()
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark
        where = f"{mark.name}, line {mark.line + 1}, column {mark.column + 1}" if mark else "a config file"
        problem = ": ".join(part for part in (error.context, error.problem) if part)
        refuse(f"{where} is not valid YAML ({problem}): correct the file")
    except CompactHydraException as error:
        if asked_for_tracebacks:
            raise
        typo = typo_message(error) if isinstance(error, ConfigCompositionException) else None
        if typo is not None:
            refuse(typo)
        print(error, file=sys.stderr)
        if isinstance(error.__cause__, OmegaConfBaseException):
            print(error.__cause__, file=sys.stderr)
        sys.exit(1)
