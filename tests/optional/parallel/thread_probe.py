"""A test-only callback that writes, from inside a job's training, the threads its process trains with: read here,
apart from the launcher's own line, so that a test compares the launcher's promise with what torch and OpenMP do."""

import ctypes
import json
import os
from pathlib import Path

import lightning as L
import torch


def openmp_max_threads() -> int:
    """`omp_get_max_threads()` of the OpenMP library this process loaded (torch's own libgomp, found among the
    process's mappings: loading another copy by name would ask a library that runs nothing)."""
    mapped = (line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines() if "/" in line)
    return ctypes.CDLL(next(path for path in mapped if "libgomp" in Path(path).name)).omp_get_max_threads()


class ThreadsSeen(L.Callback):
    """After the first training step: `threads.rank<N>.json` in the run dir (the job's dir, every rank's)."""

    def __init__(self) -> None:
        self.written = False

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        if self.written:
            return
        seen = {
            "pid": os.getpid(),
            "cores": sorted(os.sched_getaffinity(0)),
            "intra_op": torch.get_num_threads(),
            "inter_op": torch.get_num_interop_threads(),
            "openmp": openmp_max_threads(),
        }
        Path(trainer.default_root_dir, f"threads.rank{trainer.global_rank}.json").write_text(json.dumps(seen))
        self.written = True
