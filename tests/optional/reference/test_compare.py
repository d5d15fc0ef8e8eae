"""`python -m project.optional.reference.compare`: both paths on one config give the same numbers."""

import math
from pathlib import Path

import pytest
import torch
from PIL import Image

from project.engine.history import TrainingHistory
from project.optional.reference.compare import failure_reason, format_comparison
from project.optional.reference.parity import max_loss_difference, max_weight_difference, network_weights
from tests.helpers import REPO, check_ok, read_json, run_module

pytestmark = pytest.mark.slow

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TOLERANCE = 1e-6


def run_compare(tmp_path: Path, *overrides: str) -> tuple[str, dict, Path]:
    """Run compare as a user would; its stdout, its comparison.json and its run dir."""
    run_dir = tmp_path / "compare"
    result = check_ok(
        run_module("project.optional.reference.compare", *overrides, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    )
    return result.stdout, read_json(run_dir / "comparison.json"), run_dir


def test_toy_default_lightning_and_single_reference_agree_step_by_step(tmp_path: Path):
    stdout, comparison, run_dir = run_compare(tmp_path)

    assert "lightning" in stdout and "reference" in stdout and "max |weight diff|" in stdout
    assert comparison["reference_script"] == "project.optional.reference.single"
    assert comparison["world_size"] == {"lightning": 1, "reference": 1}
    assert comparison["max_step_loss_diff"] <= TOLERANCE
    assert comparison["max_weight_diff"] <= TOLERANCE
    epoch_rows = [name for name in comparison["lightning"] if name.startswith("epoch ")]
    assert epoch_rows == ["epoch 1 train loss", "epoch 2 train loss", "epoch 3 train loss"]
    for name in epoch_rows + ["test/loss"]:
        assert comparison["lightning"][name] == pytest.approx(comparison["reference"][name], abs=TOLERANCE)
    assert comparison["lightning"]["test/acc"] == comparison["reference"]["test/acc"] == 1.0
    assert (run_dir / "lightning.log").is_file() and (run_dir / "reference.log").is_file()

    png = run_dir / "loss_curves.png"
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    with Image.open(png) as image:
        width, height = image.size
    assert width > 0 and height > 0


def test_mnist_shaped_run_agrees(tmp_path: Path, mnist_root: Path):
    mnist = ["experiment=mnist", f"data.root={mnist_root}", "data.download=false", "data.val_size=50"]
    _, comparison, _ = run_compare(tmp_path, *mnist, "trainer.max_epochs=2", "logger=none")

    assert comparison["max_step_loss_diff"] <= TOLERANCE
    assert comparison["max_weight_diff"] <= TOLERANCE
    assert [name for name in comparison["lightning"] if name.startswith("epoch ")] == [
        "epoch 1 train loss",
        "epoch 2 train loss",
    ]


def test_a_convolutional_network_agrees_on_both_paths(tmp_path: Path, mnist_root: Path):
    """model=cnn: a network other than an MLP needs no change to either path."""
    mnist = ["data=mnist", "model=cnn", f"data.root={mnist_root}", "data.download=false", "data.val_size=50"]
    _, comparison, _ = run_compare(tmp_path, *mnist, "data.batch_size=50", "trainer.max_epochs=2", "logger=none")
    assert comparison["max_step_loss_diff"] <= TOLERANCE
    assert comparison["max_weight_diff"] <= TOLERANCE


def test_ddp_two_processes_match_torchrun_reference(tmp_path: Path):
    _, comparison, run_dir = run_compare(tmp_path, "trainer=ddp", "trainer.devices=2")

    assert comparison["reference_script"] == "project.optional.reference.ddp"
    assert comparison["world_size"] == {"lightning": 2, "reference": 2}
    assert comparison["max_step_loss_diff"] <= TOLERANCE
    assert comparison["max_weight_diff"] <= TOLERANCE
    # compare looks at rank 0; every rank must agree (samplers and seeds line up rank by rank).
    for rank in (0, 1):
        lightning = TrainingHistory.load(run_dir / "lightning" / f"history.rank{rank}.json")
        reference = TrainingHistory.load(run_dir / "reference" / f"history.rank{rank}.json")
        assert max_loss_difference(lightning.step_losses, reference.step_losses) <= TOLERANCE


def test_dp_lightning_strategy_matches_dp_reference(tmp_path: Path):
    _, comparison, _ = run_compare(tmp_path, "trainer=dp")
    assert comparison["reference_script"] == "project.optional.reference.dp"
    assert comparison["max_step_loss_diff"] <= TOLERANCE
    assert comparison["max_weight_diff"] <= TOLERANCE


def test_a_failing_side_is_named_with_its_log(tmp_path: Path):
    missing = tmp_path / "no-data-here"
    result = run_module(
        "project.optional.reference.compare",
        "experiment=mnist",
        f"data.root={missing}",
        "data.download=false",
        f"hydra.run.dir={tmp_path / 'compare'}",
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "the lightning run failed" in result.stderr
    assert str(tmp_path / "compare" / "lightning.log") in result.stderr
    assert not (tmp_path / "compare" / "reference").exists()


@pytest.mark.parametrize("how", ["searchpath", "config-dir"])
def test_compare_composes_a_config_dir_of_your_own_as_train_does(tmp_path: Path, how: str):
    """Both sides get compare's --config-dir or hydra.searchpath, so a data YAML only that dir holds is found."""
    (tmp_path / "my_conf" / "data").mkdir(parents=True)
    (tmp_path / "my_conf" / "data" / "my_points.yaml").write_text((REPO / "conf" / "data" / "toy.yaml").read_text())
    where = ["hydra.searchpath=[file://my_conf]"] if how == "searchpath" else ["--config-dir", "my_conf"]
    stdout, comparison, run_dir = run_compare(tmp_path, *where, "data=my_points")
    assert comparison["max_step_loss_diff"] <= TOLERANCE and comparison["max_weight_diff"] <= TOLERANCE
    for side in ("lightning", "reference"):
        assert read_json(run_dir / side / "results.json")["test/acc"] == 1.0
        assert "- data=my_points" in (run_dir / side / ".hydra" / "overrides.yaml").read_text()


def test_the_comparison_table_keeps_its_columns_apart():
    """Thousands of samples/s next to each other stay two numbers."""
    comparison = {
        "lightning": {"samples/s": 15704.00265136, "test/acc": 0.9279},
        "reference": {"samples/s": 241.294566, "test/acc": 0.9279},
        "max_step_loss_diff": 0.0,
        "max_weight_diff": 0.0,
    }
    row = next(line for line in format_comparison("title", comparison).splitlines() if line.startswith("samples/s"))
    assert row.split() == ["samples/s", "15704.0", "241.294566", "1.55e+04"]


SCHEDULES = sorted(path.stem for path in (REPO / "conf" / "schedule").glob("*.yaml"))
# Plateau's own settings wait for a loss that rarely stops falling on the toy: here it is cut after every epoch.
EVERY_EPOCH = {"plateau": ("model.scheduler.mode=max", "model.scheduler.patience=0")}


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_every_schedule_moves_the_learning_rate_alike_on_both_paths(tmp_path: Path, schedule: str):
    """conf/schedule/: stepped per step or per epoch, sized by ${run_steps:}, chained, or following val/loss."""
    _, comparison, run_dir = run_compare(tmp_path, f"schedule={schedule}", *EVERY_EPOCH.get(schedule, ()))
    assert comparison["max_step_loss_diff"] <= TOLERANCE and comparison["max_weight_diff"] <= TOLERANCE
    lightning = torch.load(run_dir / "lightning" / "checkpoints" / "last.ckpt", weights_only=False)
    reference = torch.load(run_dir / "reference" / "checkpoints" / "last.pt", weights_only=False)
    final_rates = [
        lightning["optimizer_states"][0]["param_groups"][0]["lr"],
        reference["optimizer"]["param_groups"][0]["lr"],
    ]
    assert final_rates[0] == pytest.approx(final_rates[1], rel=1e-12)
    assert final_rates[0] != lightning["config"]["model"]["optimizer"]["lr"], "the schedule moved the rate"


def test_a_plateau_schedule_follows_rank_zeros_validation_on_every_ddp_rank(tmp_path: Path):
    """Rank 0 alone validates on the reference path; every rank's schedule steps on its metric, as Lightning's do."""
    args = ["trainer=ddp", "trainer.devices=2", "schedule=plateau", *EVERY_EPOCH["plateau"]]
    _, comparison, _ = run_compare(tmp_path, *args)
    assert comparison["max_step_loss_diff"] <= TOLERANCE and comparison["max_weight_diff"] <= TOLERANCE


def test_slurm_is_refused_until_compare_can_simulate_its_nodes(tmp_path: Path):
    result = run_module(
        "project.optional.reference.compare", "trainer=slurm", f"hydra.run.dir={tmp_path / 'compare'}", cwd=tmp_path
    )
    assert result.returncode == 2
    assert "compare does not simulate trainer=slurm yet" in result.stderr


def test_weight_difference_strips_lightning_prefix_and_finds_the_changed_tensor():
    reference = {"layers.0.weight": torch.zeros(2, 3), "layers.0.bias": torch.zeros(2)}
    checkpoint_state = {"network.layers.0.weight": torch.zeros(2, 3), "network.layers.0.bias": torch.zeros(2)}
    checkpoint_state["train_loss.total"] = torch.tensor(7.0)  # not the network's: dropped

    lightning = network_weights(checkpoint_state)
    assert sorted(lightning) == ["layers.0.bias", "layers.0.weight"]
    assert max_weight_difference(lightning, reference) == 0.0

    lightning["layers.0.bias"] = torch.tensor([0.0, -0.25])
    assert max_weight_difference(lightning, reference) == 0.25

    with pytest.raises(ValueError, match=r"only lightning has \['layers.1.weight'\].*only reference has \[\]"):
        max_weight_difference(lightning | {"layers.1.weight": torch.zeros(1)}, reference)


def test_loss_difference_is_the_largest_step_gap_and_refuses_different_lengths():
    assert max_loss_difference([0.5, 0.25, 0.125], [0.5, 0.75, 0.125]) == 0.5
    with pytest.raises(ValueError, match="lightning took 2 steps, the reference 3"):
        max_loss_difference([0.5, 0.25], [0.5, 0.25, 0.125])


def test_a_nan_loss_or_weight_is_an_infinite_difference_not_an_agreement():
    """Two diverged runs (NaN on both sides) must never pass as equal: Python's max() would skip the NaN."""
    nan = float("nan")
    assert max_loss_difference([0.5, nan, 0.1], [0.5, nan, 0.1]) == math.inf
    assert max_loss_difference([nan, 0.5], [0.25, 0.5]) == math.inf
    assert max_loss_difference([math.inf], [math.inf]) == 0.0
    weights = {"w": torch.tensor([1.0, nan])}
    assert max_weight_difference(weights, {"w": torch.tensor([1.0, nan])}) == math.inf
    assert max_weight_difference(weights, {"w": torch.tensor([1.0, 2.0])}) == math.inf


@pytest.mark.parametrize(
    "setting",
    ["trainer.max_steps=3", "trainer.val_check_interval=1", "trainer.precision=64-true"],
)
def test_a_trainer_setting_the_reference_does_not_mirror_is_refused_before_training(tmp_path: Path, setting: str):
    """Clipping, accumulation, another precision: the sides would differ by design, never silently."""
    result = run_module(
        "project.optional.reference.compare", setting, f"hydra.run.dir={tmp_path / 'compare'}", cwd=tmp_path
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    key, value = setting.split("=")
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert line.startswith(f"error: {key}={value} changes what Lightning trains, and the reference path has no")
    assert not (tmp_path / "compare" / "lightning").exists(), "neither side was started"


def test_a_reference_script_refuses_a_setting_it_would_ignore(tmp_path: Path):
    result = run_module(
        "project.optional.reference.single", "trainer.max_steps=3", f"hydra.run.dir={tmp_path}", cwd=tmp_path
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: trainer.max_steps=3 changes what")


@pytest.mark.parametrize(
    ("output", "reason"),
    [
        ("Epoch 1: 50%|#  error: data.batch_size must be a positive integer\n", "data.batch_size must be a positive"),
        ("Traceback (most recent call last):\n  ...\nRuntimeError: boom\n" + "=" * 40 + "\n", "RuntimeError: boom"),
        ("[rank1]: lost the store\nrank 1 exited with code 1\n" + "=" * 40 + "\n", "rank 1 exited with code 1"),
    ],
)
def test_a_failed_side_is_named_by_its_reason_not_by_torchruns_closing_rule(output: str, reason: str):
    assert reason in failure_reason(output)
