"""Which rank this process is, and who started it, as its launcher's environment variables say.

Standard library only: `project.engine.startup` asks before the libraries are imported.
"""

import os


def process_rank() -> int:
    """This process's rank as its launcher announced it (torchrun: RANK, srun: SLURM_PROCID, Lightning: LOCAL_RANK)."""
    for variable in ("RANK", "SLURM_PROCID", "LOCAL_RANK"):
        rank = int(os.environ.get(variable, "0"))
        if rank > 0:
            return rank
    return 0


def started_by_rank_zero() -> bool:
    """Whether this process is a rank that rank 0 itself started (Lightning's own DDP launcher), which then reports
    for it. Ranks srun or torchrun start each report: a signal may end rank 0 before it can (Slurm's requeue)."""
    launched = "SLURM_PROCID" in os.environ or "TORCHELASTIC_RUN_ID" in os.environ
    return process_rank() != 0 and not launched
