"""Edges of resuming and evaluating: last.ckpt when validation skips epochs, resuming a one-cycle schedule with a
new length, and DDP validation on a set the ranks cannot split evenly."""

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from project.engine.ddp import evaluated_once
from project.engine.errors import UserError
from project.example.data.in_memory import InMemoryDataModule, InMemoryDataset
from tests.helpers import check_ok, free_port, mnist_overrides, read_json, requires, run_module


def last_checkpoint(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)


@pytest.mark.slow
def test_last_checkpoint_holds_the_final_step_when_validation_skips_epochs(tmp_path: Path):
    run_dir = tmp_path / "run"
    args = ["trainer.max_epochs=3", "trainer.check_val_every_n_epoch=2", "logger=none", f"hydra.run.dir={run_dir}"]
    check_ok(run_module("project.train", *args, cwd=tmp_path))
    checkpoint = last_checkpoint(run_dir)
    # The toy problem takes 2 steps per epoch; epoch 2 (the third) is not validated.
    assert (checkpoint["global_step"], checkpoint["epoch"]) == (6, 2)


@pytest.mark.slow
def test_last_checkpoint_holds_the_final_step_when_validating_twice_per_epoch(tmp_path: Path, mnist_root: Path):
    run_dir = tmp_path / "run"
    args = mnist_overrides(mnist_root, "data.batch_size=50", "trainer.max_epochs=2", "trainer.val_check_interval=0.5")
    check_ok(run_module("project.train", *args, f"hydra.run.dir={run_dir}", cwd=tmp_path))
    checkpoint = last_checkpoint(run_dir)
    # 350 images in batches of 50: 7 steps per epoch, validated after steps 3 and 6 of each, not after the 7th.
    assert (checkpoint["global_step"], checkpoint["epoch"]) == (14, 1)


def train_then_resume(tmp_path: Path, mnist_root: Path, epochs: int, resumed_epochs: int):
    args = mnist_overrides(mnist_root, "data.batch_size=50")
    first = tmp_path / "first"
    check_ok(run_module("project.train", *args, f"trainer.max_epochs={epochs}", f"hydra.run.dir={first}", cwd=tmp_path))
    return run_module(
        "project.train",
        *args,
        f"trainer.max_epochs={resumed_epochs}",
        f"ckpt_path={first / 'checkpoints' / 'last.ckpt'}",
        f"hydra.run.dir={tmp_path / 'resumed'}",
        cwd=tmp_path,
    )


@pytest.mark.slow
def test_resume_with_a_longer_one_cycle_schedule_is_refused_in_one_line(tmp_path: Path, mnist_root: Path):
    result = train_then_resume(tmp_path, mnist_root, epochs=1, resumed_epochs=2)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("error:") and "trainer.max_epochs" in last_line, last_line
    # Both lengths: 7 steps per epoch, 7 stored in the checkpoint, 14 asked for.
    assert "7 steps" in last_line and "14" in last_line, last_line


@pytest.mark.slow
def test_resume_with_the_same_schedule_is_not_refused(tmp_path: Path, mnist_root: Path):
    result = check_ok(train_then_resume(tmp_path, mnist_root, epochs=2, resumed_epochs=2))
    assert "error:" not in result.stderr
    assert last_checkpoint(tmp_path / "first")["global_step"] == 14


def test_evaluation_loaders_give_each_process_its_own_samples_and_no_trainer_all():
    datamodule = InMemoryDataModule(batch_size=2, seed=0)
    datamodule.val_set = InMemoryDataset(torch.zeros(5, 1), torch.arange(5))
    # No Trainer attached (the reference path): the whole set, in order.
    assert [labels.tolist() for _, labels in datamodule.val_dataloader()] == [[0, 1], [2, 3], [4]]
    shares = []
    for rank in range(2):
        trainer = SimpleNamespace(world_size=2, global_rank=rank, strategy=None)
        loader = evaluated_once(datamodule.val_dataloader(), trainer, "validation")
        shares.append([label for _, labels in loader for label in labels.tolist()])
    assert shares == [[0, 2, 4], [1, 3]]
    trainer = SimpleNamespace(world_size=6, global_rank=0, strategy=None)
    with pytest.raises(UserError, match="validation set has 5 samples, fewer than the 6 processes"):
        evaluated_once(datamodule.val_dataloader(), trainer, "validation")


@pytest.mark.slow
@requires("reference")
def test_ddp_validation_on_an_odd_set_counts_every_sample_once(tmp_path: Path, mnist_root: Path):
    """51 validation images on 2 ranks: the numbers equal the torchrun reference, whose rank 0 evaluates alone."""
    args = mnist_overrides(mnist_root, "data.val_size=51", "data.batch_size=25", "trainer.max_epochs=1")
    lightning_dir, reference_dir = tmp_path / "lightning", tmp_path / "reference"
    env = {"OMP_NUM_THREADS": "1"}
    lightning = check_ok(
        run_module(
            "project.train",
            *args,
            "trainer=ddp",
            "trainer.devices=2",
            f"hydra.run.dir={lightning_dir}",
            cwd=tmp_path,
            env=env,
        )
    )
    launcher = (sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}")
    check_ok(
        run_module(
            "project.optional.reference.ddp",
            *args,
            f"hydra.run.dir={reference_dir}",
            cwd=tmp_path,
            env=env,
            launcher=launcher,
        )
    )
    got, expected = read_json(lightning_dir / "results.json"), read_json(reference_dir / "results.json")
    for name in ("val/loss", "val/acc", "test/loss", "test/acc"):
        assert got[name] == pytest.approx(expected[name], abs=1e-6), name
    assert "replicates some samples" not in lightning.stderr
