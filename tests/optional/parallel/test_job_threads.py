"""Each job of `hydra/launcher=parallel` trains with the threads of its slot's cores, as its own process sees them
from inside its training (tests/optional/parallel/thread_probe.py), on every road a job takes: a worker's first job,
a worker's next job, a job's DDP ranks. In fresh interpreters, as a user's: torch sizes its threads as it is
imported, which the tests' preloaded Python did long before. The launcher runs on two cores (`taskset`), so the
slots are those of the 2-core machine the issue was found on, whatever this one has.
"""

import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from tests.faults import SWEEP_FAILED, TESTS_IMPORTABLE, last_line
from tests.helpers import check_ok, read_json, run_module

pytestmark = [
    pytest.mark.slow,
    pytest.mark.fresh,
    pytest.mark.skipif(shutil.which("taskset") is None or len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores"),
]
PROBE = "+callbacks.threads._target_=tests.optional.parallel.thread_probe.ThreadsSeen"
ANNOUNCED = re.compile(r"cores (?P<cores>[\d,]+): (\d+) intra-op, (\d+) inter-op, (\d+) OpenMP thread\(s\)")


def two_core_sweep(tmp_path: Path, *overrides: str):
    """A toy sweep of one epoch per job, side by side, its launcher on two of this machine's cores."""
    two_cores = ",".join(map(str, sorted(os.sched_getaffinity(0))[:2]))
    return run_module(
        "project.train",
        "-m",
        "trainer.max_epochs=1",
        "logger=none",
        PROBE,
        "hydra/launcher=parallel",
        *overrides,
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=tmp_path,
        env=TESTS_IMPORTABLE,
        launcher=("taskset", "-c", two_cores, sys.executable),
    )


def seen(job_dir: Path, rank: int = 0) -> dict:
    return read_json(job_dir / f"threads.rank{rank}.json")


def announced(job_dir: Path) -> tuple[int, ...]:
    """The launcher's line in the job's train.log: its cores' count, and its intra-op, inter-op, OpenMP threads."""
    [found] = ANNOUNCED.findall((job_dir / "train.log").read_text())
    return (len(found[0].split(",")), *map(int, found[1:]))


def test_each_job_of_a_one_core_slot_trains_with_one_thread_in_a_new_worker_and_in_a_reused_one(tmp_path: Path):
    """Two 1-core slots, three jobs: the third runs in the worker that ended its first job first."""
    check_ok(two_core_sweep(tmp_path, "trainer=cpu", "seed=1,2,3", "hydra.launcher.jobs_at_once=2"))
    jobs = [seen(tmp_path / "sweep" / str(job)) for job in range(3)]
    for job, threads in enumerate(jobs):
        assert len(threads["cores"]) == 1, threads
        assert (threads["intra_op"], threads["inter_op"], threads["openmp"]) == (1, 1, 1), (job, threads)
        assert announced(tmp_path / "sweep" / str(job)) == (1, 1, 1, 1)
    assert jobs[0]["cores"] != jobs[1]["cores"], "the two slots share no core"
    assert jobs[2]["pid"] in (jobs[0]["pid"], jobs[1]["pid"]), "the third job ran in a worker that had run one"


def test_a_two_core_slot_gives_its_job_two_threads_its_ddp_ranks_one_each_and_refuses_three_ranks(tmp_path: Path):
    """One 2-core slot (devices_per_job=2), its jobs one after another in one worker: `trainer.devices=1` (one
    process), `2` (two DDP ranks), `3` (more ranks than cores: refused in one line). The tests' environment sets
    OMP_NUM_THREADS=1, as a cluster's shell may: the slot's cores decide all the same."""
    result = two_core_sweep(tmp_path, "trainer=ddp", "trainer.devices=1,2,3", "hydra.launcher.devices_per_job=2")
    assert result.returncode == SWEEP_FAILED, result.stderr[-3000:]
    sweep = tmp_path / "sweep"
    one_process, first_rank, second_rank = seen(sweep / "0"), seen(sweep / "1", rank=0), seen(sweep / "1", rank=1)
    assert len(one_process["cores"]) == 2
    assert (one_process["intra_op"], one_process["inter_op"], one_process["openmp"]) == (2, 2, 2), one_process
    assert announced(sweep / "0") == (2, 2, 2, 2)
    assert first_rank["pid"] == one_process["pid"], "rank 0 of job 1 is the worker that ran job 0"
    for rank in (first_rank, second_rank):  # Lightning's share: the slot's cores divided among the ranks
        assert rank["cores"] == one_process["cores"] and (rank["intra_op"], rank["openmp"]) == (1, 1), rank
    refused = (
        "error: trainer.devices=3 asks for 3 devices, and hydra/launcher=parallel gave this job slot 0 "
        f"(cores {','.join(map(str, one_process['cores']))}), 2 core(s): set hydra.launcher.devices_per_job=3 (each "
        "job 3 cores, one per process), or trainer.devices=2"
    )
    assert (sweep / "2" / "error.txt").read_text().strip() == refused
    assert not list((sweep / "2").glob("threads.rank*.json")), "the refused job trained nothing"
    assert last_line(result.stderr).startswith("error: 1 of 3 sweep jobs failed (job 2)"), result.stderr[-2000:]
