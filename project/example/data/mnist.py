"""MNIST, Fashion-MNIST and KMNIST, read by torchvision once and then held in memory as uint8 tensors.

torchvision's dataset classes download the IDX files and its parser reads them; after that no image goes through
PIL or `ToTensor` again: each split becomes one uint8 tensor `[N, 1, 28, 28]`, and each batch is normalised with the
dataset's own mean and standard deviation as it is fetched (`Normalise`).

The files are checked here first because torchvision's parser does not say which file is wrong: a damaged download
or copy would end in a bare assert or reshape traceback. Each `.gz` is checked as it is unpacked and each IDX file's
header (magic number, 28×28, item count against the file's size) before it is parsed, and each label against the
dataset's classes (a label no class has would fail only when its batch is trained); damage raises a `UserError`
naming the file and the fix. The checks read headers, sizes and the labels, never the images a second time.
"""

import contextlib
import gzip
import os
import shutil
import struct
import tempfile
import zlib
from pathlib import Path

import torch
from torchvision import datasets
from torchvision.datasets.mnist import read_image_file, read_label_file

from project.engine.errors import UserError
from project.example.data.in_memory import InMemoryDataModule, InMemoryDataset, Normalise

# name → (torchvision class, mean, std of the training images scaled to [0, 1])
DATASETS = {
    "mnist": (datasets.MNIST, 0.1307, 0.3081),
    "fashion_mnist": (datasets.FashionMNIST, 0.2860, 0.3530),
    "kmnist": (datasets.KMNIST, 0.1918, 0.3483),
}

# kind → (magic number, header bytes, bytes per item): big-endian uint32 magic, count, then rows and columns for images
IDX_FORMATS = {"images": (0x803, 16, 28 * 28), "labels": (0x801, 8, 1)}


def split_files(train: bool) -> dict[str, str]:
    """The IDX file of each kind in one split, named as torchvision names them for the whole family."""
    prefix = "train" if train else "t10k"
    return {"images": f"{prefix}-images-idx3-ubyte", "labels": f"{prefix}-labels-idx1-ubyte"}


# All four files: name → kind.
IDX_FILES = {name: kind for train in (True, False) for kind, name in split_files(train).items()}


def damaged(path: Path, problem: str) -> UserError:
    """The error for a damaged file: which one, what is wrong with it, and how to replace it."""
    return UserError(
        f"{path} {problem}. Delete it so it is downloaded again (data.download=true), or put an intact copy there"
    )


def check_idx_file(path: Path, kind: str, classes: int, shown: Path | None = None) -> int:
    """The number of items in the IDX file `path`, after checking its header against its size and, for labels, each
    label against the number of `classes`.

    Damage raises a `UserError` naming `shown` (default `path`): the `.gz` a file was just unpacked from, since that is
    the file the user must replace.
    """
    shown = shown or path
    magic, header_size, item_size = IDX_FORMATS[kind]
    size = path.stat().st_size
    with open(path, "rb") as file:
        header = file.read(header_size)
    if size == 0:
        raise damaged(shown, "is empty")
    if size < header_size:
        raise damaged(shown, f"holds {size} bytes, fewer than the {header_size}-byte header of IDX {kind}")
    found, count, *dims = struct.unpack(f">{header_size // 4}I", header)
    if found != magic:
        raise damaged(shown, f"is not a file of IDX {kind}: it starts with {found:#010x}, not {magic:#010x}")
    if dims and dims != [28, 28]:
        raise damaged(shown, f"holds {dims[0]}×{dims[1]} images, not 28×28")
    expected = header_size + count * item_size
    if size != expected:
        damage = "it is cut short" if size < expected else "it has extra bytes at its end"
        raise damaged(shown, f"holds {size} bytes but its header promises {count} {kind} ({expected} bytes): {damage}")
    if kind == "labels":
        labels = path.read_bytes()[header_size:]
        if labels and max(labels) >= classes:
            index = next(index for index, label in enumerate(labels) if label >= classes)
            raise damaged(
                shown, f"holds the label {labels[index]} at index {index}, but the labels are 0 to {classes - 1}"
            )
    return count


def unpack_idx(packed: Path, target: Path, kind: str, classes: int) -> None:
    """Unpack `packed` into `target` through a file of this process's own, checked before it is renamed into place.

    Ranks that start together so never read a half-written file, a damaged `.gz` never leaves a damaged IDX file
    behind to be blamed later, and the process's file is removed whatever happens.
    """
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        with gzip.open(packed, "rb") as source, open(partial, "wb") as sink:
            shutil.copyfileobj(source, sink)
        check_idx_file(partial, kind, classes, shown=packed)
        os.replace(partial, target)
    except EOFError:
        raise damaged(packed, "is cut short: its gzip stream ends early") from None
    except (gzip.BadGzipFile, zlib.error) as error:
        raise damaged(packed, f"is not a valid gzip file ({error})") from None
    except OSError as error:
        raise UserError(
            f"cannot unpack {packed} into {target.parent} ({error}). Make the file readable and room in that dir"
        ) from None
    finally:
        partial.unlink(missing_ok=True)


class MNISTDataModule(InMemoryDataModule):
    """One of the MNIST family (`name`), with `val_size` training images held out by a seeded split.

    `val_size=0` holds none out: training sees every training image and validation is the test set, as the Slurm
    tutorial does (`experiment=mnist_slurm`); the validation numbers are then the test numbers.

    With `folds` (k-fold cross-validation) the training file's images are the pool instead, whatever `val_size`: fold
    `fold` of them validates, the other folds train; the test file stays the test set.
    """

    def __init__(
        self,
        name: str,
        root: str,
        batch_size: int,
        seed: int,
        val_size: int = 5000,
        download: bool = True,
        drop_last: bool = False,
        folds: int | None = None,
        fold: int = 0,
    ) -> None:
        super().__init__(batch_size=batch_size, seed=seed, drop_last=drop_last, folds=folds, fold=fold)
        if not (isinstance(val_size, int) and not isinstance(val_size, bool) and val_size >= 0):
            raise UserError(
                f"data.val_size must be a whole number of images >= 0 (0: validate on the test set), got {val_size!r}"
            )
        if name not in DATASETS:
            raise UserError(f"data.name={name!r} is not one of {', '.join(DATASETS)}")
        self.dataset_class, self.mean, self.std = DATASETS[name]
        self.class_names = tuple(self.dataset_class.classes)
        self.name = name
        self.root = Path(root)
        self.val_size = val_size
        self.download = download

    @property
    def raw_dir(self) -> Path:
        """Where torchvision looks for the four IDX files."""
        return self.root / self.dataset_class.__name__ / "raw"

    def prepare_data(self) -> None:
        """Make the four IDX files available (called once per node by Lightning, before `setup`).

        `<file>.gz` placed by hand is unpacked next to itself, so copies of the originals work offline like a download.
        A raw dir this process cannot write (a shared, read-only copy of the originals) is left as it is: `setup`
        unpacks into a temporary dir of its own instead, as a user who can read the data would expect to train on it
        without copying it first.
        """
        if os.access(self.raw_dir, os.W_OK):
            for name, kind in IDX_FILES.items():
                packed = self.raw_dir / f"{name}.gz"
                if not (self.raw_dir / name).is_file() and packed.is_file():
                    unpack_idx(packed, self.raw_dir / name, kind, len(self.class_names))
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
        with contextlib.ExitStack() as scratch_dirs:
            full_train = self._load_split(True, scratch_dirs)
            self.test_set = self._load_split(False, scratch_dirs)
        if self.folds is not None:
            train_index, val_index = self.fold_indices(full_train.targets)
            self.train_set, self.val_set = full_train.subset(train_index), full_train.subset(val_index)
            return
        if self.val_size == 0:
            self.train_set, self.val_set = full_train, self.test_set
            return
        if not 0 < self.val_size < len(full_train):
            raise UserError(f"data.val_size must be between 0 and {len(full_train) - 1}, got {self.val_size}")
        order = torch.randperm(len(full_train), generator=torch.Generator().manual_seed(self.seed))
        val_index, train_index = order[: self.val_size], order[self.val_size :]
        self.train_set, self.val_set = full_train.subset(train_index), full_train.subset(val_index)

    def _load_split(self, train: bool, scratch_dirs: contextlib.ExitStack) -> InMemoryDataset:
        names = split_files(train)
        files = {kind: self._idx_file(name, kind, scratch_dirs) for kind, name in names.items()}
        counts = {kind: check_idx_file(path, kind, len(self.class_names)) for kind, path in files.items()}
        if counts["images"] != counts["labels"]:
            raise UserError(
                f"{self.raw_dir}: {names['images']} holds {counts['images']} images but {names['labels']} holds "
                f"{counts['labels']} labels. Delete both (and their .gz) so they are downloaded again "
                "(data.download=true), or put intact copies of the same release there"
            )
        pixels = read_image_file(str(files["images"])).unsqueeze(1).contiguous()  # uint8, normalised when fetched
        return InMemoryDataset(pixels, read_label_file(str(files["labels"])), Normalise(self.mean, self.std))

    def _idx_file(self, name: str, kind: str, scratch_dirs: contextlib.ExitStack) -> Path:
        """`name` in the raw dir, or its `.gz` unpacked into a temporary dir `scratch_dirs` removes once it is read."""
        path = self.raw_dir / name
        if path.is_file():
            return path
        scratch = Path(scratch_dirs.enter_context(tempfile.TemporaryDirectory(prefix=f"{self.name}-")))
        unpack_idx(self.raw_dir / f"{name}.gz", scratch / name, kind, len(self.class_names))
        return scratch / name

    def _missing_files(self) -> list[str]:
        """Files found in the raw dir neither unpacked nor as `.gz`."""
        return [name for name in IDX_FILES if not any((self.raw_dir / f"{name}{end}").is_file() for end in ("", ".gz"))]

    def _missing_message(self, why: str) -> str:
        return (
            f"{self.name}: {len(self._missing_files())} of its 4 files are missing in {self.raw_dir} and {why}. "
            f"Put these files there (each may be .gz): {', '.join(IDX_FILES)}"
        )
