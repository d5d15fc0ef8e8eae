"""The training loop the four reference scripts share: build, train, evaluate, write the run's outputs.

It mirrors Lightning's defaults step by step (seed, then data, then network; forward, zero grad, backward, step,
schedule step; validation after every epoch) so that the two paths give the same numbers.
"""

import math
import time
from pathlib import Path

import torch
import torch.distributed as dist
from hydra.utils import instantiate
from omegaconf import DictConfig
from torch import Tensor, nn
from torch.utils.data import DataLoader
from torch.utils.tensorboard import SummaryWriter

from project.data import InMemoryDataModule
from project.metrics import ClassificationTotals
from project.runs.history import TrainingHistory
from project.runs.results import format_results_table, save_results

Scheduler = torch.optim.lr_scheduler.LRScheduler


def pick_device(local_rank: int = 0) -> torch.device:
    """The tutorial's choice: a CUDA GPU if there is one, else Apple's MPS, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank)
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def build(
    cfg: DictConfig, device: torch.device
) -> tuple[InMemoryDataModule, nn.Module, torch.optim.Optimizer, Scheduler | None]:
    """Seed, then data, then network, optimizer and schedule: the order (and so the random numbers) of
    `project.train`. The schedule (None without `model.scheduler`) spans the run's optimizer steps, as Lightning
    sizes it."""
    torch.manual_seed(cfg.seed)
    datamodule: InMemoryDataModule = instantiate(cfg.data)
    datamodule.prepare_data()
    datamodule.setup("fit")
    network = instantiate(cfg.model.network).to(device)
    optimizer = instantiate(cfg.model.optimizer)(network.parameters())
    scheduler = None
    if cfg.model.get("scheduler") is not None:
        total_steps = steps_per_epoch(datamodule) * cfg.trainer.max_epochs
        scheduler = instantiate(cfg.model.scheduler)(optimizer, total_steps=total_steps)
    return datamodule, network, optimizer, scheduler


def steps_per_epoch(datamodule: InMemoryDataModule) -> int:
    """This process's optimizer steps per epoch, counted as Lightning counts them for `total_steps`: batches of its
    `DistributedSampler` share of the training set (all of it in one process)."""
    world_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    samples = math.ceil(len(datamodule.train_set) / world_size)
    return samples // datamodule.batch_size if datamodule.drop_last else math.ceil(samples / datamodule.batch_size)


class Trainer:
    """Trains `model` (the network, or a DataParallel/DDP wrapper of it) and evaluates it.

    The epoch's loss and accuracy are counted with the Lightning path's metric (`ClassificationTotals`); under
    DDP its `compute()` sums them over all processes, so they cover all of the data on every rank.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Scheduler | None,
        device: torch.device,
        history: TrainingHistory,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.device = device
        self.history = history
        self.train_totals = ClassificationTotals().to(device)
        self.epoch_metrics: list[dict[str, float]] = []

    def _run_batch(self, inputs: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        logits = self.model(inputs)
        loss = nn.functional.cross_entropy(logits, labels)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()  # after every optimizer step, as Lightning steps a schedule with interval "step"
        return logits, loss.detach()

    def _run_epoch(self, loader: DataLoader) -> dict[str, float]:
        self.model.train()
        losses = []
        for inputs, labels in loader:
            inputs, labels = inputs.to(self.device), labels.to(self.device)
            logits, loss = self._run_batch(inputs, labels)
            losses.append(loss)
            self.train_totals.update(logits, labels, loss)
        self.history.end_epoch(losses, samples=int(self.train_totals.count))  # this process's samples
        metrics = {f"train/{name}": value.item() for name, value in self.train_totals.compute().items()}
        self.train_totals.reset()
        return metrics

    def fit(self, train_loader: DataLoader, val_loader: DataLoader | None, epochs: int) -> None:
        """Train `epochs` epochs, validating after each one when `val_loader` is given (rank 0 only in DDP)."""
        start = time.perf_counter()
        for epoch in range(epochs):
            if hasattr(train_loader.sampler, "set_epoch"):
                train_loader.sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
            metrics = self._run_epoch(train_loader)
            if val_loader is not None:
                metrics |= self.evaluate(val_loader, "val")
            self.epoch_metrics.append(metrics)
        self.history.fit_seconds = time.perf_counter() - start

    @torch.no_grad()
    def evaluate(self, loader: DataLoader, stage: str) -> dict[str, float]:
        """Mean loss and accuracy of the current weights on `loader`, keyed `<stage>/loss`, `<stage>/acc`."""
        self.model.eval()
        totals = ClassificationTotals(sync_on_compute=False).to(self.device)  # one process sees the whole set
        for inputs, labels in loader:
            inputs, labels = inputs.to(self.device), labels.to(self.device)
            logits = self.model(inputs)
            totals.update(logits, labels, nn.functional.cross_entropy(logits, labels))
        return {f"{stage}/{name}": value.item() for name, value in totals.compute().items()}


def fit_and_report(
    cfg: DictConfig,
    trainer: Trainer,
    datamodule: InMemoryDataModule,
    network: nn.Module,
    train_loader: DataLoader,
    is_main: bool = True,
) -> None:
    """Train; every process saves its history; the main one alone validates, tests and writes the run's outputs."""
    trainer.fit(train_loader, datamodule.val_dataloader() if is_main else None, cfg.trainer.max_epochs)
    trainer.history.save(cfg.run_dir)
    if is_main:
        results = collect_results(trainer, trainer.evaluate(datamodule.test_dataloader(), "test"), cfg.run_dir)
        write_outputs(cfg.run_dir, trainer, network, results)


def write_outputs(run_dir: str | Path, trainer: Trainer, network: nn.Module, results: dict) -> None:
    """What the main process of a reference run leaves in its run dir, in the Lightning path's layout."""
    run_dir = Path(run_dir)
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    torch.save(network.state_dict(), run_dir / "checkpoints" / "model.pt")  # the bare network: no `module.`
    with SummaryWriter(run_dir / "tensorboard") as writer:
        for step, loss in enumerate(trainer.history.step_losses):
            writer.add_scalar("train/step_loss", loss, step)
        for epoch, metrics in enumerate(trainer.epoch_metrics):
            for name, value in metrics.items():
                writer.add_scalar(name, value, epoch)
        for name in ("test/loss", "test/acc"):
            writer.add_scalar(name, results[name], len(trainer.epoch_metrics))
    save_results(results, run_dir)
    print(format_results_table(results), flush=True)


def collect_results(trainer: Trainer, test_metrics: dict, run_dir: str | Path) -> dict:
    """The same keys as the Lightning path's results.json."""
    return trainer.epoch_metrics[-1] | test_metrics | trainer.history.run_summary(run_dir)
