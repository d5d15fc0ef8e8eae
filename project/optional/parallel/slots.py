"""The places a sweep's jobs run side by side on one machine: which GPUs and which CPU cores each job is given.

A slot is the share one running job has: `devices_per_job` GPUs of the visible ones (none on a CPU machine) and an
equal share of the cores this process may run on. A job is started only in a free slot, so no two running jobs share
a GPU or a core. On a CPU machine a device is a core: `devices_per_job=2` gives each job two cores, for the two ranks
of `trainer=ddp trainer.devices=2`; a job that asks for more devices than its slot has is refused (`check_job_fits`).
"""

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from project.engine.errors import UserError


@dataclass(frozen=True)
class Slot:
    number: int
    gpus: tuple[str, ...]  # CUDA_VISIBLE_DEVICES of its jobs; empty on a CPU machine
    cores: tuple[int, ...]  # the CPU cores its jobs may run on (their affinity, and their thread count)

    def describe(self) -> str:
        gpus = f"GPU {','.join(self.gpus)}, " if self.gpus else ""
        return f"slot {self.number} ({gpus}{cores_text(self.cores)})"


def cores_text(cores: tuple[int, ...]) -> str:
    """`core 3`, `cores 0-7`, `cores 0,2,4`: runs of consecutive cores as ranges."""
    runs: list[list[int]] = []
    for core in sorted(cores):
        if runs and core == runs[-1][-1] + 1:
            runs[-1].append(core)
        else:
            runs.append([core])
    text = ",".join(f"{run[0]}-{run[-1]}" if len(run) > 2 else ",".join(map(str, run)) for run in runs)
    return f"core{'s' if len(cores) > 1 else ''} {text}"


def visible_gpus() -> list[str]:
    """The GPUs this process may use: CUDA_VISIBLE_DEVICES where it is set (ids or UUIDs), else every GPU torch
    counts. Asked without creating a CUDA context, so the jobs' devices are still theirs to set."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [gpu.strip() for gpu in listed.split(",") if gpu.strip() and not gpu.strip().startswith("-")]
    import torch  # only where no variable says it: torch is seconds of imports

    return [str(index) for index in range(torch.cuda.device_count())]


def plan_slots(gpus: list[str], cores: list[int], devices_per_job: int, jobs_at_once: int | None) -> list[Slot]:
    """The slots for `gpus` (empty: a CPU machine) and `cores`, or one line saying why there can be none."""
    if not (isinstance(devices_per_job, int) and devices_per_job >= 1):
        raise UserError(f"hydra.launcher.devices_per_job must be a whole number >= 1, got {devices_per_job!r}")
    if jobs_at_once is not None and not (isinstance(jobs_at_once, int) and jobs_at_once >= 1):
        raise UserError(f"hydra.launcher.jobs_at_once must be a whole number >= 1 or null, got {jobs_at_once!r}")
    if len(set(gpus)) != len(gpus):
        raise UserError(f"hydra.launcher.devices lists a GPU twice ({','.join(gpus)}): list each once")
    if gpus:
        if len(gpus) < devices_per_job:
            raise UserError(
                f"hydra.launcher.devices_per_job={devices_per_job} but {len(gpus)} GPU(s) are there "
                f"({','.join(gpus)}): lower it, or list more with hydra.launcher.devices"
            )
        count = len(gpus) // devices_per_job
        count = min(count, jobs_at_once or count)
    else:
        count = jobs_at_once or max(1, len(cores) // devices_per_job)
    share = len(cores) // count
    if not gpus and share < devices_per_job:
        raise UserError(
            f"{count} job(s) at once of {devices_per_job} cores each (hydra.launcher.devices_per_job) need "
            f"{count * devices_per_job} cores, and this process may run on {len(cores)}: lower "
            "hydra.launcher.jobs_at_once or devices_per_job"
        )
    if share == 0:
        raise UserError(
            f"{count} jobs at once would not each have a CPU core of their own (this process may run on "
            f"{len(cores)}): lower hydra.launcher.jobs_at_once to {len(cores)} or fewer"
        )
    return [
        Slot(
            number,
            tuple(gpus[number * devices_per_job : (number + 1) * devices_per_job]),
            tuple(cores[number * share : (number + 1) * share]),
        )
        for number in range(count)
    ]


def devices_asked(devices: Any) -> int | None:
    """How many devices a job's `trainer.devices` names, as Lightning reads it (a count, a list of ids, "0,1", "2");
    None where it takes what there is ("auto", -1) or names nothing."""
    if isinstance(devices, str) and "," in devices:
        return len([part for part in devices.split(",") if part.strip()])
    if isinstance(devices, str):
        devices = int(devices) if devices.strip().isdigit() else None
    if isinstance(devices, int) and not isinstance(devices, bool):
        return devices if devices > 0 else None
    return len(devices) if isinstance(devices, Sequence) else None


def check_job_fits(slot: Slot, devices: Any) -> None:
    """Refuse a job whose `trainer.devices` asks for more than its slot has: on a CPU slot, more processes (DDP
    ranks) than cores, which would share cores and each train slower than the job would one at a time; on a GPU slot,
    more GPUs than it sees."""
    asked = devices_asked(devices)
    has, kind = (len(slot.gpus), "GPU") if slot.gpus else (len(slot.cores), "core")
    if asked is not None and asked > has:
        per_job = "GPUs" if slot.gpus else "cores, one per process"
        raise UserError(
            f"trainer.devices={devices} asks for {asked} devices, and hydra/launcher=parallel gave this job "
            f"{slot.describe()}, {has} {kind}(s): set hydra.launcher.devices_per_job={asked} (each job {asked} "
            f"{per_job}), or trainer.devices={has}"
        )
