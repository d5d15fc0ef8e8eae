"""`python -m bench --quick --only side_by_side`: the sweeps it times run to their end, one at a time and 2 at once,
and its rows are in the table (no timing asserted: benchmarks are not tests)."""

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
