"""On a CUDA GPU: the Lightning path matches the reference as `trainer=gpu` (skipped where none is visible;
`bench/gpu.sh` runs it)."""

from pathlib import Path

import pytest

from tests.helpers import check_ok, mnist_overrides, read_json, run_module

pytestmark = [pytest.mark.gpu, pytest.mark.slow]
# GPU kernels (cuBLAS, fused Adam) may order their sums differently from one launch to the next.
GPU_TOLERANCE = 1e-4


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
