"""On a CUDA GPU: `trainer=dp` on one listed GPU (skipped where none is visible; `bench/gpu.sh` runs it)."""

from pathlib import Path

import pytest
import torch

from tests.helpers import check_ok, read_json, run_module

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def test_dp_on_listed_gpu_saves_checkpoint_without_module_prefix(tmp_path: Path):
    run_dir = tmp_path / "run"
    check_ok(run_module("project.train", "trainer=dp", "trainer.devices=[0]", f"hydra.run.dir={run_dir}", cwd=tmp_path))
    assert read_json(run_dir / "results.json")["test/acc"] == 1.0
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    network_keys = [key for key in state if key.startswith("network.")]
    assert network_keys and not any("module." in key for key in state)
