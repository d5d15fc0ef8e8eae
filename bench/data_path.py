"""One training epoch fed in several ways, against the compute-only loop over preloaded tensors (the limit).

    compute only          the training set shuffled once up front, then contiguous slices: no data work per step
    datamodule            the project's `MNISTDataModule` loader (a sampler, one tensor index per batch)
    tensor dataset        `DataLoader(TensorDataset)`: one sample at a time, collated in Python
    torchvision PIL       torchvision's FashionMNIST dataset: every image through PIL and `ToTensor`
    datamodule, resident  (GPU variant) the datamodule's tensors in device memory: no copy per batch

Every path runs the same step (forward, cross-entropy, backward, optimizer step) on a fresh network, the same
number of batches, in interleaved repeats.
"""

import time
from collections.abc import Callable, Iterable

import torch
from hydra.utils import instantiate
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset
from torchvision import datasets, transforms

from bench.settings import Settings
from bench.timing import interleave, paired_ratio
from bench.training_runs import compose_config, load_datamodule
from project.data import InMemoryDataModule

WARMUP_STEPS = 20


def train_epoch(cfg, batches: Iterable[tuple[Tensor, Tensor]], device: torch.device, steps: int) -> list[float]:
    """Seconds for `steps` training steps over `batches` (moved to `device` when they are not there yet)."""
    torch.manual_seed(cfg.seed)
    network = instantiate(cfg.model.network).to(device)
    optimizer = instantiate(cfg.model.optimizer)(network.parameters())
    start = time.perf_counter()
    for _, (inputs, labels) in zip(range(steps), batches, strict=False):
        inputs, labels = inputs.to(device), labels.to(device)
        loss = nn.functional.cross_entropy(network(inputs), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return [time.perf_counter() - start]


def preloaded_slices(datamodule: InMemoryDataModule, device: torch.device) -> Iterable[tuple[Tensor, Tensor]]:
    order = torch.randperm(len(datamodule.train_set), generator=torch.Generator().manual_seed(0))
    inputs, targets = datamodule.train_set.inputs[order].to(device), datamodule.train_set.targets[order].to(device)
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
        "tensor dataset": lambda: DataLoader(
            TensorDataset(train.inputs, train.targets), batch_size=datamodule.batch_size, shuffle=True
        ),
        "torchvision PIL": lambda: torchvision_loader(settings, datamodule),
    }
    if settings.resident:
        loaders["datamodule, resident"] = load_datamodule(cfg, device).train_dataloader
    train_epoch(cfg, preloaded_slices(datamodule, device), device, WARMUP_STEPS)  # first-use costs, untimed
    seconds = interleave(
        {name: (lambda make=make: train_epoch(cfg, make(), device, steps)) for name, make in loaders.items()},
        settings.repeats,
    )
    samples = steps * datamodule.batch_size
    return {
        "steps": steps,
        "samples_per_second": {name: [samples / s for s in sum(times, [])] for name, times in seconds.items()},
        "throughput_vs_limit": {
            name: paired_ratio(seconds["compute only"], times).as_dict() for name, times in seconds.items()
        },
    }
