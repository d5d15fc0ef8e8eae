"""On a CUDA GPU: the toy trains there. (The optional parts' GPU checks are in their own tests, marked `gpu`.)

Skipped (with the reason) where no GPU is visible; `bench/gpu.sh` runs them on a GPU machine.
"""

from pathlib import Path

import pytest

from tests.helpers import check_ok, read_json, run_module

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def test_toy_trains_to_full_accuracy_on_one_gpu(tmp_path: Path):
    run_dir = tmp_path / "run"
    check_ok(run_module("project.train", "trainer=gpu", f"hydra.run.dir={run_dir}", cwd=tmp_path))
    results = read_json(run_dir / "results.json")
    assert results["train/acc"] == results["test/acc"] == 1.0
    assert results["epochs"] == 3
