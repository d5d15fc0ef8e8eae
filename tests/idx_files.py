"""Small, valid MNIST-format (IDX, gzip) files for tests: torchvision parses them like the real ones."""

import gzip
import struct
from pathlib import Path

import torch

FILE_NAMES = {
    True: ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    False: ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def make_images(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Learnable 28×28 uint8 images: class c lights up row block c, plus noise."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (count,), generator=generator)
    images = torch.randint(0, 60, (count, 28, 28), generator=generator)
    for index, label in enumerate(labels.tolist()):
        images[index, 2 * label + 4 : 2 * label + 6, 4:24] = 250
    return images.to(torch.uint8), labels.to(torch.uint8)


def write_idx_split(raw_dir: Path, train: bool, count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Write one split's two `.gz` files into `raw_dir`; return the images and labels written."""
    raw_dir.mkdir(parents=True, exist_ok=True)
    images, labels = make_images(count, seed)
    image_name, label_name = FILE_NAMES[train]
    with gzip.open(raw_dir / f"{image_name}.gz", "wb") as f:
        f.write(struct.pack(">IIII", 0x803, count, 28, 28) + images.numpy().tobytes())
    with gzip.open(raw_dir / f"{label_name}.gz", "wb") as f:
        f.write(struct.pack(">II", 0x801, count) + labels.numpy().tobytes())
    return images, labels


def write_idx_dataset(root: Path, folder: str = "MNIST", train_count: int = 400, test_count: int = 100) -> Path:
    """A full dataset under `root/<folder>/raw`, the layout torchvision expects; returns the raw dir."""
    raw_dir = root / folder / "raw"
    write_idx_split(raw_dir, train=True, count=train_count, seed=1)
    write_idx_split(raw_dir, train=False, count=test_count, seed=2)
    return raw_dir
