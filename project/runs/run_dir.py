"""The run directory, computed alike by every process of one launch and by no other launch.

Hydra's `${now:...}` is resolved by each process on its own, and two launches in the same second get the same
value. `${launch_dir:<parent>}` (used by `hydra.run.dir` and `hydra.sweep.dir` in conf/train.yaml) names the launch
instead of the moment:
- a task that `srun` started (the program itself, not a shell in `salloc` or `srun --pty bash`):
  `slurm-<job id>.<step id>`, which a requeued job gets again, so it finds its checkpoints;
- a worker of a multi-node torchrun launch: `torchrun-<rendezvous id>` (`--rdzv-id`), the one name every node
  knows; the same line run again with that id (a relaunch, or Kubernetes restarting the job) finds it again;
- a worker of a one-node torchrun launch: the date and time the torchrun agent (the workers' parent process)
  started, which its elastic restarts share;
- anything else: the date and time now.
Each launch but a Slurm task then claims its directory (`claim`): a launch that finds it claimed by another takes
the same name with `-1`, `-2`, ... appended. Lightning's DDP children are given their parent's directory.

Every process of a launch writes into that one directory, so only rank 0 saves Hydra's `.hydra/` config
(`${on_rank_zero:...}`) and the others log to `<job>.rank<N>.log` (`${rank_log_suffix:}`).
"""

import os
import re
import socket
import sys
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

TIME_FORMAT = "%Y-%m-%d/%H-%M-%S"
# The file in a run dir that says which launch it belongs to.
CLAIM_FILE = ".launch_id"


def _process_start_time(pid: int) -> float:
    """Seconds since the epoch at which process `pid` started (Linux `/proc`)."""
    ticks_since_boot = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    boot_time = next(
        int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime")
    )
    return boot_time + ticks_since_boot / os.sysconf("SC_CLK_TCK")


def is_slurm_task() -> bool:
    """Whether `srun` started this very process as a task (then it has ranks, and siblings on other nodes)."""
    return "SLURM_STEP_ID" in os.environ and os.environ.get("SLURM_TASK_PID") == str(os.getpid())


def multi_node_torchrun() -> bool:
    """Whether torchrun started this process as a worker of a launch that spans several nodes."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    return "TORCHELASTIC_RUN_ID" in os.environ and world_size > int(os.environ.get("LOCAL_WORLD_SIZE", world_size))


def torchrun_run_name() -> str:
    """`--rdzv-id` as a directory name.

    torchrun's default id, "none", ends the process in one line: every launch would share that name. (It ends here,
    as Hydra resolves the run dir: an exception would reach the user as OmegaConf's and Hydra's tracebacks.)
    """
    run_id = os.environ["TORCHELASTIC_RUN_ID"]
    if run_id == "none":
        print(
            "error: a multi-node torchrun launch needs --rdzv-id=<a name for this run> (the same on every node): "
            "its run directory, outputs/torchrun-<name>, is named after it",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(2)
    return re.sub(r"[^\w.-]", "_", run_id)


def claim(directory: Path, launch_id: str) -> bool:
    """Make `directory` this launch's, unless another launch has; whether it is ours.

    The claim file is linked into place whole, so of processes racing for one directory exactly one launch wins,
    and the processes of that launch (same `launch_id`) all find it theirs.
    """
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


def launch_dir(parent: str = "outputs") -> str:
    """This process's run (or sweep) directory below `parent`, claimed for its launch."""
    if is_slurm_task():
        return f"{parent}/slurm-{os.environ['SLURM_JOB_ID']}.{os.environ['SLURM_STEP_ID']}"
    if multi_node_torchrun():
        run_name = torchrun_run_name()
        return claimed(f"{parent}/torchrun-{run_name}", f"torchrun {run_name}")
    if "TORCHELASTIC_RUN_ID" in os.environ:
        agent = os.getppid()
        started = _process_start_time(agent)
        launch_id = f"torchrun {agent} {started}"
    else:
        started = time.time()
        launch_id = f"process {os.getpid()} {time.time_ns()}"
    return claimed(f"{parent}/{time.strftime(TIME_FORMAT, time.localtime(started))}", launch_id)


def claimed(name: str, launch_id: str) -> str:
    """`name`, or the first of `name-1`, `name-2`, ... that is not another launch's, claimed for `launch_id`."""
    candidate, suffix = name, 0
    while not claim(Path(candidate), launch_id):
        suffix += 1
        candidate = f"{name}-{suffix}"
    return candidate


def process_rank() -> int:
    """This process's rank as its launcher announced it (torchrun: RANK, srun: SLURM_PROCID, Lightning: LOCAL_RANK)."""
    for variable in ("RANK", "SLURM_PROCID", "LOCAL_RANK"):
        rank = int(os.environ.get(variable, "0"))
        if rank > 0:
            return rank
    return 0


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
            OmegaConf.register_new_resolver(name, resolver, use_cache=True)


class RunDirCheck(Callback):
    """Before a run starts, make its directory, or end with one line naming it (Hydra would show a traceback)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._make(config.hydra.run.dir, "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._make(config.hydra.sweep.dir, "hydra.sweep.dir")

    @staticmethod
    def _make(directory: str, key: str) -> None:
        try:
            Path(directory).mkdir(parents=True, exist_ok=True)
        except OSError as error:
            print(
                f"error: cannot make the run's directory {directory} ({error.strerror}): give {key} a directory "
                "you can write, or run from one",
                file=sys.stderr,
                flush=True,
            )
            sys.exit(2)
