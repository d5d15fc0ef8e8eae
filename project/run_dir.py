"""The run directory's name, computed alike by every process of one launch.

Hydra's `${now:...}` is resolved by each process on its own. Lightning's DDP children are told the parent's
directory, but torchrun workers and Slurm tasks each start Hydra themselves and could land a second apart, in two
directories. `${launch_dir:}` (used by `hydra.run.dir` and `hydra.sweep.dir` in conf/train.yaml) names the launch
instead of the moment:
- a Slurm step (`srun`): `slurm-<job id>.<step id>`, which a requeued job gets again, so it finds its checkpoints;
- a torchrun worker: the date and time the torchrun agent (the workers' parent process) started;
- anything else: the date and time now.
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


def register_resolvers() -> None:
    if not OmegaConf.has_resolver("launch_dir"):
        OmegaConf.register_new_resolver("launch_dir", launch_dir, use_cache=True)
