"""`python -m bench --quick` (and its GPU variant run on the CPU) end to end: every suite runs and its JSON has
the keys the README quotes. No timing is asserted: benchmarks are not tests."""

from pathlib import Path

import pytest

from tests.helpers import REPO, check_ok, read_json, run_module

pytestmark = [pytest.mark.slow, pytest.mark.realdata]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def run_quick_bench(tmp_path: Path, *args: str) -> tuple[str, dict]:
    result = check_ok(run_module("bench", "--quick", "--out", str(tmp_path), *args, cwd=REPO, timeout=900))
    [record] = [read_json(path) for path in tmp_path.glob("*.json")]
    return result.stdout, record


def assert_pngs(directory: Path, names: set[str]) -> None:
    found = {path.name.split("-quick-")[1] for path in directory.glob("*.png")}
    assert found == names
    for path in directory.glob("*.png"):
        assert path.read_bytes()[:8] == PNG_SIGNATURE


def test_quick_bench_runs_every_suite_and_writes_json_and_plots(tmp_path: Path):
    stdout, record = run_quick_bench(tmp_path)

    suites = record["suites"]
    assert list(suites) == [
        "data_path",
        "lightning_overhead",
        "startup",
        "ddp_scaling",
        "preemption",
        "memory",
        "image_folder",
        "time_to_accuracy",
    ]
    assert not [name for name, suite in suites.items() if "error" in suite]
    assert {"compute only", "datamodule", "tensor dataset", "torchvision PIL"} == set(
        suites["data_path"]["throughput_vs_limit"]
    )
    variants = {"default", "stock", "unfused Adam", "plain __setattr__", "bare"}
    assert set(suites["lightning_overhead"]["throughput_vs_reference"]) == variants
    assert suites["lightning_overhead"]["default_vs_bare"]["median"] > 0
    assert suites["lightning_overhead"]["profile_ms_per_step"]
    assert {"median", "low", "high"} <= set(suites["startup"]["train_vs_imports"])
    assert set(suites["ddp_scaling"]["two_vs_one"]) == {"same global batch", "same per-rank batch"}
    preemption = suites["preemption"]
    assert preemption["exit_status"] == 128 + 15 and preemption["steps_trained_again"] == 0
    assert preemption["resumed_at_step"] == preemption["stopped_after_step"]
    memory = suites["memory"]
    assert memory["peak_rss_mb"]["train"] > memory["peak_rss_mb"]["imports"] > 0
    assert memory["images_mb"]["float32"] == 4 * memory["images_mb"]["uint8"]
    folder = suites["image_folder"]
    passes = {"data module", "plain decode", "training, 0 workers", "training, 2 workers"}
    assert set(folder["samples_per_second"]) == passes
    assert folder["training_images"] == 600 and folder["loader_vs_training"]["median"] > 0
    accuracy = suites["time_to_accuracy"]
    assert [point["epoch"] for point in accuracy["points"]] == list(range(1, accuracy["max_epochs"] + 1))
    assert {"to_85", "to_88", "best"} <= set(accuracy)
    rows = (
        "datamodule / compute-only limit",
        "Lightning default / bare",
        "start-up",
        "DDP: 2",
        "preemption",
        "memory: peak RSS",
        "image folder: data module / plain decode",
        "image folder: loader / CNN training",
        "accuracy",
    )
    for row in rows:
        assert row in stdout
    assert_pngs(tmp_path, {"throughput.png", "loss-vs-time.png", "ddp-scaling.png"})


def test_gpu_variant_runs_on_the_cpu(tmp_path: Path):
    """The `--gpu` code paths, checked here with `--device cpu` (the numbers mean nothing)."""
    stdout, record = run_quick_bench(tmp_path, "--gpu", "--device", "cpu")

    suites = record["suites"]
    assert list(suites) == ["data_path", "lightning_overhead", "gpu", "time_to_accuracy"]
    assert not [name for name, suite in suites.items() if "error" in suite]
    assert "datamodule, resident" in suites["data_path"]["throughput_vs_limit"]
    assert set(suites["gpu"]["throughput_vs_reference"]) == {"fp32", "bf16-mixed", "dp, devices=[0]"}
    assert "GPU Lightning bf16-mixed / reference" in stdout
    assert_pngs(tmp_path, {"throughput.png", "loss-vs-time.png"})
