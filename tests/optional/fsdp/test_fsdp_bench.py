"""The bench's fsdp_memory suite (bench/fsdp_memory.py), `python -m bench --quick --only fsdp_memory`: its JSON has the
keys the docs quote and its rows are in the table (tests/bench_runs.py runs it)."""

from pathlib import Path

import pytest

from tests.bench_runs import one_thread, preloaded_runs, run_quick_bench  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.slow, pytest.mark.realdata]


@pytest.mark.usefixtures("preloaded_runs")
def test_fsdp_memory_holds_half_the_weights_gradients_and_optimizer_state_per_rank(tmp_path: Path, capsys):
    """Besides the model state: each rank's peak resident memory and both strategies' training speed are recorded."""
    stdout, results = run_quick_bench(tmp_path, capsys, "--only", "fsdp_memory")

    suite = results["fsdp_memory"]
    for model in (suite, suite["transformer"]):  # the MLP's keys at the top, as the docs quote them
        check_half_per_rank(model)
    for label in ("", " (GPT)"):
        for row in ("per-rank weights", "per-rank peak resident memory", "training samples/s"):
            assert f"fsdp / ddp{label}: {row}" in stdout
        assert f"fsdp - ddp{label}: largest step loss gap" in stdout


def check_half_per_rank(model: dict) -> None:
    ddp, fsdp = (model["bytes_per_rank"][strategy] for strategy in ("ddp", "fsdp"))
    for rank in (0, 1):
        assert fsdp[rank]["weights"] * 2 == ddp[rank]["weights"] == ddp[rank]["gradients"]
        assert fsdp[rank]["gradients"] * 2 == ddp[rank]["gradients"]
        assert 0.49 < fsdp[rank]["optimizer"] / ddp[rank]["optimizer"] < 0.51  # Adam's step counts are not sharded
        for held in (ddp[rank], fsdp[rank]):  # the whole process holds at least its model state
            assert held["peak_resident"] > held["weights"] + held["gradients"] + held["optimizer"]
    assert model["samples_per_second"]["ddp"] > 0 and model["samples_per_second"]["fsdp"] > 0
