"""`python -m bench --quick --only side_by_side` and its GPU variant: the sweeps it times run to their end, one at a
time and side by side, and its rows are in the table (no timing asserted: benchmarks are not tests)."""

from pathlib import Path

import pytest

from tests.bench_runs import one_thread, preloaded_runs, run_quick_bench  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.slow, pytest.mark.realdata, pytest.mark.usefixtures("preloaded_runs")]


def test_the_side_by_side_suite_times_one_at_a_time_and_two_at_once_at_two_job_lengths(tmp_path: Path, capsys):
    stdout, results = run_quick_bench(tmp_path, capsys, "--only", "side_by_side")

    sweeps = results["side_by_side"]["sweeps"]
    assert set(sweeps) == {"one at a time", "2 at once"}
    for timed in sweeps.values():
        assert set(timed) == {"short", "long"}
        assert timed["long"]["job_fit_s"] > timed["short"]["job_fit_s"] > 0
    assert "sweep 2 at once, long jobs" in stdout
    assert "sweep 2 at once pays from jobs of" in stdout


def test_the_gpu_variant_times_one_gpu_jobs_one_at_a_time_and_side_by_side(tmp_path: Path, capsys):
    """`--gpu`'s code path, checked here with `--device cpu` (its jobs then train on the CPU)."""
    stdout, results = run_quick_bench(tmp_path, capsys, "--gpu", "--device", "cpu", "--only", "side_by_side")

    result = results["side_by_side"]
    assert set(result["sweeps"]) == {"one at a time", "side by side"}
    assert all(timed["job_fit_s"] > 0 for timed in result["sweeps"].values())
    assert f"{result['jobs']} one-GPU jobs on 0 GPU(s)" in stdout
