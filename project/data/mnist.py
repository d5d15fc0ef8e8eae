"""MNIST, Fashion-MNIST and KMNIST, read by torchvision once and then held in memory as normalised tensors.

torchvision's dataset classes find, download and parse the IDX files; after that no image goes through PIL or
`ToTensor` again: each split becomes one float tensor `[N, 1, 28, 28]`, normalised with the dataset's own mean and
standard deviation.
"""

import gzip
import os
import shutil
from pathlib import Path

import torch
from torchvision import datasets

from project.data.in_memory import InMemoryDataModule, InMemoryDataset
from project.errors import UserError

# name → (torchvision class, mean, std of the training images scaled to [0, 1])
DATASETS = {
    "mnist": (datasets.MNIST, 0.1307, 0.3081),
    "fashion_mnist": (datasets.FashionMNIST, 0.2860, 0.3530),
    "kmnist": (datasets.KMNIST, 0.1918, 0.3483),
}


class MNISTDataModule(InMemoryDataModule):
    """One of the MNIST family (`name`), with `val_size` training images held out by a seeded split."""

    def __init__(
        self,
        name: str,
        root: str,
        batch_size: int,
        seed: int,
        val_size: int = 5000,
        download: bool = True,
        drop_last: bool = False,
    ) -> None:
        super().__init__(batch_size=batch_size, seed=seed, drop_last=drop_last)
        if name not in DATASETS:
            raise UserError(f"data.name={name!r} is not one of {', '.join(DATASETS)}")
        self.dataset_class, self.mean, self.std = DATASETS[name]
        self.name = name
        self.root = Path(root)
        self.val_size = val_size
        self.download = download

    @property
    def raw_dir(self) -> Path:
        """Where torchvision looks for the four IDX files."""
        return self.root / self.dataset_class.__name__ / "raw"

    def prepare_data(self) -> None:
        """Make the four IDX files available (called once per node by Lightning, before `setup`)."""
        self._extract_gzipped_files()
        if self._missing_files() and self.download:
            try:
                self.dataset_class(str(self.root), train=True, download=True)
                self.dataset_class(str(self.root), train=False, download=True)
            except (RuntimeError, OSError) as error:
                reason = str(error).strip().splitlines()[-1]
                raise UserError(self._missing_message(f"the download failed ({reason})")) from None
        if self._missing_files():
            raise UserError(self._missing_message("data.download=false"))

    def setup(self, stage: str | None = None) -> None:
        if hasattr(self, "train_set"):
            return
        self.prepare_data()
        full_train = self._load_split(train=True)
        if not 0 < self.val_size < len(full_train):
            raise UserError(f"data.val_size must be between 1 and {len(full_train) - 1}, got {self.val_size}")
        order = torch.randperm(len(full_train), generator=torch.Generator().manual_seed(self.seed))
        val_index, train_index = order[: self.val_size], order[self.val_size :]
        self.train_set = InMemoryDataset(full_train.inputs[train_index], full_train.targets[train_index])
        self.val_set = InMemoryDataset(full_train.inputs[val_index], full_train.targets[val_index])
        self.test_set = self._load_split(train=False)

    def _load_split(self, train: bool) -> InMemoryDataset:
        split = self.dataset_class(str(self.root), train=train, download=False)
        images = split.data.unsqueeze(1).float().div_(255).sub_(self.mean).div_(self.std)
        return InMemoryDataset(images.contiguous(), split.targets.long())

    def _file_names(self) -> list[str]:
        return [Path(file_name).name.removesuffix(".gz") for file_name, _ in self.dataset_class.resources]

    def _missing_files(self) -> list[str]:
        return [name for name in self._file_names() if not (self.raw_dir / name).is_file()]

    def _extract_gzipped_files(self) -> None:
        """Unpack `<file>.gz` placed by hand, so copies of the originals work offline like a download.

        Each process unpacks into a file of its own and renames it into place, so ranks that start together never
        read a half-written file.
        """
        for name in self._missing_files():
            packed = self.raw_dir / f"{name}.gz"
            if packed.is_file():
                partial = self.raw_dir / f".{name}.{os.getpid()}.partial"
                with gzip.open(packed, "rb") as source, open(partial, "wb") as target:
                    shutil.copyfileobj(source, target)
                os.replace(partial, self.raw_dir / name)

    def _missing_message(self, why: str) -> str:
        return (
            f"{self.name}: {len(self._missing_files())} of its 4 files are missing in {self.raw_dir} and {why}. "
            f"Put these files there (each may be .gz): {', '.join(self._file_names())}"
        )
