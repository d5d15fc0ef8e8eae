"""`python -m bench --quick --only side_by_side` and its GPU variant: the sweeps it times run to their end, one at a
time and side by side, and the table prints what each sweep's jobs trained with, as the jobs themselves recorded it
(no timing asserted: benchmarks are not tests)."""

import os
from pathlib import Path

import pytest

from bench.side_by_side import conditions
from tests.bench_runs import one_thread, preloaded_runs, run_quick_bench  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.slow, pytest.mark.realdata, pytest.mark.usefixtures("preloaded_runs")]
WORKLOADS = {"toy 5 epochs", "toy 30 epochs", "mnist recipe"}


def test_the_side_by_side_suite_times_the_readme_command_and_prints_each_jobs_cores_and_threads(tmp_path: Path, capsys):
    stdout, results = run_quick_bench(tmp_path, capsys, "--only", "side_by_side")

    sweeps = results["side_by_side"]["sweeps"]
    assert set(sweeps) == {"one at a time", "2 at once"}
    cores = len(os.sched_getaffinity(0))
    for name, timed in sweeps.items():
        assert set(timed) == WORKLOADS
        assert timed["toy 30 epochs"]["job_fit_s"] > timed["toy 5 epochs"]["job_fit_s"] > 0
        for load, sweep in timed.items():
            assert len(sweep["job_threads"]) == 2
            for seen in sweep["job_threads"]:
                # Side by side: half the cores each, and as many threads; one at a time: every core, and the
                # threads the bench's environment sets (one, tests/bench_runs.py).
                expected = (cores // 2, cores // 2) if name == "2 at once" else (cores, 1)
                assert (seen["cores"], seen["intra_op"]) == expected, (name, load, seen)
                assert seen["device"] == "cpu"
            assert f"  {load}, {name}: {conditions(sweep['job_threads'])}" in stdout
    half = cores // 2
    printed = f"mnist recipe, 2 at once: {half} core(s): {half} intra-op, {half} inter-op, {half} OpenMP thread(s), cpu"
    assert f"  {printed} (job 0, 1)" in stdout
    assert "sweep 2 at once / one at a time, mnist recipe" in stdout
    assert "sweep 2 at once pays from toy jobs of" in stdout


def test_the_gpu_variant_times_one_gpu_jobs_one_at_a_time_and_side_by_side(tmp_path: Path, capsys):
    """`--gpu`'s code path, checked here with `--device cpu` (its jobs then train on the CPU)."""
    stdout, results = run_quick_bench(tmp_path, capsys, "--gpu", "--device", "cpu", "--only", "side_by_side")

    result = results["side_by_side"]
    assert set(result["sweeps"]) == {"one at a time", "side by side"}
    assert all(timed["job_fit_s"] > 0 for timed in result["sweeps"].values())
    assert f"{result['jobs']} one-GPU jobs on 0 GPU(s)" in stdout
    for name, timed in result["sweeps"].items():
        assert f"  {name}: {conditions(timed['job_threads'])}" in stdout
