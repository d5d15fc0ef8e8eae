"""The reference loop on a composed config, timed as `training_runs.lightning_fit` times the Lightning path.

`reference_fit` runs the loop of `python -m project.optional.reference.single`, recording when each epoch starts and
each training step ends in the same `Clock`, on the same already loaded datamodule.
"""

import time

import torch
from omegaconf import DictConfig

from bench.training_runs import Clock, FitRecord
from project.engine.history import TrainingHistory
from project.example.data import InMemoryDataModule
from project.optional.reference.loop import Trainer, build


class ClockedTrainer(Trainer):
    """The reference loop, unchanged, with the same timestamps as `training_runs.EpochClock`."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.clock = Clock()

    def _run_epoch(self, loader) -> dict[str, float]:
        self.clock.epoch_starts.append(time.perf_counter())
        return super()._run_epoch(loader)

    def _run_batch(
        self, inputs: torch.Tensor, labels: torch.Tensor, batch_index: int, steps: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        result = super()._run_batch(inputs, labels, batch_index, steps)
        self.clock.step_ends.append(time.perf_counter())
        return result


def reference_fit(cfg: DictConfig, datamodule: InMemoryDataModule, device: torch.device) -> FitRecord:
    """`project.optional.reference.single`'s loop on `device` (network, optimizer and schedule from `build`)."""
    _, network, optimizer, scheduler = build(cfg, device)
    trainer = ClockedTrainer(network, optimizer, scheduler, device, TrainingHistory())
    trainer.fit(datamodule.train_dataloader(), datamodule.val_dataloader(), cfg.trainer.max_epochs)
    trainer.clock.end = time.perf_counter()
    return FitRecord(trainer.clock, trainer.history.step_losses)
