"""`python -m bench --quick` suite by suite (`--only SUITE`), and its GPU variant run on the CPU: every suite runs its
real code end to end on the small copy of Fashion-MNIST, its JSON has the keys the README quotes, its rows are in
the table and its plots are written. No timing is asserted: benchmarks are not tests.

One test per suite, so that xdist spreads them over its workers; the longest come first. The bench's `main` runs in
the test's process: its suites start the processes whose behaviour they measure (start-up, memory, preemption, the
DDP ranks), and a fresh interpreter for the bench itself would only add its imports to every test.
"""

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from bench import image_folder
from bench.__main__ import main, suites
from bench.settings import Settings
from tests.helpers import environment, python, read_json

pytestmark = [pytest.mark.slow, pytest.mark.realdata]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """One intra-op thread for the bench and for the processes it starts, which share the cores with other tests: two
    threads per process on a busy 2-core machine spin against each other. The environment is put back afterwards
    (the bench's runs seed, which sets PL_GLOBAL_SEED for the later tests of this process and their processes)."""
    saved = dict(os.environ)
    os.environ["OMP_NUM_THREADS"] = "1"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def preloaded_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runs a suite starts as `sys.executable -m ...` are forked from the preloaded Python
    (tests/preloaded_python.py), sparing each the seconds of imports, which no assertion of the test reads. Only for
    suites whose recorded figures the test does not compare with a fresh interpreter's (not start-up, not memory)."""
    for name, value in environment().items():  # (starts the preloaded Python, with the real sys.executable)
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(sys, "executable", python())


def run_quick_bench(out: Path, capsys: pytest.CaptureFixture, *args: str) -> tuple[str, dict]:
    """`python -m bench --quick --out <out> <args>`: its table and the suites of its JSON."""
    status = main(["--quick", "--out", str(out), *args])
    printed = capsys.readouterr()
    assert status == 0, f"a suite failed\n{printed.out[-3000:]}\n{printed.err[-6000:]}"
    [record] = [read_json(path) for path in out.glob("*.json")]
    return printed.out, record["suites"]


def assert_pngs(directory: Path, names: set[str]) -> None:
    found = {path.name.split("-quick-")[1] for path in directory.glob("*.png")}
    assert found == names
    for path in directory.glob("*.png"):
        assert path.read_bytes()[:8] == PNG_SIGNATURE


def test_a_quick_run_has_every_suite_in_order():
    """What a run without `--only` runs; each of these has its test below."""
    cpu = Settings.make(True, "cpu", Path("unused"))
    gpu = Settings.make(True, "cpu", Path("unused"), gpu_variant=True)
    assert list(suites(cpu)) == [
        "data_path",
        "lightning_overhead",
        "startup",
        "ddp_scaling",
        "preemption",
        "memory",
        "fsdp_memory",
        "image_folder",
        "time_to_accuracy",
    ]
    assert list(suites(gpu)) == ["data_path", "lightning_overhead", "gpu", "time_to_accuracy"]


def test_preemption_stops_on_sigterm_and_resumes_at_that_step(tmp_path: Path, capsys, preloaded_runs: None):
    stdout, results = run_quick_bench(tmp_path, capsys, "--only", "preemption")

    preemption = results["preemption"]
    assert preemption["exit_status"] == 128 + 15 and preemption["steps_trained_again"] == 0
    assert preemption["resumed_at_step"] == preemption["stopped_after_step"]
    assert "preemption: SIGTERM to exit" in stdout


def test_ddp_scaling_times_two_ranks_at_both_batch_sizes(tmp_path: Path, capsys):
    stdout, results = run_quick_bench(tmp_path, capsys, "--only", "ddp_scaling")

    assert set(results["ddp_scaling"]["two_vs_one"]) == {"same global batch", "same per-rank batch"}
    assert "DDP: 2 processes / 1" in stdout
    assert_pngs(tmp_path, {"ddp-scaling.png"})


def test_fsdp_memory_holds_half_the_weights_gradients_and_optimizer_state_per_rank(
    tmp_path: Path, capsys, preloaded_runs: None
):
    """Besides the model state: each rank's peak resident memory and both strategies' training speed are recorded."""
    stdout, results = run_quick_bench(tmp_path, capsys, "--only", "fsdp_memory")

    suite = results["fsdp_memory"]
    ddp, fsdp = (suite["bytes_per_rank"][strategy] for strategy in ("ddp", "fsdp"))
    for rank in (0, 1):
        assert fsdp[rank]["weights"] * 2 == ddp[rank]["weights"] == ddp[rank]["gradients"]
        assert fsdp[rank]["gradients"] * 2 == ddp[rank]["gradients"]
        assert 0.49 < fsdp[rank]["optimizer"] / ddp[rank]["optimizer"] < 0.51  # Adam's step counts are not sharded
        for held in (ddp[rank], fsdp[rank]):  # the whole process holds at least its model state
            assert held["peak_resident"] > held["weights"] + held["gradients"] + held["optimizer"]
    assert suite["samples_per_second"]["ddp"] > 0 and suite["samples_per_second"]["fsdp"] > 0
    for row in ("per-rank weights", "per-rank peak resident memory", "training samples/s"):
        assert f"fsdp / ddp: {row}" in stdout


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


def test_gpu_variant_runs_on_the_cpu(tmp_path: Path, capsys):
    """The `--gpu` code paths, checked here with `--device cpu` (the numbers mean nothing)."""
    stdout, results = run_quick_bench(tmp_path, capsys, "--gpu", "--device", "cpu")

    assert list(results) == ["data_path", "lightning_overhead", "gpu", "time_to_accuracy"]
    assert "datamodule, resident" in results["data_path"]["throughput_vs_limit"]
    assert set(results["gpu"]["throughput_vs_reference"]) == {"fp32", "bf16-mixed", "dp, devices=[0]"}
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


def test_image_folder_times_the_loader_against_decoding_and_training(tmp_path: Path, capsys):
    stdout, results = run_quick_bench(tmp_path, capsys, "--only", "image_folder")

    folder = results["image_folder"]
    passes = {"data module", "plain decode", "training, 0 workers", "training, 2 workers"}
    assert set(folder["samples_per_second"]) == passes
    assert folder["training_images"] == 10 * image_folder.PER_CLASS["quick"]  # Fashion-MNIST's 10 classes
    assert folder["loader_vs_training"]["median"] > 0
    assert "image folder: data module / plain decode" in stdout
    assert "image folder: loader / CNN training" in stdout


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
