"""The `experiment=mnist` recipe on Fashion-MNIST through the default Lightning path, with the test accuracy
after every epoch: how many epochs and seconds it takes to reach 85 %, 88 %, and the best it reaches.

The clock runs from the start of training and stops while the test set is evaluated, so the seconds are those of
training (with its validation and checkpoints), as `python -m project.train` spends them.
"""

import time
from pathlib import Path

import lightning as L
import torch
from torch import nn

from bench.report import Row
from bench.settings import Settings
from bench.training_runs import compose_config, lightning_fit, load_datamodule
from project.example.data import InMemoryDataset
from project.example.metrics import ClassificationTotals

TARGETS = (0.85, 0.88)
QUICK_EPOCHS = 2  # `--quick`: the probe after each epoch, not the recipe's ten


class TestAccuracyProbe(L.Callback):
    """After each epoch's validation (and checkpoint), the network's accuracy on the test set, off the clock."""

    def __init__(self, test_set: InMemoryDataset) -> None:
        self.test_set = test_set
        self.points: list[dict] = []

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.start = time.perf_counter()
        self.paused = 0.0

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        stopped = time.perf_counter()
        accuracy = test_accuracy(pl_module, self.test_set)
        seconds = stopped - self.start - self.paused
        self.points.append({"epoch": trainer.current_epoch + 1, "seconds": seconds, "test_acc": accuracy})
        self.paused += time.perf_counter() - stopped


@torch.no_grad()
def test_accuracy(module: L.LightningModule, test_set: InMemoryDataset, chunk: int = 2000) -> float:
    """Counted with the metric both training paths use, in this process alone."""
    was_training = module.training
    module.eval()
    totals = ClassificationTotals(sync_on_compute=False).to(module.device)
    for start in range(0, len(test_set), chunk):
        inputs = test_set[start : start + chunk][0].to(module.device)
        targets = test_set.targets[start : start + chunk].to(module.device)
        logits = module(inputs)
        totals.update(logits, targets, nn.functional.cross_entropy(logits, targets))
    module.train(was_training)
    return totals.compute()["acc"].item()


def first_reaching(points: list[dict], target: float) -> dict | None:
    return next((point for point in points if point["test_acc"] >= target), None)


def run(settings: Settings, recipe: list[str], scratch: Path) -> dict:
    overrides = [*recipe, settings.trainer_override()]
    if settings.quick:
        overrides.append(f"trainer.max_epochs={QUICK_EPOCHS}")
    cfg = compose_config(overrides, scratch)
    datamodule = load_datamodule(cfg, torch.device(settings.device) if settings.resident else None)
    probe = TestAccuracyProbe(datamodule.test_set)
    lightning_fit(cfg, datamodule, [probe])
    best = max(probe.points, key=lambda point: point["test_acc"])
    return {
        "overrides": overrides,
        "max_epochs": cfg.trainer.max_epochs,
        "points": probe.points,
        **{f"to_{round(target * 100)}": first_reaching(probe.points, target) for target in TARGETS},
        "best": best,
    }


def rows(result: dict) -> list[Row]:
    table = []
    for key, what in (("to_85", "85 %"), ("to_88", "88 %"), ("best", "best")):
        point = result[key]
        cell = "not reached" if point is None else f"{point['test_acc'] * 100:6.2f} %"
        note = "" if point is None else f"epoch {point['epoch']}, {point['seconds']:.1f} s of training"
        table.append((f"accuracy: {what} (test, {result['max_epochs']} epochs)", cell, note))
    return table
