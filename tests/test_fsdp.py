"""`trainer=fsdp`: FSDP2 on two CPU processes (gloo) trains any LightningModule, and gives the numbers of its reference
script and of DDP on the same global batch."""

import math
from pathlib import Path

import pytest
import torch
from torch import nn

from project.config_checks import check_config
from project.errors import UserError
from project.parity import RunOutputs, max_loss_difference, max_weight_difference
from project.strategies.fsdp import shard_module
from tests.foreign_modules import FOREIGN_CONF
from tests.helpers import REPO, check_ok, histories, read_json, run_module
from tests.test_config import compose_train

TOLERANCE = 1e-6
# 5 toy points over 2 ranks, 1 a batch: 3 steps per epoch on each rank, 9 in all.
TOY = ["trainer.devices=2", "data.batch_size=1", "logger=none"]


@pytest.mark.slow
def test_fsdp_matches_its_reference_and_ddp_step_by_step(tmp_path: Path):
    compared = tmp_path / "compare"
    check_ok(run_module("project.compare", "trainer=fsdp", *TOY, f"hydra.run.dir={compared}", cwd=tmp_path))
    comparison = read_json(compared / "comparison.json")
    assert comparison["reference_script"] == "project.reference.fsdp"
    assert comparison["world_size"] == {"lightning": 2, "reference": 2}
    assert comparison["max_step_loss_diff"] <= TOLERANCE and comparison["max_weight_diff"] <= TOLERANCE

    ddp_dir = tmp_path / "ddp"
    check_ok(run_module("project.train", "trainer=ddp", *TOY, f"hydra.run.dir={ddp_dir}", cwd=tmp_path))
    fsdp_ranks, ddp_ranks = histories(compared / "lightning"), histories(ddp_dir)
    assert [len(h["step_losses"]) for h in fsdp_ranks] == [9, 9]
    for fsdp, ddp in zip(fsdp_ranks, ddp_ranks, strict=True):
        assert max_loss_difference(fsdp["step_losses"], ddp["step_losses"]) <= TOLERANCE
    fsdp_weights = RunOutputs.read_lightning(compared / "lightning").weights
    assert max_weight_difference(fsdp_weights, RunOutputs.read_lightning(ddp_dir).weights) <= TOLERANCE


@pytest.mark.slow
def test_a_module_of_the_users_own_is_sharded_without_a_configure_model(tmp_path: Path):
    regression = ["model=regression", "data=regression", "optimized_metric=val/mse", "optimized_mode=min"]
    run_dir = tmp_path / "run"
    check_ok(
        run_module(
            "project.train",
            f"hydra.searchpath=[file://{FOREIGN_CONF}]",
            *regression,
            "trainer=fsdp",
            "trainer.max_epochs=2",
            "logger=none",
            f"hydra.run.dir={run_dir}",
            cwd=tmp_path,
            env={"PYTHONPATH": str(REPO)},
        )
    )
    results = read_json(run_dir / "results.json")
    assert results["world_size"] == 2 and math.isfinite(results["test/mse"])
    assert [h["world_size"] for h in histories(run_dir)] == [2, 2]


def test_fsdp_refuses_a_precision_other_than_32_true_and_bf16_mixed(tmp_path: Path):
    check_config(compose_train(tmp_path, "trainer=fsdp", "trainer.precision=bf16-mixed"))
    with pytest.raises(UserError, match=r"trainer=fsdp trains in 32-true or bf16-mixed .* trainer.precision=bf16-true"):
        check_config(compose_train(tmp_path, "trainer=fsdp", "trainer.precision=bf16-true"))


def test_parameters_outside_any_submodule_are_refused_before_sharding():
    module = nn.Module()
    module.layer = nn.Linear(2, 2)
    module.scale = nn.Parameter(torch.ones(1))
    with pytest.raises(UserError, match=r"holds parameters of its own \(scale\)"):
        shard_module(module, (nn.Linear,), mesh=None, policy=None)
