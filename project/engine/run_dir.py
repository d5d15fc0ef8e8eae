"""The run directory: one per launch, named alike by each of its processes (`${launch_dir:}`) and claimed so that no
other launch writes there; one given on the command line is checked as the run starts (`RunDirCheck`)."""

import os
import re
import socket
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from project.engine.errors import refuse
from project.engine.run_log import process_rank
from project.engine.sweeps import check_same_sweep
from project.engine.upstream import register_resolver

TIME_FORMAT = "%Y-%m-%d/%H-%M-%S"
# The file in a run dir that says which launch it belongs to.
CLAIM_FILE = ".launch_id"
# The directories this process claimed as it named them (`launch_dir`).
CLAIMED_HERE: set[Path] = set()


def process_start_time(pid: int) -> float:
    """Seconds since the epoch at which process `pid` started (Linux `/proc`)."""
    ticks_since_boot = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    boot_time = next(
        int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime")
    )
    return boot_time + ticks_since_boot / os.sysconf("SC_CLK_TCK")


def is_slurm_task() -> bool:
    """Whether `srun` started this very process as a task (not a shell in `salloc`)."""
    return "SLURM_STEP_ID" in os.environ and os.environ.get("SLURM_TASK_PID") == str(os.getpid())


def multi_node_torchrun() -> bool:
    """Whether torchrun started this process as a worker of a launch that spans several nodes."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    return "TORCHELASTIC_RUN_ID" in os.environ and world_size > int(os.environ.get("LOCAL_WORLD_SIZE", world_size))


def torchrun_run_name() -> str:
    """`--rdzv-id` as a directory name; torchrun's default, "none", is refused: every launch would share it."""
    run_id = os.environ["TORCHELASTIC_RUN_ID"]
    if run_id == "none":
        refuse(
            "a multi-node torchrun launch needs --rdzv-id=<a name for this run> (the same on every node): "
            "its run directory, outputs/torchrun-<name>, is named after it"
        )
    return re.sub(r"[^\w.-]", "_", run_id)


def launch_id() -> str:
    """What names this process's launch in a claim: shared by the processes of a Slurm job step or a torchrun launch
    and by their restarts (which so find their directory theirs again), new for any other process."""
    if is_slurm_task():
        return f"slurm {os.environ['SLURM_JOB_ID']}.{os.environ['SLURM_STEP_ID']}"
    if multi_node_torchrun():
        return f"torchrun {torchrun_run_name()}"
    if "TORCHELASTIC_RUN_ID" in os.environ:
        agent = os.getppid()
        return f"torchrun {agent} {process_start_time(agent)}"
    return f"process {os.getpid()} {time.time_ns()}"


def claim(directory: Path, launch_id: str) -> bool:
    """Make `directory` this launch's unless another launch has; whether it is ours. Linked into place whole, the claim
    file goes to exactly one of the launches racing for it."""
    directory.mkdir(parents=True, exist_ok=True)
    claim_file = directory / CLAIM_FILE
    draft = directory / f".{CLAIM_FILE}.{socket.gethostname()}.{os.getpid()}"  # hosts can share pids (containers)
    draft.write_text(launch_id)
    try:
        os.link(draft, claim_file)
    except FileExistsError:
        pass
    finally:
        draft.unlink()
    return claim_file.read_text() == launch_id


def claimed(name: str, launch_id: str) -> str:
    """`name`, or the first of `name-1`, `name-2`, ... that is not another launch's, claimed for `launch_id`."""
    candidate, suffix = name, 0
    while not claim(Path(candidate), launch_id):
        suffix += 1
        candidate = f"{name}-{suffix}"
    CLAIMED_HERE.add(Path(candidate).resolve())
    return candidate


def launch_dir(parent: str = "outputs") -> str:
    """This process's run (or sweep) directory below `parent`, claimed for its launch: named after the Slurm step,
    the torchrun `--rdzv-id`, the torchrun agent's start, or now."""
    if is_slurm_task():
        return f"{parent}/slurm-{os.environ['SLURM_JOB_ID']}.{os.environ['SLURM_STEP_ID']}"
    if multi_node_torchrun():
        return claimed(f"{parent}/torchrun-{torchrun_run_name()}", launch_id())
    started = process_start_time(os.getppid()) if "TORCHELASTIC_RUN_ID" in os.environ else time.time()
    return claimed(f"{parent}/{time.strftime(TIME_FORMAT, time.localtime(started))}", launch_id())


def on_rank_zero(value: str) -> str | None:
    """`value` in the rank-0 process, None (Hydra: "don't write") in the others."""
    return value if process_rank() == 0 else None


def rank_log_suffix() -> str:
    """ "" for rank 0, ".rank<N>" for the others: each process logs to its own file in the shared run dir."""
    rank = process_rank()
    return f".rank{rank}" if rank else ""


def register_resolvers() -> None:
    resolvers = {"launch_dir": launch_dir, "on_rank_zero": on_rank_zero, "rank_log_suffix": rank_log_suffix}
    for name, resolver in resolvers.items():
        if not OmegaConf.has_resolver(name):
            register_resolver(name, resolver, use_cache=True)


def names_a_url(path: object) -> bool:
    """Whether `path` is a URL or an fsspec chain (`http://`, `s3://`, fsspec's `local://`, `simplecache::`), which
    Lightning and torch.hub would open through the network or another file system, not as a local path."""
    return "://" in str(path) or "::" in str(path)


def plain_path_inside(path: object, directory: str | Path) -> bool:
    """Whether `path`, read from a file (a checkpoint's callback state, a study's job dir), is plainly a place inside
    `directory`: a local path (no URL, no `~`) that resolves inside `directory`, `..` and symbolic links followed
    as the kernel would follow them, a relative one from the working directory as Lightning takes it. Nothing is
    opened: another run's or machine's path is judged by its name and this machine's links alone."""
    if not isinstance(path, str) or not path or names_a_url(path) or path.startswith("~") or "\0" in path:
        return False
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(directory))


def carries_on(directory: Path, ckpt_path: str | None) -> bool:
    """Whether a run in `directory` resumes the run already there: `ckpt_path=last` (its own last.ckpt), or a
    checkpoint inside it."""
    if ckpt_path == "last":
        return (directory / "checkpoints" / "last.ckpt").is_file()
    return ckpt_path is not None and directory.resolve() in Path(ckpt_path).resolve().parents


def check_run_dir_is_this_runs(directory: Path, ckpt_path: str | None) -> None:
    """End, in one line, a run told to write into a directory that holds another run, unless it carries that run on
    or its own launch claimed it (an earlier attempt of it too); then claim it. Rank 0 alone asks."""
    claim_file = directory / CLAIM_FILE
    this_launch = launch_id()
    if directory.resolve() in CLAIMED_HERE or (claim_file.is_file() and claim_file.read_text() == this_launch):
        return
    checkpoints = directory / "checkpoints"
    found = ["results.json"] if (directory / "results.json").is_file() else []
    if checkpoints.is_dir() and any(path.is_file() for path in checkpoints.iterdir()):
        found.append("checkpoints/")
    if found and not carries_on(directory, ckpt_path):
        refuse(
            f"hydra.run.dir={directory} already holds another run ({', '.join(found)}), which this run would "
            "write over: give a new directory, or carry that run on with ckpt_path=last"
        )
    claim_file.write_text(this_launch)


class RunDirCheck(Callback):
    """Before a run starts, make its directory or end in one line naming it; refuse a run directory that holds another
    run (`check_run_dir_is_this_runs`) and a sweep directory that holds another sweep (`check_same_sweep`)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.make(config.hydra.run.dir, "hydra.run.dir")
        if process_rank() == 0:
            check_run_dir_is_this_runs(Path(config.hydra.run.dir), config.get("ckpt_path"))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.make(config.hydra.sweep.dir, "hydra.sweep.dir")
        check_same_sweep(config)

    @staticmethod
    def make(directory: str, key: str) -> None:
        try:
            Path(directory).mkdir(parents=True, exist_ok=True)
            problem = None if os.access(directory, os.W_OK) else "it exists but cannot be written"
        except OSError as error:
            problem = error.strerror
        if problem is not None:  # an existing one Hydra's log file would fail in, with logging's traceback
            refuse(
                f"the run's directory {directory} cannot be made or written in ({problem}): give {key} a "
                "directory you can write, or run from one"
            )


def shown(directory: Path) -> str:
    """`directory` relative to the working directory where it lies below it (`outputs/...`), else absolute."""
    absolute, here = directory.resolve(), Path.cwd().resolve()
    return str(absolute.relative_to(here)) if absolute.is_relative_to(here) else str(absolute)
