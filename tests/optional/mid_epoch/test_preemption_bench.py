"""The bench's preemption suite (bench/preemption.py), `python -m bench --quick --only preemption`: a run stopped by
SIGTERM mid-epoch resumes at the step it stopped after, and the rows are in the table (tests/bench_runs.py runs it)."""

from pathlib import Path

import pytest

from tests.bench_runs import one_thread, preloaded_runs, run_quick_bench  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.slow, pytest.mark.realdata]


@pytest.mark.usefixtures("preloaded_runs")
def test_preemption_stops_on_sigterm_and_resumes_at_that_step(tmp_path: Path, capsys):
    stdout, results = run_quick_bench(tmp_path, capsys, "--only", "preemption")

    preemption = results["preemption"]
    assert preemption["exit_status"] == 128 + 15 and preemption["steps_trained_again"] == 0
    assert preemption["resumed_at_step"] == preemption["stopped_after_step"]
    assert "preemption: SIGTERM to exit" in stdout
