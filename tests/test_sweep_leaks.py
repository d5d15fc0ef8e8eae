"""A `-m` sweep runs its jobs one after another in one process (Hydra's basic launcher): each job gives back what it
took, so the thousandth job of a search starts where the first did (threads, open files, child processes)."""

import json
from pathlib import Path

import pytest

from bench.sweep_leaks import rows
from tests.faults import SWEEP_FAILED, TESTS_IMPORTABLE, last_line
from tests.helpers import run_module

JOBS = 6


@pytest.mark.slow
def test_each_job_of_a_sweep_leaves_the_threads_files_and_processes_the_first_one_left(tmp_path: Path):
    """Every logger at once (TensorBoard's writer thread, CSV's file, MLflow's where its part is here), and job 2
    fails (it diverges): after job 1 and after job 6 the process holds the same threads, descriptors and children, and
    no job's trainer (with its module's weights and data) outlives its job."""
    footprints = tmp_path / "footprints.jsonl"
    result = run_module(
        "project.train",
        "-m",
        "trainer=cpu",
        "logger=many",
        "model.optimizer.lr=0.5,1e4" + ",0.5" * (JOBS - 2),
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        "+hydra.callbacks.footprint._target_=bench.sweep_leaks.JobFootprint",
        f"+hydra.callbacks.footprint.out={footprints}",
        cwd=tmp_path,
        env=TESTS_IMPORTABLE,
    )
    assert result.returncode == SWEEP_FAILED, result.stderr[-2000:]
    assert last_line(result.stderr).startswith(f"error: 1 of {JOBS} sweep jobs failed (job 1): "), result.stderr
    after = [json.loads(line) for line in footprints.read_text().splitlines()]
    assert [footprint["job"] for footprint in after] == list(range(1, JOBS + 1))
    assert [footprint["trainers_left"] for footprint in after] == [0] * JOBS, "a job's trainer outlived it"
    first, last = after[0], after[-1]
    for kept in ("threads", "fds", "children"):
        assert last[kept] == first[kept], (kept, after)
    [(label, threads, note)] = rows({"after_job": {"1": first, str(JOBS): last}})  # the bench's row of these
    assert (label, threads) == (f"sweep: threads after jobs 1/{JOBS}", f"{first['threads']}/{last['threads']}")
    assert note.startswith(f"fds {first['fds']}/{last['fds']}, child processes 0/0, RSS "), note
