"""Datasets held as tensors in memory, and the DataModule base that serves them in batches.

A standard `DataLoader` over a `TensorDataset` indexes one sample at a time and collates them in Python, a
per-sample cost that an MLP's step feels (bench/README.md, "data"). `InMemoryDataset.__getitems__` lets the loader
fetch a whole batch with one tensor index instead, while samplers stay standard: Lightning can still swap in a
`DistributedSampler`, and the raw reference path uses the very same `loader()`.
"""

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import lightning as L
import torch
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler

from project.data.training_order import EpochShuffleSampler, TrainingPosition, labels_checksum
from project.errors import UserError


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

    def subset(self, index: Tensor) -> "InMemoryDataset":
        """The samples at `index`, stored as they are here."""
        return InMemoryDataset(self.inputs[index], self.targets[index], self.normalise)

    def _prepared(self, inputs: Tensor) -> Tensor:
        return inputs if self.normalise is None else self.normalise(inputs)


def keep_batch(batch: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    """The loader's collate function: `__getitems__` already returns a collated batch."""
    return batch


class InMemoryDataModule(L.LightningDataModule):
    """Serves `train_set`, `val_set` and `test_set` (set by a subclass's `setup`) in batches.

    The training order comes from `seed` and the epoch (`EpochShuffleSampler`), not from the global RNG, so the
    Lightning path and the reference path see the same batches whatever else consumed random numbers. Where training
    stands in it is saved in every checkpoint (`state_dict`), so a mid-epoch checkpoint resumes at the next batch.
    Validation and test count every sample exactly once under every strategy (`evaluation_loader`).
    """

    train_set: InMemoryDataset
    val_set: InMemoryDataset
    test_set: InMemoryDataset
    # Each class's name, by label.
    class_names: tuple[str, ...]

    def __init__(self, batch_size: int, seed: int, drop_last: bool = False) -> None:
        super().__init__()
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise UserError(f"data.batch_size must be a positive integer, got {batch_size!r}")
        self.batch_size = batch_size
        self.seed = seed
        self.drop_last = drop_last
        self.predict_split = "test"
        # Where a resumed checkpoint left the training order (`load_state_dict`); None: from the start.
        self.resume_at: TrainingPosition | None = None

    def loader(self, dataset: InMemoryDataset, sampler: Sampler | None = None, train: bool = False) -> DataLoader:
        """A loader over `dataset`; `train` drops the last partial batch when configured to (`data.drop_last`)."""
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            sampler=sampler,
            drop_last=self.drop_last and train,
            collate_fn=keep_batch,
        )

    def processes(self) -> tuple[int, int]:
        """(processes sharing each epoch, this one's rank): (1, 0) alone, under `dp` and on the reference path."""
        share = self.trainer.distributed_sampler_kwargs if self.trainer is not None else None
        return (share["num_replicas"], share["rank"]) if share else (1, 0)

    def train_dataloader(self) -> DataLoader:
        """This process's training batches in the seeded order, from where a resumed checkpoint left it.

        Refused when `drop_last` would leave no batch at all.
        """
        processes, rank = self.processes()
        samples = -(-len(self.train_set) // processes)  # each process's share, as DistributedSampler pads it
        if self.drop_last and samples < self.batch_size:
            raise UserError(
                f"data.batch_size={self.batch_size} is more than the {samples} training samples each of the "
                f"{processes} process(es) gets, and data.drop_last=true drops that incomplete batch, so no training "
                f"step would run: use data.batch_size <= {samples} (or data.drop_last=false)"
            )
        sampler = EpochShuffleSampler(self.train_set, self.seed, processes, rank)
        if self.resume_at is not None:
            sampler.start_part_way(self.resume_at.epoch, self.resume_at.batches_done * self.batch_size)
        return self.loader(self.train_set, sampler, train=True)

    def position(self, epoch: int, batches_done: int, processes: int) -> TrainingPosition:
        """`batches_done` batches of epoch `epoch` trained by each of `processes` processes, in this data's order."""
        return TrainingPosition(
            epoch,
            batches_done,
            self.batch_size,
            processes,
            self.seed,
            len(self.train_set),
            labels_checksum(self.train_set.targets),
        )

    def state_dict(self) -> dict:
        """Where training stands in its order, which Lightning saves in every checkpoint it writes while fitting.

        Lightning's count of batches trained in this epoch, not the loader's: it fetches one batch ahead.
        """
        trainer = self.trainer
        if trainer is None or not hasattr(self, "train_set"):
            return {}
        epoch, done = trainer.current_epoch, trainer.fit_loop.epoch_loop.batch_progress.current.processed
        if done >= trainer.num_training_batches:  # the epoch is over: the next one starts from its beginning
            epoch, done = epoch + 1, 0
        return asdict(self.position(epoch, done, self.processes()[0]))

    def load_state_dict(self, state: dict) -> None:
        """Resume the training order at the checkpoint's position; a mid-epoch one must mean the same samples."""
        saved = TrainingPosition(**state)
        saved.check_resumable_as(self.position(saved.epoch, saved.batches_done, self.processes()[0]))
        self.resume_at = saved

    def evaluation_loader(self, dataset: InMemoryDataset, name: str) -> DataLoader:
        """A loader over all of `dataset`, or over this process's share when a multi-process Trainer runs it.

        Lightning would otherwise give each process a `DistributedSampler`, which repeats samples to even out the
        shares, so a set the processes cannot split evenly would count some samples twice. Lightning leaves a
        `DistributedSampler` it finds in place; `UnrepeatedDistributedSampler` is one that gives process r the
        samples r, r + N, r + 2N, ... and nothing twice. The shares may differ by a batch: the metric sums them once
        per epoch. Without a Trainer (the reference path) the loader covers the whole set.
        """
        trainer = self.trainer
        if trainer is None or trainer.world_size == 1:
            return self.loader(dataset)
        if len(dataset) < trainer.world_size:
            # A process without a sample would skip the epoch's sum over processes and leave the others waiting.
            raise UserError(
                f"the {name} set has {len(dataset)} samples, fewer than the {trainer.world_size} processes: "
                "run on fewer devices or use a larger set"
            )
        sampler = UnrepeatedDistributedSampler(
            dataset, num_replicas=trainer.world_size, rank=trainer.global_rank, shuffle=False
        )
        return self.loader(dataset, sampler)

    def val_dataloader(self) -> DataLoader:
        return self.evaluation_loader(self.val_set, "validation")

    def test_dataloader(self) -> DataLoader:
        return self.evaluation_loader(self.test_set, "test")

    def predict_dataloader(self) -> DataLoader:
        """The split named by `predict_split` (`project.predict`'s `split=`), every sample once, in order."""
        return self.evaluation_loader(getattr(self, f"{self.predict_split}_set"), self.predict_split)
