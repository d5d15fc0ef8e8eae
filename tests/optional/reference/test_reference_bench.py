"""The bench's suites that time the reference loop: lightning_overhead (bench/lightning_overhead.py) and the GPU
variant (bench/gpu.py, checked on the CPU), each `python -m bench --quick`: their JSON has the keys the docs
quote, their rows are in the table and their plots are written (tests/bench_runs.py runs them)."""

from pathlib import Path

import pytest

from bench import gpu
from tests.bench_runs import assert_pngs, one_thread, run_quick_bench  # noqa: F401  (one_thread: autouse)

pytestmark = [pytest.mark.slow, pytest.mark.realdata]


def test_gpu_variant_runs_on_the_cpu(tmp_path: Path, capsys):
    """The `--gpu` code paths, checked here with `--device cpu` (the numbers mean nothing); the parallel part's
    suite of the variant is checked in that part's tests."""
    ours = ["data_path", "lightning_overhead", "gpu", "time_to_accuracy"]
    stdout, results = run_quick_bench(tmp_path, capsys, "--gpu", "--device", "cpu", "--only", *ours)

    assert list(results) == ours
    assert "datamodule, resident" in results["data_path"]["throughput_vs_limit"]
    dp = ["dp, devices=[0]"] if gpu.DP_CONFIG.is_file() else []  # the dp part's variant, where that part is here
    assert set(results["gpu"]["throughput_vs_reference"]) == {"fp32", "bf16-mixed", *dp}
    assert "GPU Lightning bf16-mixed / reference" in stdout
    assert_pngs(tmp_path, {"throughput.png", "loss-vs-time.png"})


def test_lightning_overhead_prices_every_variant_against_the_reference(tmp_path: Path, capsys):
    stdout, results = run_quick_bench(tmp_path, capsys, "--only", "lightning_overhead")

    overhead = results["lightning_overhead"]
    variants = {"default", "stock", "unfused Adam", "plain __setattr__", "bare"}
    assert set(overhead["throughput_vs_reference"]) == variants
    assert overhead["default_vs_bare"]["median"] > 0
    assert overhead["profile_ms_per_step"]
    assert "Lightning default / bare" in stdout
    assert_pngs(tmp_path, {"throughput.png", "loss-vs-time.png"})
