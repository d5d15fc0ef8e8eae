"""`data=image_folder data.folds=K data.fold=i`: the images of train/ and val/ are pooled into K folds, stratified by
class and fixed by the seed; test/ is in none; a fold's training images are augmented, its validation images not."""

from pathlib import Path

import pytest
import torch
from torchvision.transforms import v2

from project.optional.image_folder.datamodule import ImageFolderDataModule
from project.optional.image_folder.example import main as write_example

PER_CLASS = 12  # the example's 4 shapes: 12 training and 3 validation images each, 60 in the pool


@pytest.fixture(scope="module")
def example_images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("images") / "example"
    write_example([str(root), "--per-class", str(PER_CLASS)])
    return root


def fold_of(root: Path, folds: int, fold: int, seed: int = 3) -> ImageFolderDataModule:
    augment = [v2.RandomCrop(28, padding=2), v2.RandomHorizontalFlip()]
    module = ImageFolderDataModule(
        str(root), 8, seed, 28, [0.5], [0.5], channels=1, augment=augment, num_workers=0, folds=folds, fold=fold
    )
    module.setup("fit")
    return module


def images_in(root: Path, *splits: str) -> list[Path]:
    return sorted(path for split in splits for path in (root / split).glob("*/*.png"))


@pytest.mark.parametrize("folds", [3, 5])
def test_folds_partition_train_and_val_stratified_and_leave_test_alone(example_images: Path, folds: int):
    pool = set(images_in(example_images, "train", "val"))
    splits = [fold_of(example_images, folds, fold) for fold in range(folds)]
    validated = [split.val_set.files for split in splits]
    assert sum(map(len, validated)) == len(pool) and set().union(*map(set, validated)) == pool
    for split in splits:
        trained = split.train_set.files
        assert len(trained) + len(split.val_set.files) == len(pool) and set(trained) | set(split.val_set.files) == pool
        assert sorted(split.test_set.files) == images_in(example_images, "test")
        for part in (split.train_set, split.val_set):
            assert [path.parent.name for path in part.files] == [split.class_names[t] for t in part.targets.tolist()]
    counts = torch.stack([split.val_set.targets.bincount(minlength=4) for split in splits])
    assert (counts.max(dim=0).values - counts.min(dim=0).values).max() <= 1, counts


def test_folds_are_fixed_by_the_seed(example_images: Path):
    assert fold_of(example_images, 3, 0).val_set.files == fold_of(example_images, 3, 0).val_set.files
    assert fold_of(example_images, 3, 0).val_set.files != fold_of(example_images, 3, 0, seed=4).val_set.files


def test_a_folds_training_images_are_augmented_and_its_validation_images_only_normalised(example_images: Path):
    """The training sampler's items are (epoch, index), the evaluation loaders' plain indices."""
    split = fold_of(example_images, 3, 1)
    for part in (split.train_set, split.val_set):
        assert torch.equal(part[0][0], split.normalise(part.image(0)))
    plain = split.normalise(split.train_set.image(0))
    augmented = [split.train_set[(epoch, 0)][0] for epoch in range(4)]
    assert any(not torch.equal(image, plain) for image in augmented)
