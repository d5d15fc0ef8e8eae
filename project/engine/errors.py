"""How a run ends through no bug: `UserError`, and the entry points' one `error:` line and exit status for any failure
(a bug keeps its traceback; a failing sweep job fails alone)."""

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
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NoReturn, ParamSpec, TypeVar

import torch
import torch.distributed as dist
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

from project.engine.run_log import DISK_ERRORS, printable, process_rank, report, started_by_rank_zero, to_log_file
from project.engine.upstream import STAGE_FUNCTIONS, config_root

P = ParamSpec("P")
R = TypeVar("R")
# A failed sweep job's error line, in its directory, where the sweep's table finds it.
ERROR_FILE = "error.txt"
# The longest value read from a file that a line quotes (`quoted`).
LONGEST_QUOTED = 60
# Less free space than this is a full disk (torch.save's own report of one carries no errno).
FULL_BELOW_BYTES = 1 << 20
# What `instantiate` raises where a constructor refuses its config (Hydra 1.3 wraps it, Hydra 1.4 does not).
CONSTRUCTOR_ERRORS = (InstantiationException, TypeError, ValueError)
# Hydra 1.3's words for an override of a key the config does not have.
NOT_APPLIED = re.compile(r"Could not override '(?P<key>[^']+)'\.\nTo append to your config use \+(?P<override>.+)")
# Hydra's words for `~key` where the config has no such key (it keeps no config to suggest a nearer key from).
NOT_DELETED = re.compile(r"Could not delete from config\. '(?P<key>[^']+)' does not exist\.")
PRINTS_THE_CONFIG = "--cfg job prints the config"
# How alike (difflib's ratio) a name must be to be suggested: `max_epoch` and `max_epochs` are, `max_steps` is not.
CUTOFF = 0.75
# The line of a worker's traceback that names its exception: `project.engine.history.Diverged: training ...`.
EXCEPTION_LINE = re.compile(r"^(?P<module>[A-Za-z_][\w.]*)\.(?P<name>[A-Za-z_]\w*): (?P<message>.*)", re.MULTILINE)
# DDP's reducer found parameters no loss reached, in Lightning's words and torch's (ddp_spawn returns only the text).
UNUSED_PARAMETERS = "parameters that were not used in producing the loss"
TORCH_UNUSED_PARAMETERS = "module has parameters that were not used in producing loss"
# The same with `static_graph=True`, where the set of parameters a loss reaches changes from step to step.
GRAPH_CHANGED = "not compatible with static_graph set to True"
UNUSED_PARAMETERS_LINE = (
    "DDP found parameters that were not used in producing the loss (a GAN's networks trained in turn, a head or "
    "branch no loss reaches): set trainer.strategy.find_unused_parameters=true"
)
GRAPH_CHANGED_LINE = (
    "DDP with trainer.strategy.static_graph=true met a step that used other parameters than the first: set "
    "trainer.strategy.static_graph=false (and trainer.strategy.find_unused_parameters=true where steps leave "
    "parameters out of the loss)"
)
# Lightning 2.6's words where a callback's `monitor` names a metric the module does not log (EarlyStopping's
# RuntimeError, ModelCheckpoint's MisconfigurationException), with the names of those it does log.
MONITOR_NOT_LOGGED = (
    re.compile(
        r"Early stopping conditioned on metric `(?P<monitor>[^`]*)` which is not available\."
        r".*following: (?P<logged>.*)",
        flags=re.DOTALL,
    ),
    re.compile(
        r"`ModelCheckpoint\(monitor='(?P<monitor>[^']*)'\)` could not find the monitored key in the returned "
        r"metrics: \[(?P<logged>[^\]]*)\]"
    ),
)
# What Lightning lists among a module's metrics that it logs itself.
COUNTERS = ("epoch", "step")
# How torch says a collective timed out.
TIMEOUT_WORDS = (
    "Timed out waiting",  # gloo, on the rank whose timer ran out
    "Application timeout caused pair closure",  # gloo, on a rank another rank's timeout cut off
    "Watchdog caught collective operation timeout",  # NCCL
)


class UserError(Exception):
    """A problem in the user's input or environment; its message says what to change. `ends_the_sweep`: every job
    of a sweep would meet it alike."""

    exit_status = 2
    ends_the_sweep = False


class RunStopped(UserError):
    """The run was stopped from outside (SIGTERM, Ctrl-C); its message says how to resume. `on_every_rank`: each
    rank meets it, and of the ranks rank 0 started only it prints the line."""

    ends_the_sweep = True

    def __init__(self, message: str, exit_status: int, on_every_rank: bool = False) -> None:
        super().__init__(message)
        self.exit_status = exit_status
        self.on_every_rank = on_every_rank


def typo_message(error: ConfigCompositionException) -> str | None:
    """The message (without `error: `) for a key or option the config does not have; None for any other error."""
    if isinstance(error, MissingConfigException):
        if error.options and error.missing_cfg_file and "/" in error.missing_cfg_file:
            return unknown_option(error.missing_cfg_file, list(error.options))
        return None
    not_deleted = NOT_DELETED.fullmatch(str(error))
    if not_deleted is not None:
        key = not_deleted["key"]
        return f"~{key} deletes {key}, which is not a key of the config ({PRINTS_THE_CONFIG}): check its spelling"
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
    """The keys nearest to `key`, best first (`trainer.max_epochs` for `trainer.max_epoch` and `trainr.max_epochs`)."""
    parent, _, name = key.rpartition(".")
    parents = [parent] if not parent or parent in keys else nearest_keys(parent, keys)
    beside: dict[str, list[str]] = {}
    for existing in keys:
        existing_parent, _, existing_name = existing.rpartition(".")
        if existing_parent in parents:
            beside.setdefault(existing_name, []).append(existing)
    return [found for near in difflib.get_close_matches(name, beside, n=3, cutoff=CUTOFF) for found in beside[near]]


def dotted_keys(config: object, prefix: str = "") -> list[str]:
    """Every key of a config (a DictConfig or nested dicts), dotted (`trainer.max_epochs`), unresolved."""
    if isinstance(config, DictConfig):
        config = OmegaConf.to_container(config, resolve=False)
    if not isinstance(config, dict):
        return []
    return [
        found for key, value in config.items() for found in (f"{prefix}{key}", *dotted_keys(value, f"{prefix}{key}."))
    ]


def find_user_error(error: BaseException | None) -> BaseException | None:
    """The `UserError` (or Lightning misconfiguration) behind `error`, following its causes, or one made of a library
    error that is the user's (a full disk, a `${...}` naming nothing, memory, DDP's unused parameters, ...)."""
    while error is not None:
        not_logged = monitored_metric_not_logged(error)
        if not_logged is not None:
            return not_logged
        if isinstance(error, (UserError, MisconfigurationException)):
            return error
        if isinstance(error, InterpolationResolutionError):
            return resolvers_refusal(error) or unresolved(error)
        if isinstance(error, OSError) and error.errno in DISK_ERRORS:  # whichever writer met it first
            run_dir = HydraConfig.get().runtime.output_dir if HydraConfig.initialized() else "the run dir"
            return unwritable(Path(error.filename or run_dir), error.errno)
        if is_out_of_memory(error):
            return out_of_memory(error)
        if UNUSED_PARAMETERS in str(error) or TORCH_UNUSED_PARAMETERS in str(error):
            return UserError(UNUSED_PARAMETERS_LINE)
        if GRAPH_CHANGED in str(error):
            return UserError(GRAPH_CHANGED_LINE)
        if isinstance(error, ProcessRaisedException):
            return raised_in_a_worker(str(error))
        error = error.__cause__ or error.__context__
    return None


def monitored_metric_not_logged(error: BaseException) -> UserError | None:
    """Lightning's failure where a callback (EarlyStopping, a ModelCheckpoint of the user's) monitors a metric the
    module does not log, said as the best checkpoint says it for `optimized_metric`: the metrics it does log."""
    for words in MONITOR_NOT_LOGGED:
        found = words.search(str(error))
        if found:
            break
    else:
        return None
    monitor, callback = found["monitor"], "EarlyStopping" if "Early" in words.pattern else "ModelCheckpoint"
    logged = [name for name in re.findall(r"[`']([^`']+)[`']", found["logged"]) if name not in COUNTERS]
    said = f"the {callback} callback's monitor={monitor} is not logged by the module"
    if not logged:
        return UserError(f"{said}, which logs no metric: log one with self.log in the module and make it its monitor")
    return UserError(
        f"{said} (it logs: {', '.join(logged)}): set its monitor (callbacks.<its name>.monitor in the config) to one "
        f"of those, or log {monitor} with self.log in the module"
    )


def raised_in_a_worker(traceback_text: str) -> UserError | None:
    """The user error a ddp_spawn worker raised, rebuilt from the traceback text its parent gets; None for others."""
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


def is_out_of_memory(error: BaseException) -> bool:
    """torch's allocators (the CPU's, CUDA's) and Python's own, out of memory."""
    message = str(error)
    return isinstance(error, MemoryError) or (
        isinstance(error, RuntimeError) and ("can't allocate memory" in message or "out of memory" in message)
    )


def out_of_memory(error: BaseException) -> UserError:
    """The one line for memory running out: where, how much was asked for, and what to make smaller."""
    functions = {frame.name for frame in traceback.extract_tb(error.__traceback__)}
    stage = next((f" {stage}" for function, stage in STAGE_FUNCTIONS.items() if function in functions), "")
    asked = re.search(r"[Tt]ried to allocate ([\d.]+(?: bytes| ?[KMGT]i?B)?)", str(error))
    amount = asked.group(1).removesuffix(" bytes") if asked else ""
    size = f"{int(amount) / 2**30:.3g} GiB" if amount.isdigit() else amount
    asked_for = f" ({size} asked for)" if size else ""
    return UserError(
        f"out of memory{stage}{asked_for}: lower the batch size or the model's size, or run where there is more memory"
    )


def collective_failed(error: BaseException, words: tuple[str, ...]) -> bool:
    """Whether `error` is a collective of this process's group that failed saying one of `words`."""
    initialized = dist.is_available() and dist.is_initialized()
    return isinstance(error, RuntimeError) and initialized and any(said in str(error) for said in words)


def collective_timed_out(error: BaseException) -> bool:
    """Whether a collective waited the group's whole timeout for another rank, here or on a rank that then closed
    its connection to this one."""
    return collective_failed(error, TIMEOUT_WORDS)


def lost_another_rank(error: Exception) -> bool:
    """Whether a collective broke because another process of the run ended (gloo and NCCL say so)."""
    return collective_failed(error, ("remote worker", "remote process"))


def lost_a_loader_worker(error: Exception) -> bool:
    """Whether a DataLoader worker process died (killed, out of memory): torch's report of it, or (whichever comes
    first) the broken connection to one that died handing over a batch."""
    if isinstance(error, RuntimeError) and str(error).lstrip().startswith("DataLoader worker (pid"):
        return True
    frames = traceback.extract_tb(error.__traceback__)
    return isinstance(error, (EOFError, ConnectionError)) and any(
        frame.filename.endswith(os.path.join("torch", "utils", "data", "dataloader.py")) for frame in frames
    )


def loader_timed_out(error: Exception) -> bool:
    """Whether a DataLoader worker sent no batch within the DataLoader's `timeout` (which a data module sets)."""
    return isinstance(error, RuntimeError) and str(error).startswith("DataLoader timed out after")


def unwritable(path: Path, error_number: int | None, detail: str = "") -> UserError:
    """The line for a file the disk would not take: the folder and why (or `detail`), what to do, and which
    checkpoints are kept."""
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
    """Whether the disk of `path` is full, or its folder is not writable."""
    directory = nearest_existing(path)
    return shutil.disk_usage(directory).free < FULL_BELOW_BYTES or not os.access(directory, os.W_OK)


def kept(path: Path) -> str:
    """`kept: <checkpoint files>` of the checkpoint's folder, or for any other file the run dir's."""
    folder = path.parent
    if path.suffix != ".ckpt" and HydraConfig.initialized():
        folder = Path(HydraConfig.get().runtime.output_dir) / "checkpoints"
    written = sorted(file.name for file in folder.glob("*.ckpt")) if folder.is_dir() else []
    return f"kept: {', '.join(written)}" if written else "no checkpoint was written there before it"


def nearest_existing(path: Path) -> Path:
    """`path`'s nearest existing folder: the one a write there must be allowed in."""
    return next(folder for folder in path.parents if folder.exists())


def resolvers_refusal(error: BaseException | None) -> UserError | None:
    """The `UserError` a resolver raised (`${run_steps:2}`) behind OmegaConf's errors, if any."""
    while error is not None and not isinstance(error, UserError):
        error = error.__cause__ or error.__context__
    return error


def unresolved(error: InterpolationResolutionError) -> UserError:
    """The one line for a `${...}` in the config that names nothing there."""
    where, problem = error.full_key or "a ${...} of the config", str(error).splitlines()[0]
    return UserError(
        f"{where}: {problem}: point the ${{...}} at a key the config has (--cfg job prints the config unresolved), "
        "or give the value itself"
    )


def in_sweep_job() -> bool:
    """Whether this process runs one job of a Hydra sweep (its extra DDP ranks run as single runs)."""
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def quoted(value: object, longest: int = LONGEST_QUOTED) -> str:
    """`value`, read from a file, as a line may quote it: its `repr`, escaped (`printable`) and cut to `longest`
    characters, or what kind of container or tensor it is."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {list(value.shape)}"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)}"
    text = printable(repr(value))
    return text if len(text) <= longest else f"{text[: longest - 3]}..."


def error_line(error: BaseException) -> str:
    """The one `error:` line that reports `error`, whitespace folded and control characters escaped."""
    user_error = find_user_error(error)
    if user_error is not None:
        message = str(user_error)
        if "Original Traceback" in message:  # raised in a DataLoader worker, re-raised here with its traceback
            message = message.rstrip().rsplit(f"{type(user_error).__name__}: ", 1)[-1]
        return "error: " + printable(" ".join(message.split()))
    return "error: " + printable(" ".join(traceback.format_exception_only(error)[-1].split()))


def refuse(line: str, status: int = 2) -> NoReturn:
    """End the process in one `error:` line, where no `exit_on_user_error` is around (resolvers, Hydra callbacks)."""
    print(printable(f"error: {line}"), file=sys.stderr, flush=True)
    sys.exit(status)


def exit_on_user_error(function: Callable[P, R]) -> Callable[P, R]:
    """Run `function`; a user error ends it in one `error:` line and its exit status, a bug in its traceback. In a
    sweep's job either fails the job alone (None, `error.txt`), unless it `ends_the_sweep`."""

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
            # A stopped job did not fail: it writes no error.txt.
            if sweep_job and not isinstance(user_error, RunStopped) and process_rank() == 0:
                Path(HydraConfig.get().runtime.output_dir, ERROR_FILE).write_text(line + "\n")
            if sweep_goes_on:
                return None
            sys.exit(getattr(user_error, "exit_status", 2))

    return wrapper


def run_hydra_app(main: Callable[[], object]) -> None:
    """Call an entry point's `@hydra.main` function: invalid YAML and an override the config lacks end in one
    `error:` line, exit 2; Hydra's other errors print as Hydra prints them, exit 1 (HYDRA_FULL_ERROR=1: tracebacks)."""
    asked_for_tracebacks = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra then leaves its errors to its caller, here
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
