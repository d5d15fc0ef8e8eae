"""On a CUDA GPU: the toy trains there, `trainer=dp` works on one listed GPU, and Lightning matches the reference,
as `trainer=gpu` and as `trainer=fsdp` on one GPU.

Skipped (with the reason) where no GPU is visible; `bench/gpu.sh` runs them on a GPU machine.
"""

from pathlib import Path

import pytest
import torch

from tests.helpers import check_ok, mnist_overrides, read_json, run_module

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

# GPU kernels (cuBLAS, fused Adam) may order their sums differently from one launch to the next.
GPU_TOLERANCE = 1e-4
# bf16 keeps 8 bits of mantissa: a product or sum ordered differently moves by about 2**-8 of its size.
BF16_GPU_TOLERANCE = 1e-2


def test_toy_trains_to_full_accuracy_on_one_gpu(tmp_path: Path):
    run_dir = tmp_path / "run"
    check_ok(run_module("project.train", "trainer=gpu", f"hydra.run.dir={run_dir}", cwd=tmp_path))
    results = read_json(run_dir / "results.json")
    assert results["train/acc"] == results["test/acc"] == 1.0
    assert results["epochs"] == 3


def test_dp_on_listed_gpu_saves_checkpoint_without_module_prefix(tmp_path: Path):
    run_dir = tmp_path / "run"
    check_ok(run_module("project.train", "trainer=dp", "trainer.devices=[0]", f"hydra.run.dir={run_dir}", cwd=tmp_path))
    assert read_json(run_dir / "results.json")["test/acc"] == 1.0
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    network_keys = [key for key in state if key.startswith("network.")]
    assert network_keys and not any("module." in key for key in state)


def test_lightning_on_gpu_matches_the_single_reference_on_gpu(tmp_path: Path, mnist_root: Path):
    """The MNIST recipe (fused Adam, one-cycle schedule) for 2 epochs on the small test files."""
    overrides = mnist_overrides(mnist_root, "trainer=gpu", "trainer.max_epochs=2")
    check_ok(
        run_module(
            "project.optional.reference.compare", *overrides, f"hydra.run.dir={tmp_path / 'compare'}", cwd=tmp_path
        )
    )
    comparison = read_json(tmp_path / "compare" / "comparison.json")
    assert comparison["reference_script"] == "project.optional.reference.single"
    assert comparison["max_step_loss_diff"] <= GPU_TOLERANCE
    assert comparison["max_weight_diff"] <= GPU_TOLERANCE
    assert comparison["lightning"]["test/acc"] == pytest.approx(comparison["reference"]["test/acc"], abs=0.01)


@pytest.mark.parametrize(
    ("precision", "tolerance"),
    [("32-true", GPU_TOLERANCE), ("bf16-mixed", BF16_GPU_TOLERANCE)],
    ids=["32-true", "bf16-mixed"],
)
def test_fsdp_on_one_gpu_matches_its_reference_on_gpu(
    tmp_path: Path, mnist_root: Path, precision: str, tolerance: float
):
    """`trainer=fsdp` on one GPU: one rank over NCCL, every layer sharded over a mesh of one, in both precisions
    FSDP takes. tests/test_fsdp.py checks 2 ranks on the CPU; on a 1-GPU machine its runs would ask for 2 GPUs."""
    trainer = ["trainer=fsdp", "trainer.devices=1", f"trainer.precision={precision}", "trainer.max_epochs=2"]
    overrides = mnist_overrides(mnist_root, *trainer)
    check_ok(
        run_module(
            "project.optional.reference.compare", *overrides, f"hydra.run.dir={tmp_path / 'compare'}", cwd=tmp_path
        )
    )
    comparison = read_json(tmp_path / "compare" / "comparison.json")
    assert comparison["reference_script"] == "project.optional.reference.fsdp"
    assert comparison["world_size"] == {"lightning": 1, "reference": 1}
    assert comparison["max_step_loss_diff"] <= tolerance
    assert comparison["max_weight_diff"] <= tolerance
