"""`python -m bench --quick` suite by suite (`--only SUITE`), for the suites of the core: every suite runs its real code
end to end on the small copy of Fashion-MNIST, its JSON has the keys the docs quote, its rows are in the table and
its plots are written. No timing is asserted: benchmarks are not tests. An optional part's suite is tested in its
part's tests (tests/optional/<part>/test_*_bench.py), and a run without it leaves it out.

One test per suite, so that xdist spreads them over its workers; the longest come first.
"""

from pathlib import Path

import pytest

import bench.__main__ as bench_main
from bench.__main__ import declared, main, suites
from tests.bench_runs import assert_pngs, one_thread, run_quick_bench  # noqa: F401  (one_thread: autouse)

pytestmark = [pytest.mark.slow, pytest.mark.realdata]

CORE_SUITES = {
    False: ["data_path", "startup", "ddp_scaling", "memory", "time_to_accuracy"],
    True: ["data_path", "time_to_accuracy"],
}


def test_a_quick_run_has_every_suite_in_order(monkeypatch: pytest.MonkeyPatch):
    """What a run without `--only` runs: the declared suites whose file is here, in the declared order (the core's
    always); a part's suite whose file went with its part is left out, and the others keep their order."""
    for gpu_variant, core in CORE_SUITES.items():
        here = suites(gpu_variant)
        assert here == [name for name in declared(gpu_variant) if (bench_main.BENCH / f"{name}.py").is_file()]
        assert [name for name in here if name in core] == core

    gone = ("fsdp_memory", "lightning_overhead", "gpu")
    monkeypatch.setattr(bench_main, "is_here", lambda name: name not in gone)
    for gpu_variant, core in CORE_SUITES.items():
        assert suites(gpu_variant) == [name for name in declared(gpu_variant) if name not in gone]
        assert set(core) <= set(suites(gpu_variant))


def test_a_suite_whose_file_is_gone_is_left_out_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
):
    """As if the fsdp part were deleted, bench/fsdp_memory.py with it: `--only fsdp_memory` is an error naming the
    suites there are; a run says once that it is left out and goes on (here with no other suite, to be short)."""
    monkeypatch.setattr(bench_main, "is_here", lambda name: name != "fsdp_memory")
    refused = r"^error: --only fsdp_memory: this tree's suites are data_path, .*; bench/fsdp_memory.py is not here$"
    with pytest.raises(SystemExit, match=refused):
        main(["--quick", "--only", "fsdp_memory"])

    monkeypatch.setattr(bench_main, "CPU_SUITES", ("fsdp_memory",))
    stdout, results = run_quick_bench(tmp_path, capsys)

    assert results == {}
    assert stdout.count("bench: fsdp_memory left out: bench/fsdp_memory.py is not here") == 1


def test_ddp_scaling_times_two_ranks_at_both_batch_sizes(tmp_path: Path, capsys):
    stdout, results = run_quick_bench(tmp_path, capsys, "--only", "ddp_scaling")

    assert set(results["ddp_scaling"]["two_vs_one"]) == {"same global batch", "same per-rank batch"}
    assert "DDP: 2 processes / 1" in stdout
    assert_pngs(tmp_path, {"ddp-scaling.png"})


def test_memory_peak_of_a_run_is_above_the_bare_imports(tmp_path: Path, capsys):
    stdout, results = run_quick_bench(tmp_path, capsys, "--only", "memory")

    memory = results["memory"]
    assert memory["peak_rss_mb"]["train"] > memory["peak_rss_mb"]["imports"] > 0
    assert memory["images_mb"]["float32"] == 4 * memory["images_mb"]["uint8"]
    assert "memory: peak RSS" in stdout


def test_startup_compares_a_toy_run_with_the_bare_imports(tmp_path: Path, capsys):
    stdout, results = run_quick_bench(tmp_path, capsys, "--only", "startup")

    assert {"median", "low", "high"} <= set(results["startup"]["train_vs_imports"])
    assert "start-up: project.train toy / bare imports" in stdout
    assert results["startup"]["seconds"]["receipt"]["median"] > 0 and "start-up: the run's receipt" in stdout


def test_data_path_compares_every_loader_with_the_compute_only_limit(tmp_path: Path, capsys):
    stdout, results = run_quick_bench(tmp_path, capsys, "--only", "data_path")

    paths = {"compute only", "datamodule", "tensor dataset", "torchvision PIL"}
    assert set(results["data_path"]["throughput_vs_limit"]) == paths
    assert "data: datamodule / compute-only limit" in stdout
    assert_pngs(tmp_path, {"throughput.png"})


def test_time_to_accuracy_probes_the_test_set_after_every_epoch(tmp_path: Path, capsys):
    stdout, results = run_quick_bench(tmp_path, capsys, "--only", "time_to_accuracy")

    accuracy = results["time_to_accuracy"]
    assert [point["epoch"] for point in accuracy["points"]] == list(range(1, accuracy["max_epochs"] + 1))
    assert {"to_85", "to_88", "best"} <= set(accuracy)
    assert "accuracy: best" in stdout
