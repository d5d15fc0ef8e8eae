"""The run directory's name, computed alike by every process of one launch.

Hydra's `${now:...}` is resolved by each process on its own. Lightning's DDP children are told the parent's
directory, but torchrun workers and Slurm tasks each start Hydra themselves and could land a second apart, in two
directories. `${launch_dir:}` (used by `hydra.run.dir` and `hydra.sweep.dir` in conf/train.yaml) names the launch
instead of the moment:
- a Slurm step (`srun`): `slurm-<job id>.<step id>`, which a requeued job gets again, so it finds its checkpoints;
- a torchrun worker: the date and time the torchrun agent (the workers' parent process) started;
- anything else: the date and time now.

Every process of a launch writes into that one directory, so only rank 0 saves Hydra's `.hydra/` config
(`${rank_zero_only:...}`) and the others log to `<job>.rank<N>.log` (`${rank_log_suffix:}`).
"""

import os
import time
from pathlib import Path

from omegaconf import OmegaConf

TIME_FORMAT = "%Y-%m-%d/%H-%M-%S"


def _process_start_time(pid: int) -> float:
    """Seconds since the epoch at which process `pid` started (Linux `/proc`)."""
    ticks_since_boot = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    boot_time = next(
        int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime")
    )
    return boot_time + ticks_since_boot / os.sysconf("SC_CLK_TCK")


def launch_dir() -> str:
    """The run directory's name below `outputs/` (or `outputs/multirun/`) for this process's launch."""
    if "SLURM_JOB_ID" in os.environ and "SLURM_STEP_ID" in os.environ:
        return f"slurm-{os.environ['SLURM_JOB_ID']}.{os.environ['SLURM_STEP_ID']}"
    started = time.time()
    if "TORCHELASTIC_RUN_ID" in os.environ:
        started = _process_start_time(os.getppid())
    return time.strftime(TIME_FORMAT, time.localtime(started))


def process_rank() -> int:
    """This process's rank as its launcher announced it (torchrun: RANK, srun: SLURM_PROCID, Lightning: LOCAL_RANK)."""
    for variable in ("RANK", "SLURM_PROCID", "LOCAL_RANK"):
        rank = int(os.environ.get(variable, "0"))
        if rank > 0:
            return rank
    return 0


def rank_zero_only(value: str) -> str | None:
    """`value` in the rank-0 process, None (Hydra: "don't write") in the others."""
    return value if process_rank() == 0 else None


def rank_log_suffix() -> str:
    """ "" for rank 0, ".rank<N>" for the others: each process logs to its own file in the shared run dir."""
    rank = process_rank()
    return f".rank{rank}" if rank else ""


def register_resolvers() -> None:
    resolvers = {"launch_dir": launch_dir, "rank_zero_only": rank_zero_only, "rank_log_suffix": rank_log_suffix}
    for name, resolver in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver, use_cache=True)
