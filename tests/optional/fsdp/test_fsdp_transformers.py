"""Transformers under `trainer=fsdp`'s default units, as users bring them (transformer_modules.py here): each gives
DDP's losses step by step on the same data, resumes, is evaluated and trains in bf16-mixed; tied weights stay tied.
"""

import math
from pathlib import Path

import pytest
import torch

from project.engine.checkpoints import is_sharded, plain_checkpoint
from tests.faults import assert_ends_in_error_line, assert_no_process_left
from tests.helpers import REPO, check_ok, histories, read_json, requires, run_module
from tests.optional.fsdp.transformer_modules import TRANSFORMER_CONF

pytestmark = [pytest.mark.slow, requires("fsdp")]

NETWORK = "model.network._target_=tests.optional.fsdp.transformer_modules."
NETWORKS = {
    "nn.Transformer": [f"{NETWORK}TorchTransformerLM"],
    "nn.TransformerEncoder classifier": [f"{NETWORK}EncoderClassifier", "data.task=classify"],
    "GPT of its own blocks": [f"{NETWORK}GPT"],
    "GPT, embeddings tied": [f"{NETWORK}GPT", "+model.network.tie=true"],
    "GPT in its LightningModule, embed and head tied across its networks": ["model=tied_lm"],
}
# The models whose output layer's weight is its token embedding, and where their layers are in the checkpoint.
TIED = {"GPT, embeddings tied": "network.", "GPT in its LightningModule, embed and head tied across its networks": ""}
# 32 sequences, 4 a batch on each of 2 ranks: 4 steps an epoch.
COMMON = [f"hydra.searchpath=[file://{TRANSFORMER_CONF}]", "model=transformer", "data=tokens", "trainer.devices=2"]
ENV = {"PYTHONPATH": str(REPO)}
# The networks the command line named, which no config file does, for evaluate's check of the checkpoint.
TRUST_NETWORKS = "+trusted_targets.transformers=tests.optional.fsdp.transformer_modules.*"
TOLERANCE = 1e-5  # per step, float32, the sums of a reduce-scatter against an all-reduce
# After 8 AdamW steps: Adam divides each step by the root of its squared gradients, so a gradient near zero (a bias
# no loss much depends on) turns float32's differences in summation order into larger ones in the weight.
WEIGHT_TOLERANCE = 1e-3
# Per step, relative, against DDP in float32: weights gathered in bfloat16 (8 bits of mantissa, 0.4 % a rounding),
# differences compounding over 8 steps.
BF16_TOLERANCE = 0.03


def train(cwd: Path, name: str, *overrides: str, module: str = "project.train") -> Path:
    run_dir = cwd / name
    check_ok(run_module(module, *COMMON, *overrides, "logger=none", f"hydra.run.dir={run_dir}", cwd=cwd, env=ENV))
    return run_dir


def step_losses(*run_dirs: Path) -> list[list[float]]:
    """Each rank's per-step losses, the runs' one after the other (a run and its resumption)."""
    ranks = zip(*(histories(run_dir) for run_dir in run_dirs), strict=True)
    return [[loss for history in rank for loss in history["step_losses"]] for rank in ranks]


def largest_gap(first: list[list[float]], second: list[list[float]], relative: bool = False) -> float:
    """The largest difference of two runs' losses at the same step on the same rank (relative: to the second's)."""
    assert [len(rank) for rank in first] == [len(rank) for rank in second] == [8, 8]
    pairs = [(a, b) for x, y in zip(first, second, strict=True) for a, b in zip(x, y, strict=True)]
    return max(abs(a - b) / (abs(b) if relative else 1) for a, b in pairs)


def state_dict(checkpoint: Path) -> dict[str, torch.Tensor]:
    loaded = plain_checkpoint(checkpoint) if is_sharded(checkpoint) else torch.load(checkpoint, weights_only=True)
    return loaded["state_dict"]


@pytest.mark.parametrize("network", NETWORKS)
def test_a_transformer_trains_under_fsdp_as_under_ddp_resumes_is_evaluated_and_trains_in_bf16(
    tmp_path: Path, network: str
):
    overrides = NETWORKS[network]
    ddp = train(tmp_path, "ddp", *overrides, "trainer=ddp", "trainer.max_epochs=2")
    first = train(tmp_path, "fsdp", *overrides, "trainer=fsdp", "trainer.max_epochs=1")
    last = first / "checkpoints" / "last.ckpt"
    assert is_sharded(last)
    resumed = train(tmp_path, "resumed", *overrides, "trainer=fsdp", "trainer.max_epochs=2", f"ckpt_path={last}")
    assert largest_gap(step_losses(first, resumed), step_losses(ddp)) <= TOLERANCE

    weights, ddp_weights = (state_dict(run / "checkpoints" / "last.ckpt") for run in (resumed, ddp))
    assert weights.keys() == ddp_weights.keys()
    assert max((weights[name] - ddp_weights[name]).abs().max().item() for name in weights) <= WEIGHT_TOLERANCE
    if network in TIED:  # one tensor under two names, as DDP keeps it
        assert torch.equal(weights[f"{TIED[network]}head.weight"], weights[f"{TIED[network]}embed.weight"])

    last = resumed / "checkpoints" / "last.ckpt"
    evaluate = ("project.evaluate", f"ckpt_path={last}", TRUST_NETWORKS, f"hydra.run.dir={tmp_path / 'eval'}")
    evaluated = run_module(*evaluate, cwd=tmp_path, env=ENV)
    printed = dict(line.split()[:2] for line in check_ok(evaluated).stdout.splitlines() if line.startswith("test/"))
    assert abs(float(printed["test/loss"]) - read_json(ddp / "results.json")["test/loss"]) <= 1e-4

    bf16 = train(tmp_path, "bf16", *overrides, "trainer=fsdp", "trainer.max_epochs=2", "trainer.precision=bf16-mixed")
    assert largest_gap(step_losses(bf16), step_losses(ddp), relative=True) <= BF16_TOLERANCE
    assert math.isfinite(read_json(bf16 / "results.json")["test/loss"])


def test_units_whose_weights_their_parent_reads_uncalled_end_the_run_in_one_line_naming_layer_classes(tmp_path: Path):
    """Every Linear a unit (the default before whole blocks): nn.MultiheadAttention meets out_proj's weight sharded."""
    linear_units = ["trainer=fsdp", "trainer.max_epochs=1", "trainer.strategy.layer_classes=[torch.nn.Linear]"]
    overrides = [
        *COMMON,
        *NETWORKS["nn.Transformer"],
        *linear_units,
        "logger=none",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    failed = run_module("project.train", *overrides, cwd=tmp_path, env=ENV)
    line = assert_ends_in_error_line(
        failed.returncode, failed.stdout, failed.stderr, 2, "mixed torch.Tensor and DTensor"
    )
    assert line.endswith(
        "Set trainer.strategy.layer_classes to the classes of the blocks that hold both (a transformer's "
        "layer class), or to null (whole blocks, the default)"
    )
    assert_no_process_left(tmp_path)
