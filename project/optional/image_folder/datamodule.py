"""Your own images: torchvision's ImageFolder layout, read from disk one sample at a time by DataLoader workers.

    <root>/train/<class>/*.png|jpg|jpeg|bmp    <root>/val/<class>/...    <root>/test/<class>/...

Use it when the images do not fit in memory, or need decoding and augmentation per sample; the MNIST family stays
in memory as tensors (`project.example.data.mnist`), which is faster for small images that fit. Every split must
have the same class folders; a class's label is its folder's place in sorted order, as ImageFolder numbers them.

Images come as they are: any size, any mode (grey, RGB, palette, RGBA, CMYK, 16-bit), PNG, JPEG, BMP, WebP, TIFF
or GIF. Each is converted to `channels` (1: grey, 3: RGB) and fitted to `image_size` × `image_size` as torchvision's
evaluation recipe does (its shorter side resized to `image_size`, then the centre cropped; an image of that size
already is left as it is). Training images are then augmented (`augment`, torchvision transforms.v2, e.g. a random
crop and flip), and every image is scaled to [0, 1] and normalised with `mean` and `std`.

The random numbers of an image's augmentation come from a generator seeded by (`seed`, epoch, sample index), not
from the worker's RNG: an image gets the same crop and flip whichever worker loads it, however many workers and
processes there are, on both paths, and after a mid-epoch resume. (Lightning's `seed_everything(workers=True)` seeds
each worker from the main process's RNG as an epoch's iterator starts, and the Lightning path and the reference loop
reach that point with their RNGs in other states.) The training sampler hands each worker the epoch with the index
(`EpochTaggedShuffleSampler`), since persistent workers keep their own copy of the dataset.

Bad input ends in one line naming the file or folder: a split or class folder that is missing or empty, splits whose
classes differ, an image that does not decode. `${subfolders:<root>/train}` counts the classes, for the network.
"""

import copy
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler
from torchvision.transforms import v2

from project.engine.checkpoints import SeededOrder
from project.engine.errors import UserError
from project.example.data.classification import ClassificationDataModule

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff", ".gif")
# PIL's modes of more than 8 bits per grey pixel, which its own conversion to 8 bits clips instead of scaling.
WIDE_GREY_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I")


def converted(image: Image.Image, mode: str) -> Image.Image:
    """`image` in `mode` ("L" or "RGB"): a palette with transparency through RGBA (PIL asks so), 16-bit grey scaled
    down to 8 bits (PIL would clip it, most of it to white), anything else by PIL's own conversion (CMYK, RGBA)."""
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode in WIDE_GREY_MODES:
        pixels = np.asarray(image, dtype=np.float64)
        peak = 65535.0 if image.mode.startswith("I;16") or pixels.max() > 255 else 255.0
        image = Image.fromarray(np.round(pixels.clip(0, peak) * (255.0 / peak)).astype(np.uint8), mode="L")
    return image if image.mode == mode else image.convert(mode)


def fitted(image: Tensor, size: int) -> Tensor:
    """`image` at `size` × `size`: its shorter side resized to `size` (antialiased), then the centre cropped."""
    if tuple(image.shape[1:]) == (size, size):
        return image
    resized = v2.functional.resize(image, size, antialias=True)
    return v2.functional.center_crop(resized, [size, size])


def normalised(image: Tensor, mean: list[float], std: list[float]) -> Tensor:
    """uint8 pixels scaled to [0, 1], then `(x - mean) / std` per channel: transforms.v2's ToDtype and Normalize,
    called as functions (a `v2.Compose` of the two takes twice as long per image)."""
    return v2.functional.normalize(v2.functional.to_dtype(image, torch.float32, scale=True), mean, std)


class EpochTaggedShuffleSampler(SeededOrder):
    """`SeededOrder` yielding `(epoch, index)`: the dataset seeds an image's augmentation with both."""

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch = self.epoch
        return ((epoch, index) for index in super().__iter__())


def class_folders(split_dir: Path) -> list[Path]:
    """The class folders of one split, sorted; refused in one line if the split is missing or has none."""
    if not split_dir.is_dir():
        raise UserError(
            f"{split_dir}: no such split folder; data.root must hold train/, val/ and test/, each with one folder "
            "per class (python -m project.optional.image_folder.example <root> writes an example)"
        )
    folders = sorted(path for path in split_dir.iterdir() if path.is_dir())
    if not folders:
        raise UserError(f"{split_dir}: no class folders in it; put each class's images in a folder of its own")
    return folders


class ImageFolderSplit(Dataset):
    """One split's images and labels; an item is an index, or `(epoch, index)` for a training sample to augment.

    Each class folder is listed once, here; one without images is refused in one line.
    """

    def __init__(
        self,
        split_dir: Path,
        image_size: int,
        channels: int,
        normalise: Callable[[Tensor], Tensor],
        augment: Callable[[Tensor], Tensor] | None = None,
        seed: int = 0,
    ) -> None:
        folders = class_folders(split_dir)
        self.class_names = tuple(folder.name for folder in folders)
        self.files: list[Path] = []
        labels: list[int] = []
        for label, folder in enumerate(folders):
            images = sorted(path for path in folder.iterdir() if path.suffix.lower() in IMAGE_SUFFIXES)
            if not images:
                raise UserError(
                    f"{folder}: no images ({', '.join(IMAGE_SUFFIXES)}) in this class folder; add some or remove it"
                )
            self.files += images
            labels += [label] * len(images)
        self.targets = torch.tensor(labels)
        self.image_size, self.mode = image_size, "L" if channels == 1 else "RGB"
        self.normalise, self.augment, self.seed = normalise, augment, seed

    def __len__(self) -> int:
        return len(self.files)

    def subset(self, index: Tensor) -> "ImageFolderSplit":
        """The samples at `index`, read and prepared as these are."""
        part = copy.copy(self)
        part.files, part.targets = [self.files[i] for i in index.tolist()], self.targets[index]
        return part

    def joined(self, other: "ImageFolderSplit") -> "ImageFolderSplit":
        """These samples, then `other`'s (a split of the same classes), all read and prepared as these are."""
        both = copy.copy(self)
        both.files, both.targets = self.files + other.files, torch.cat([self.targets, other.targets])
        return both

    def __getitem__(self, item: int | tuple[int, int]) -> tuple[Tensor, Tensor]:
        epoch, index = item if isinstance(item, tuple) else (None, item)
        image = self.image(index)
        if self.augment is not None and epoch is not None:
            image = self.augmented(image, epoch, index)
        return self.normalise(image), self.targets[index]

    def augmented(self, image: Tensor, epoch: int, index: int) -> Tensor:
        """`augment(image)` drawing from the CPU generator seeded by (seed, epoch, index), then put back as it was.

        The transforms draw from the global generator; only the CPU one is seeded and restored (`torch.manual_seed`
        and `fork_rng` also visit every accelerator's, at several times the cost of the augmentation itself).
        """
        generator = torch.default_generator
        state = generator.get_state()
        generator.manual_seed(hash((self.seed, epoch, index)))
        try:
            return self.augment(image)
        finally:
            generator.set_state(state)

    def image(self, index: int) -> Tensor:
        """The image at `index` as uint8 `[channels, size, size]` (what `project.predict` draws), or one line saying
        what is wrong with its file."""
        path = self.files[index]
        try:
            with Image.open(path) as opened:
                image = v2.functional.pil_to_tensor(converted(opened, self.mode))
        except (OSError, ValueError) as error:  # PIL's "cannot identify image file", a truncated file, a bad mode
            raise UserError(f"{path}: not an image PIL can read ({error}); replace or remove it") from None
        return fitted(image, self.image_size)


class ImageFolderDataModule(ClassificationDataModule):
    """`root`'s train/val/test splits of `channels`-channel `image_size`² images, through `num_workers` workers.

    With `folds` (k-fold cross-validation) the images of train/ and val/ are pooled: fold `fold` of them validates,
    the other folds train (augmented); test/ stays the test set.
    """

    train_sampler_class = EpochTaggedShuffleSampler

    def __init__(
        self,
        root: str,
        batch_size: int,
        seed: int,
        image_size: int,
        mean: list[float],
        std: list[float],
        channels: int = 3,
        augment: list[Callable[[Tensor], Tensor]] | None = None,
        num_workers: int = 2,
        drop_last: bool = False,
        timeout: float = 0,
        folds: int | None = None,
        fold: int = 0,
    ) -> None:
        super().__init__(batch_size, seed, drop_last, folds, fold)
        if channels not in (1, 3):
            raise UserError(f"data.channels={channels}: images are read as grey (1) or RGB (3)")
        mean, std = list(mean), list(std)
        if len(mean) not in (1, channels) or len(std) not in (1, channels):
            raise UserError(
                f"data.mean and data.std need one value for every channel, or one per channel ({channels}), got "
                f"{mean} and {std}"
            )
        mean, std = mean * (channels // len(mean)), std * (channels // len(std))
        self.root = Path(root)
        self.image_size, self.channels, self.num_workers = image_size, channels, num_workers
        self.timeout = timeout
        self.normalise = partial(normalised, mean=mean, std=std)
        self.augment = v2.Compose(list(augment)) if augment else None

    def setup(self, stage: str | None = None) -> None:
        if hasattr(self, "train_set"):
            return
        common = {"image_size": self.image_size, "channels": self.channels, "normalise": self.normalise}
        self.train_set = ImageFolderSplit(self.root / "train", augment=self.augment, seed=self.seed, **common)
        self.val_set = ImageFolderSplit(self.root / "val", **common)
        self.test_set = ImageFolderSplit(self.root / "test", **common)
        for split in ("val", "test"):
            classes = getattr(self, f"{split}_set").class_names
            if classes != self.train_set.class_names:
                raise UserError(
                    f"{self.root / split} has the classes {list(classes)}, {self.root / 'train'} has "
                    f"{list(self.train_set.class_names)}: every split needs the same class folders"
                )
        self.class_names = self.train_set.class_names
        if self.folds is not None:
            # Both keep the training split's augmentation, which only a training sample's (epoch, index) item applies.
            pooled = self.train_set.joined(self.val_set)
            train_index, val_index = self.fold_indices(pooled.targets)
            self.train_set, self.val_set = pooled.subset(train_index), pooled.subset(val_index)

    def loader(self, dataset: Dataset, sampler: Sampler | None = None, train: bool = False) -> DataLoader:
        """Workers read and decode the images in parallel; they stay up between epochs (`persistent_workers`). One
        that sends no batch within `timeout` seconds (a hung read) ends the run in one line (`project.engine.job`)."""
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            sampler=sampler,
            drop_last=self.drop_last and train,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            timeout=self.timeout if self.num_workers > 0 else 0,  # torch refuses a timeout without workers
            pin_memory=torch.cuda.is_available(),
        )
