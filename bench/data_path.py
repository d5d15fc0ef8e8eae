"""One training epoch fed in several ways, against the compute-only loop over preloaded tensors (the limit).

    compute only          the training set shuffled once up front, then contiguous slices: no data work per step
    datamodule            the project's `MNISTDataModule` loader (a sampler, one tensor index per batch)
    tensor dataset        `DataLoader(TensorDataset)`: one sample at a time, collated in Python
    torchvision PIL       torchvision's FashionMNIST dataset: every image through PIL and `ToTensor`
    datamodule, resident  (GPU variant) the datamodule's tensors in device memory: no copy per batch

Every path runs the same step (forward, cross-entropy, backward, optimizer step) on a fresh network, the same
number of batches. The paths run side by side in chunks of `CHUNK_STEPS` steps (one chunk of each per turn, in
a new random order each turn), so a slow spell of the machine, which lasts seconds on a shared host, falls on
all of them; a whole epoch of one path after a whole epoch of another swung the ratio by ±0.1 from run to run.
Switching paths costs each chunk about the same (other weights in the cache), which nudges the ratios towards 1:
chunks of 25 steps gave the same medians within the noise (0.91, 0.93, 0.96 in three runs; 0.93, 0.97 at 5).
"""

import random
import statistics
import time
from collections.abc import Callable, Iterable

import torch
from hydra.utils import instantiate
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset
from torchvision import datasets, transforms

from bench.plots import Panel
from bench.report import Row, ratio_cell
from bench.settings import Settings
from bench.timing import paired_ratio
from bench.training_runs import compose_config, load_datamodule, train_step
from project.example.data import InMemoryDataModule

WARMUP_STEPS = 20
CHUNK_STEPS = 5  # ~10 ms of training per turn on a 2-core CPU: narrower spreads than 25 steps gave


class TimedTraining:
    """One path's network and optimizer, fed from its batches, with the seconds its steps took so far."""

    def __init__(self, cfg, batches: Iterable[tuple[Tensor, Tensor]], device: torch.device) -> None:
        torch.manual_seed(cfg.seed)
        self.network = instantiate(cfg.model.network).to(device)
        self.optimizer = instantiate(cfg.model.optimizer)(self.network.parameters())
        self.batches = iter(batches)
        self.device = device
        self.seconds = 0.0

    def run(self, steps: int) -> None:
        """Train `steps` steps (fetch, move to the device, forward, backward, update) and add their time."""
        start = time.perf_counter()
        for _, (inputs, labels) in zip(range(steps), self.batches, strict=False):
            train_step(self.network, self.optimizer, inputs.to(self.device), labels.to(self.device))
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.seconds += time.perf_counter() - start


def epoch_side_by_side(cfg, loaders: dict[str, Callable[[], Iterable]], device: torch.device, steps: int) -> dict:
    """Seconds of one `steps`-step epoch of every path, the paths taking turns chunk by chunk."""
    paths = {name: TimedTraining(cfg, make(), device) for name, make in loaders.items()}
    order = list(paths)
    shuffler = random.Random(cfg.seed)
    for done in range(0, steps, CHUNK_STEPS):
        shuffler.shuffle(order)  # a new order each turn: no path always follows the same other one
        for name in order:
            paths[name].run(min(CHUNK_STEPS, steps - done))
    return {name: path.seconds for name, path in paths.items()}


def preloaded_slices(datamodule: InMemoryDataModule, device: torch.device) -> Iterable[tuple[Tensor, Tensor]]:
    order = torch.randperm(len(datamodule.train_set), generator=torch.Generator().manual_seed(0))
    inputs, targets = (tensor.to(device) for tensor in datamodule.train_set[order])
    size = datamodule.batch_size
    return [(inputs[i : i + size], targets[i : i + size]) for i in range(0, len(targets), size)]


def torchvision_loader(settings: Settings, datamodule) -> DataLoader:
    normalise = transforms.Compose([transforms.ToTensor(), transforms.Normalize((datamodule.mean,), (datamodule.std,))])
    dataset = datasets.FashionMNIST(str(settings.data_root), train=True, download=False, transform=normalise)
    if settings.quick:
        dataset = torch.utils.data.Subset(dataset, range(len(datamodule.train_set)))
    return DataLoader(dataset, batch_size=datamodule.batch_size, shuffle=True)


def run(settings: Settings, recipe: list[str], scratch) -> dict:
    cfg = compose_config(recipe, scratch)
    device = torch.device(settings.device)
    datamodule = load_datamodule(cfg)
    steps = len(datamodule.train_dataloader())
    train = datamodule.train_set
    loaders: dict[str, Callable[[], Iterable]] = {
        "compute only": lambda: preloaded_slices(datamodule, device),
        "datamodule": datamodule.train_dataloader,
        "tensor dataset": lambda: DataLoader(TensorDataset(*train[:]), batch_size=datamodule.batch_size, shuffle=True),
        "torchvision PIL": lambda: torchvision_loader(settings, datamodule),
    }
    if settings.resident:
        loaders["datamodule, resident"] = load_datamodule(cfg, device).train_dataloader
    TimedTraining(cfg, preloaded_slices(datamodule, device), device).run(WARMUP_STEPS)  # first-use costs, untimed
    seconds: dict[str, list[list[float]]] = {name: [] for name in loaders}
    for _ in range(settings.repeats):
        for name, epoch_seconds in epoch_side_by_side(cfg, loaders, device, steps).items():
            seconds[name].append([epoch_seconds])
    samples = steps * datamodule.batch_size
    return {
        "steps": steps,
        "samples_per_second": {name: [samples / s for s in sum(times, [])] for name, times in seconds.items()},
        "throughput_vs_limit": {
            name: paired_ratio(seconds["compute only"], times).as_dict() for name, times in seconds.items()
        },
    }


def rows(result: dict) -> list[Row]:
    table = []
    for path, spread in result["throughput_vs_limit"].items():
        if path != "compute only":
            rate = statistics.median(result["samples_per_second"][path])
            goal = ", goal >= 0.90" if path.startswith("datamodule") else ""
            table.append((f"data: {path} / compute-only limit", ratio_cell(spread), f"{rate:,.0f} samples/s{goal}"))
    return table


def panels(result: dict) -> list[Panel]:
    """The throughput figure's panel of the data paths (training steps only)."""
    return [Panel("Data paths: one training epoch", "samples / s", result["samples_per_second"])]
