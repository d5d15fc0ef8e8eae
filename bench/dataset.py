"""Where the bench finds Fashion-MNIST, and the small copy of it that `--quick` trains on.

The bench reads the same IDX files as `data=fashion_mnist` (`<root>/FashionMNIST/raw/`). `--quick` writes the first
few thousand images into a scratch root, so that every suite runs its real code end to end in seconds.
"""

import gzip
import math
import struct
from pathlib import Path

import numpy as np

from project.engine.errors import UserError

DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def raw_dir(root: Path) -> Path:
    return root / "FashionMNIST" / "raw"


def has_fashion_mnist(root: Path) -> bool:
    """All four files, packed (.gz) or not."""
    names = [name for pair in FILES.values() for name in pair]
    return all((raw_dir(root) / name).is_file() or (raw_dir(root) / f"{name}.gz").is_file() for name in names)


def find_root(requested: str | None, scratch: Path) -> Path:
    """The data root to use: `requested`, else `.gpudata/` or `data/` here, else Debian's files linked into scratch."""
    if requested is not None:
        if not has_fashion_mnist(Path(requested)):
            raise UserError(f"--data-root {requested}: no Fashion-MNIST in {raw_dir(Path(requested))}")
        return Path(requested)
    for candidate in (Path(".gpudata"), Path("data")):
        if has_fashion_mnist(candidate):
            return candidate
    if DEBIAN_FASHION_MNIST.is_dir():
        raw = raw_dir(scratch / "fashion-mnist")
        raw.mkdir(parents=True, exist_ok=True)
        for packed in DEBIAN_FASHION_MNIST.glob("*.gz"):
            if not (raw / packed.name).exists():
                (raw / packed.name).symlink_to(packed)
        return scratch / "fashion-mnist"
    raise UserError(
        "the bench needs Fashion-MNIST: pass --data-root, run `make data-fashion-mnist`, or install Debian's "
        f"dataset-fashion-mnist ({DEBIAN_FASHION_MNIST})"
    )


def read_idx(path: Path, count: int) -> np.ndarray:
    """The first `count` items of an IDX file (packed or not), unsigned bytes; only they are read (and unpacked)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as file:
        dimensions = file.read(4)[3]
        items, *item_shape = struct.unpack(f">{dimensions}I", file.read(4 * dimensions))
        shape = (min(count, items), *item_shape)
        return np.frombuffer(file.read(math.prod(shape)), dtype=np.uint8).reshape(shape)


def write_idx(path: Path, array: np.ndarray) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + np.ascontiguousarray(array, dtype=np.uint8).tobytes())


def small_copy(root: Path, scratch: Path, sizes: dict[str, int]) -> Path:
    """A root with the first `sizes[split]` images of each split of `root`, for `--quick`."""
    target = scratch / "fashion-mnist-small"
    raw_dir(target).mkdir(parents=True, exist_ok=True)
    for split, names in FILES.items():
        for name in names:
            source = raw_dir(root) / name
            source = source if source.is_file() else source.with_name(f"{name}.gz")
            write_idx(raw_dir(target) / name, read_idx(source, sizes[split]))
    return target
