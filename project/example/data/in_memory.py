"""Datasets held as tensors in memory, and the DataModule that serves them in batches.

A standard `DataLoader` over a `TensorDataset` indexes one sample at a time and collates them in Python, a
per-sample cost that an MLP's step feels (docs/performance.md, "Data"). `InMemoryDataset.__getitems__` lets the loader
fetch a whole batch with one tensor index instead, while samplers stay standard, and the raw reference path uses the
very same `loader()`. Right for the MNIST family; images that do not fit in memory: `data=image_folder`.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler

from project.example.data.classification import ClassificationDataModule


@dataclass(frozen=True)
class Normalise:
    """8-bit pixels to the network's inputs: `(pixels / 255 - mean) / std`, in float32.

    Images are held as the uint8 they are stored in (a quarter of float32's memory: 55 MB for the 70 000 MNIST
    images instead of 220 MB) and normalised a batch at a time as they are fetched. The operations and their order
    are the ones a whole split was normalised with before, so every value is bitwise the same.
    """

    mean: float
    std: float

    def __call__(self, pixels: Tensor) -> Tensor:
        return pixels.float().div_(255).sub_(self.mean).div_(self.std)


class InMemoryDataset(Dataset):
    """Inputs and integer labels as two tensors; `dataset[i]` (or a slice) is samples, `__getitems__` a whole batch.

    `normalise`, if given, turns the stored `inputs` (uint8 pixels) into the network's inputs on every fetch.
    """

    def __init__(self, inputs: Tensor, targets: Tensor, normalise: Normalise | None = None) -> None:
        if len(inputs) != len(targets):
            raise ValueError(f"{len(inputs)} inputs but {len(targets)} targets")
        self.inputs = inputs
        self.targets = targets
        self.normalise = normalise

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int | slice | Tensor) -> tuple[Tensor, Tensor]:
        return self._prepared(self.inputs[index]), self.targets[index]

    def __getitems__(self, indices: Sequence[int]) -> tuple[Tensor, Tensor]:
        # `index_select` with the index already on the data's device: advanced indexing (`inputs[index]`) takes a
        # general path and, for GPU-resident data, copies a CPU index to the device twice. Naming the dtype spares
        # `as_tensor` inferring it from every Python int of the batch.
        index = torch.as_tensor(indices, dtype=torch.long, device=self.inputs.device)
        return self._prepared(self.inputs.index_select(0, index)), self.targets.index_select(0, index)

    def image(self, index: int) -> Tensor | None:
        """The stored image at `index`, uint8 `[channels, height, width]` (what `project.predict` draws); None when
        the samples are no images (the toy's points)."""
        return self.inputs[index] if self.inputs.dtype == torch.uint8 else None

    def subset(self, index: Tensor) -> "InMemoryDataset":
        """The samples at `index`, stored as they are here."""
        return InMemoryDataset(self.inputs[index], self.targets[index], self.normalise)

    def _prepared(self, inputs: Tensor) -> Tensor:
        return inputs if self.normalise is None else self.normalise(inputs)


def keep_batch(batch: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    """The loader's collate function: `__getitems__` already returns a collated batch."""
    return batch


class InMemoryDataModule(ClassificationDataModule):
    """A `ClassificationDataModule` of `InMemoryDataset`s: each batch is one tensor index, no workers."""

    train_set: InMemoryDataset
    val_set: InMemoryDataset
    test_set: InMemoryDataset

    def loader(self, dataset: InMemoryDataset, sampler: Sampler | None = None, train: bool = False) -> DataLoader:
        """A loader over `dataset`; `train` drops the last partial batch when configured to (`data.drop_last`)."""
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            sampler=sampler,
            drop_last=self.drop_last and train,
            collate_fn=keep_batch,
        )
