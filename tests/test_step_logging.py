"""The per-step scalars: `train/step_loss` and `train/lr` are written on the same steps, with that step's values."""

import csv
import functools
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger

from project.engine.schedules import RUN_STEPS
from project.example.data import ToyDataModule
from project.example.module import ClassifierModule
from project.example.networks import NeuralNetwork

EPOCHS, EVERY = 4, 3


def learning_rates_of_the_schedule(steps: int) -> list[float]:
    """The learning rate each optimizer step uses, replayed on a bare optimizer and schedule."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.5, total_steps=steps)
    rates = []
    for _ in range(steps):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    return rates


def test_step_loss_and_learning_rate_are_logged_on_the_same_steps_with_that_steps_rate(tmp_path: Path):
    L.seed_everything(0)
    module = ClassifierModule(
        NeuralNetwork(2, 2),
        functools.partial(torch.optim.SGD, lr=0.5),
        functools.partial(torch.optim.lr_scheduler.OneCycleLR, max_lr=0.5, total_steps=RUN_STEPS),
    )
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=EPOCHS,
        log_every_n_steps=EVERY,
        logger=CSVLogger(tmp_path, name="", version=""),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, datamodule=ToyDataModule(batch_size=2, seed=0, drop_last=True))

    with open(tmp_path / "metrics.csv") as file:
        rows = list(csv.DictReader(file))
    loss_steps = [int(row["step"]) for row in rows if row.get("train/step_loss")]
    rate_rows = [(int(row["step"]), float(row["train/lr"])) for row in rows if row.get("train/lr")]
    steps = trainer.global_step
    assert steps == EPOCHS * 2
    # Steps 0-based: Lightning writes step g when (g + 1) is a multiple of log_every_n_steps.
    assert loss_steps == [step for step, _ in rate_rows] == [g for g in range(steps) if (g + 1) % EVERY == 0]
    schedule = learning_rates_of_the_schedule(steps)
    # Logged as float32 tensors.
    assert [rate for _, rate in rate_rows] == pytest.approx([schedule[step] for step, _ in rate_rows], rel=1e-6)
