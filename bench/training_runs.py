"""The Lightning path on a composed config, timed epoch by epoch, and what every suite shares to run it.

`lightning_fit` builds what `python -m project.train` builds from a config (module, callbacks, loggers, Trainer)
and fits it, recording when each epoch starts and each training step ends (a `Clock`, which another loop can fill
too). It takes an already loaded datamodule, so that data loading stays out of the clock and every run of a suite
sees the same tensors.
"""

import logging
import os
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path

import lightning as L
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import DictConfig
from torch import Tensor, nn

import project  # noqa: F401  (registers the resolvers conf/ uses)
from project.engine.build import build as build_lightning
from project.engine.history import HistoryCallback
from project.engine.upstream import VERSION_BASE
from project.example.data import InMemoryDataModule, InMemoryDataset

CONF_DIR = Path(project.__file__).resolve().parents[1] / "conf"


def compose_config(overrides: list[str], run_dir: Path) -> DictConfig:
    """conf/train.yaml with `overrides`, writing into `run_dir` (there is no Hydra run dir outside `main`)."""
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        return compose("train", overrides=[*overrides, f"run_dir={run_dir}"])


@contextmanager
def quiet() -> Iterator[None]:
    """No progress bars, summaries or info lines in the bench's output; they still run and cost what they cost."""
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    with open(os.devnull, "w") as sink, redirect_stdout(sink), redirect_stderr(sink), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@dataclass
class Clock:
    """When each epoch started, when each training step ended, and when training ended (perf_counter seconds)."""

    epoch_starts: list[float] = field(default_factory=list)
    step_ends: list[float] = field(default_factory=list)
    end: float = 0.0

    def epoch_seconds(self) -> list[float]:
        """Each epoch from its start to the next one's: its training steps, validation and checkpoints."""
        bounds = [*self.epoch_starts, self.end]
        return [later - earlier for earlier, later in zip(bounds[:-1], bounds[1:], strict=True)]


class EpochClock(L.Callback):
    """Fills a `Clock` from Lightning's hooks (one list append per step)."""

    def __init__(self) -> None:
        self.clock = Clock()

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.clock.epoch_starts.append(time.perf_counter())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.clock.step_ends.append(time.perf_counter())

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.clock.end = time.perf_counter()


@dataclass
class FitRecord:
    """One timed fit: its clock and per-step training losses (empty where no history was recorded)."""

    clock: Clock
    step_losses: list[float]


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, inputs: Tensor, labels: Tensor) -> None:
    """The reference loop's step without its bookkeeping: forward, cross-entropy, zero grad, backward, update.
    The suites that time a bare loop (data paths, DDP scaling) all run this one."""
    loss = nn.functional.cross_entropy(model(inputs), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def load_datamodule(cfg: DictConfig, device: torch.device | None = None) -> InMemoryDataModule:
    """The config's datamodule, set up; with `device`, its tensors moved there once (GPU-resident data)."""
    datamodule: InMemoryDataModule = instantiate(cfg.data)
    datamodule.prepare_data()
    datamodule.setup("fit")
    if device is not None:
        for split in ("train_set", "val_set", "test_set"):
            dataset = getattr(datamodule, split)
            setattr(
                datamodule,
                split,
                InMemoryDataset(dataset.inputs.to(device), dataset.targets.to(device), dataset.normalise),
            )
    return datamodule


def lightning_fit(
    cfg: DictConfig, datamodule: InMemoryDataModule, extra_callbacks: list[L.Callback] = ()
) -> tuple[FitRecord, L.Trainer]:
    """`trainer.fit` of what `project.engine.build.build` makes of `cfg`, plus a clock, on the loaded `datamodule`."""
    clock = EpochClock()
    with quiet():
        setup = build_lightning(cfg, Path(cfg.run_dir).parent, [*extra_callbacks, clock])
        setup.trainer.fit(setup.module, datamodule=datamodule)
    histories = [callback.history for callback in setup.trainer.callbacks if isinstance(callback, HistoryCallback)]
    return FitRecord(clock.clock, histories[0].step_losses if histories else []), setup.trainer
