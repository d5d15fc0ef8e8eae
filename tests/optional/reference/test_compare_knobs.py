"""Every Trainer setting of conf/trainer/default.yaml, set away from its default, is either mirrored by the reference
path (both sides agree to 1e-6, step by step, in the final weights and in every result) or refused before training
in one line naming it: `project.optional.reference.compare` is never silently wrong.

The toy data trains 2 batches an epoch; where that is too few to show a setting, the rows train it in batches of 1
(5 an epoch), with a per-step schedule sized by `${run_steps:}`.
"""

import math
from pathlib import Path

import pytest
import torch
import yaml

from project.engine.errors import RunStopped
from project.engine.history import TrainingHistory
from project.optional.reference.loop import Checkpointing, Trainer, TrainerSettings, build
from tests.helpers import CONF_DIR, check_ok, run_module
from tests.optional.reference.test_compare import TOLERANCE, run_compare
from tests.optional.reference.test_parity import reference_cfg

pytestmark = pytest.mark.slow

# MIRRORED: agrees; REFUSED: one line; UNCHANGED: changes nothing either side computes (where it runs, what it
# prints and writes), so these rows share one compare run with all of them set at once.
MIRRORED, REFUSED, UNCHANGED = "mirrored", "refused", "unchanged"
ONE_SAMPLE_BATCHES = ("data.batch_size=1", "schedule=one_cycle")
# Each key of conf/trainer/default.yaml: a value other than its default (the first override), and what compare does.
AWAY_FROM_DEFAULT: dict[str, tuple[str, tuple[str, ...]]] = {
    "accelerator": (UNCHANGED, ("trainer.accelerator=cpu",)),
    "strategy": (MIRRORED, ("trainer.strategy=ddp",)),  # one process: DDP over a world of one
    "devices": (REFUSED, ("trainer.devices=2",)),  # Lightning would start 2 processes: trainer=ddp compares that
    "num_nodes": (REFUSED, ("trainer.num_nodes=2",)),
    "max_epochs": (MIRRORED, ("trainer.max_epochs=1",)),
    "log_every_n_steps": (UNCHANGED, ("trainer.log_every_n_steps=1",)),
    "check_val_every_n_epoch": (MIRRORED, ("trainer.check_val_every_n_epoch=2",)),
    "default_root_dir": (UNCHANGED, ("trainer.default_root_dir=${run_dir}/elsewhere",)),
    "precision": (MIRRORED, ("trainer.precision=bf16-mixed",)),
    "deterministic": (UNCHANGED, ("trainer.deterministic=true",)),
    "gradient_clip_val": (MIRRORED, ("trainer.gradient_clip_val=0.1",)),
    "gradient_clip_algorithm": (MIRRORED, ("trainer.gradient_clip_algorithm=value", "trainer.gradient_clip_val=0.05")),
    # Windows of batches 1-2, 3-4 and the epoch's last, 5.
    "accumulate_grad_batches": (MIRRORED, ("trainer.accumulate_grad_batches=2", *ONE_SAMPLE_BATCHES)),
    "val_check_interval": (REFUSED, ("trainer.val_check_interval=1",)),
    "limit_train_batches": (MIRRORED, ("trainer.limit_train_batches=0.5", *ONE_SAMPLE_BATCHES)),
    "limit_val_batches": (MIRRORED, ("trainer.limit_val_batches=1", "data.batch_size=1")),
    "limit_test_batches": (MIRRORED, ("trainer.limit_test_batches=0.5", "data.batch_size=1")),
    "max_steps": (REFUSED, ("trainer.max_steps=3",)),
    "plugins": (UNCHANGED, ("trainer.plugins=[]",)),
}
TRAINER_KEYS = [key for key in yaml.safe_load((CONF_DIR / "trainer" / "default.yaml").read_text()) if key != "_target_"]


@pytest.fixture(scope="module")
def all_unchanged_at_once(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One comparison with every UNCHANGED row's overrides set together."""
    rows = [overrides for outcome, overrides in AWAY_FROM_DEFAULT.values() if outcome == UNCHANGED]
    return run_compare(tmp_path_factory.mktemp("unchanged"), *[o for overrides in rows for o in overrides])[1]


def assert_agree(comparison: dict) -> None:
    """Per-step losses, final weights and every result row (timings aside) within the tolerance."""
    assert comparison["max_step_loss_diff"] <= TOLERANCE and comparison["max_weight_diff"] <= TOLERANCE, comparison
    for name, lightning in comparison["lightning"].items():
        if name not in ("wall time (s)", "samples/s"):
            assert abs(lightning - comparison["reference"][name]) <= TOLERANCE, (name, comparison)  # NaN fails too


def assert_refused_naming(tmp_path: Path, key: str, overrides: tuple[str, ...]) -> None:
    result = run_module(
        "project.optional.reference.compare", *overrides, f"hydra.run.dir={tmp_path / 'compare'}", cwd=tmp_path
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert f"trainer.{key}=" in line
    assert not (tmp_path / "compare" / "lightning").exists(), "refused before either side ran"


@pytest.mark.parametrize("key", TRAINER_KEYS)
def test_every_trainer_setting_agrees_on_both_paths_or_is_refused_in_one_line(
    tmp_path: Path, key: str, request: pytest.FixtureRequest
):
    assert key in AWAY_FROM_DEFAULT, f"conf/trainer/default.yaml has a new key: give trainer.{key} a row here"
    outcome, overrides = AWAY_FROM_DEFAULT[key]
    if outcome == REFUSED:
        assert_refused_naming(tmp_path, key, overrides)
    elif outcome == UNCHANGED:
        assert_agree(request.getfixturevalue("all_unchanged_at_once"))
    else:
        assert_agree(run_compare(tmp_path, *overrides)[1])


def test_accumulation_clipping_and_limits_together_agree_over_two_ddp_ranks(tmp_path: Path):
    """DDP reduces the gradients at each window's last batch only (no_sync before it), on both paths."""
    knobs = ("trainer.accumulate_grad_batches=2", "trainer.gradient_clip_val=0.1", "trainer.limit_train_batches=2")
    _, comparison, _ = run_compare(tmp_path, "trainer=ddp", "trainer.devices=2", *knobs, *ONE_SAMPLE_BATCHES)
    assert comparison["world_size"] == {"lightning": 2, "reference": 2}
    assert_agree(comparison)


@pytest.mark.parametrize("setting", ["callbacks.early_stopping.enabled=true", "results_from=best"])
def test_a_run_setting_the_reference_does_not_mirror_is_refused_in_one_line(tmp_path: Path, setting: str):
    result = run_module(
        "project.optional.reference.compare", setting, f"hydra.run.dir={tmp_path / 'compare'}", cwd=tmp_path
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: {setting} changes what the Lightning run")


def train_reference(tmp_path: Path, stop_inside_window: bool = False, ckpt_path: Path | None = None) -> Trainer:
    """The toy in batches of 1, accumulated in pairs, in this process; SIGTERM noted during batch 3 of the first
    epoch (the middle of its second window) where `stop_inside_window`."""
    cfg = reference_cfg(tmp_path, "trainer.accumulate_grad_batches=2", *ONE_SAMPLE_BATCHES)
    device = torch.device("cpu")
    datamodule, network, optimizer, schedule = build(cfg, device)
    trainer = Trainer(network, optimizer, schedule, device, TrainingHistory())
    trainer.settings = TrainerSettings.from_config(cfg.trainer)
    trainer.checkpointing = Checkpointing(tmp_path / "last.pt", datamodule)
    if ckpt_path is not None:
        trainer.load_checkpoint(ckpt_path)
    if stop_inside_window:
        count = trainer.train_totals.update

        def count_then_signal_at_batch_3(*batch) -> None:
            count(*batch)
            trainer.sigterm = trainer.sigterm or (trainer.epoch, trainer.batches_done) == (0, 2)

        trainer.train_totals.update = count_then_signal_at_batch_3
    trainer.fit(datamodule.train_dataloader(), None, cfg.trainer.max_epochs)
    return trainer


def test_a_reference_run_stopped_inside_an_accumulation_window_checkpoints_at_its_end_and_resumes_exactly(
    tmp_path: Path,
):
    whole = train_reference(tmp_path / "whole")
    with pytest.raises(RunStopped):
        train_reference(tmp_path / "stopped", stop_inside_window=True)
    state = torch.load(tmp_path / "stopped" / "last.pt", weights_only=True)
    assert (state["position"]["batches_done"], state["global_step"]) == (4, 2), "the window of batches 3-4 finished"

    resumed = train_reference(tmp_path / "resumed", ckpt_path=tmp_path / "stopped" / "last.pt")
    assert resumed.history.step_losses == whole.history.step_losses[4:]
    assert resumed.global_step == whole.global_step == 3 * math.ceil(5 / 2)
    assert all(torch.equal(a, b) for a, b in zip(resumed.model.parameters(), whole.model.parameters(), strict=True))


def test_compiled_networks_agree_over_two_ddp_ranks_and_their_checkpoint_evaluates_uncompiled(tmp_path: Path):
    """compile=true compiles the network in place on every rank of both paths; the checkpoint keeps the plain
    network's keys, so project.evaluate (which does not compile) reproduces the run's test accuracy from it."""
    _, comparison, run_dir = run_compare(tmp_path, "trainer=ddp", "trainer.devices=2", "compile=true")
    assert "compile=true: torch.compile of network" in (run_dir / "lightning.log").read_text()
    assert_agree(comparison)

    checkpoint = run_dir / "lightning" / "checkpoints" / "last.ckpt"
    result = check_ok(run_module("project.evaluate", f"ckpt_path={checkpoint}", cwd=tmp_path))
    evaluated = dict(line.split()[:2] for line in result.stdout.splitlines() if line.startswith("test/"))
    assert float(evaluated["test/loss"]) == pytest.approx(comparison["lightning"]["test/loss"], abs=5e-5), "4 decimals"
