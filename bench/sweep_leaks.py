"""What a `-m` sweep's jobs leave behind: threads, open file descriptors, child processes and resident memory of the
process that runs them all (Hydra's basic launcher), after jobs 1, 50 and 200 of a 200-job toy sweep (20 jobs with
`--quick`: after 1, 10 and 20).

Each job should end with what the first one ended with: a thread or descriptor that a job leaves (a logger's writer
that nothing closed) adds up to a thousand in a thousand-trial search. `JobFootprint`, a Hydra callback, records
them after each job; tests/test_sweep_leaks.py uses it too.
"""

import gc
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import lightning as L
from hydra.experimental.callback import Callback

from bench.report import Row
from bench.settings import Settings

REPO = Path(__file__).resolve().parents[1]
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def footprint() -> dict[str, int | float]:
    """This process's threads (Python's, and the OS's, torch's pools included), open file descriptors, child
    processes and resident memory (MB), read from /proc (Linux)."""
    children = [pid for task in Path("/proc/self/task").iterdir() for pid in children_of(task)]
    resident_pages = int(Path("/proc/self/statm").read_text().split()[1])
    return {
        "threads": threading.active_count(),
        "os_threads": len(os.listdir("/proc/self/task")),
        "fds": len(os.listdir("/proc/self/fd")) - 1,  # not the listing's own descriptor
        "children": len(children),
        "rss_mb": resident_pages * PAGE_BYTES / 2**20,
    }


def trainers() -> int:
    """How many Lightning trainers this process still holds (with their modules' weights and data)."""
    return sum(isinstance(thing, L.Trainer) for thing in gc.get_objects())


def children_of(task: Path) -> list[str]:
    """The child processes a thread of this process started (none where the thread ended as it was listed: torch's
    short-lived threads do)."""
    try:
        return (task / "children").read_text().split()
    except FileNotFoundError:
        return []


class JobFootprint(Callback):
    """Appends after each job `footprint()` as one JSON line with the job's number (from 1) to `out`, and the
    `trainers()` that earlier jobs left, counted as this one started (Hydra calls the callbacks' `on_job_end` last one
    first, so this one's runs before the engine's own end of the job, `FreeJobMemory`). Pass it as
    `+hydra.callbacks.footprint._target_=bench.sweep_leaks.JobFootprint +hydra.callbacks.footprint.out=<file>`.
    """

    def __init__(self, out: str) -> None:
        self.out = Path(out)
        self.trainers_left = 0

    def on_job_start(self, config: Any, **kwargs: Any) -> None:
        self.trainers_left = trainers()

    def on_job_end(self, config: Any, job_return: Any, **kwargs: Any) -> None:
        job = {"job": config.hydra.job.num + 1, **footprint(), "trainers_left": self.trainers_left}
        with self.out.open("a") as lines:
            lines.write(json.dumps(job) + "\n")


def sweep_footprints(jobs: int, scratch: Path, overrides: tuple[str, ...] = ()) -> list[dict]:
    """Run a toy sweep of `jobs` jobs (one seed each) in one process; its `JobFootprint` lines, in job order."""
    out = scratch / "footprints.jsonl"
    command = [
        sys.executable,
        "-m",
        "project.train",
        "-m",
        "trainer=cpu",
        f"seed=range(0,{jobs})",
        *overrides,
        f"hydra.sweep.dir={scratch / 'sweep'}",
        "+hydra.callbacks.footprint._target_=bench.sweep_leaks.JobFootprint",
        f"+hydra.callbacks.footprint.out={out}",
    ]
    with (scratch / "sweep.log").open("w") as log:
        subprocess.run(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, check=True)
    footprints = [json.loads(line) for line in out.read_text().splitlines()]
    if len(footprints) != jobs:  # Hydra reports a callback's failure as a warning in the log and goes on
        raise RuntimeError(
            f"{len(footprints)} of {jobs} jobs were recorded: {(scratch / 'sweep.log').read_text()[-3000:]}"
        )
    return footprints


def run(settings: Settings, recipe: list[str], scratch: Path) -> dict:
    """(The toy default: `recipe` is not used.)"""
    shown = (1, 10, 20) if settings.quick else (1, 50, 200)
    jobs = shown[-1]
    footprints = sweep_footprints(jobs, scratch)
    return {"jobs": jobs, "after_job": {str(job): footprints[job - 1] for job in shown}}


def rows(result: dict) -> list[Row]:
    after = result["after_job"]

    def each(key: str, form: str = "{}") -> str:
        return "/".join(form.format(footprint[key]) for footprint in after.values())

    jobs = "/".join(after)
    note = (
        f"fds {each('fds')}, child processes {each('children')}, RSS {each('rss_mb', '{:.0f}')} MB, OS threads "
        f"{each('os_threads')}"
    )
    return [(f"sweep: threads after jobs {jobs}", each("threads"), note)]
