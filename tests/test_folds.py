"""K-fold cross-validation (`data.folds=K data.fold=i`): the folds partition the pooled training and validation
samples, stratified by class and fixed by the data's seed, the test set in none; a choice that cannot be is refused
in one line. (The image folder's folds: tests/optional/image_folder/test_image_folder_folds.py.)"""

from pathlib import Path

import pytest
import torch
from torchvision import datasets

from project.engine.errors import UserError
from project.example.data import MNISTDataModule, ToyDataModule
from project.example.data.folds import fold_split
from project.example.data.in_memory import InMemoryDataset
from project.example.data.toy import TEST_TARGETS, TRAIN_INPUTS
from tests.faults import ENV, USER_ERROR, assert_ends_in_error_line
from tests.helpers import run_module


def mnist_fold(root: Path, folds: int, fold: int, seed: int = 0) -> MNISTDataModule:
    datamodule = MNISTDataModule("mnist", str(root), 32, seed, val_size=50, download=False, folds=folds, fold=fold)
    datamodule.setup("fit")
    return datamodule


def positions(dataset: InMemoryDataset, pooled: torch.Tensor) -> list[int]:
    """Where each of `dataset`'s samples is in `pooled` (one sample per row; the test files' images are unique)."""
    index = {row.numpy().tobytes(): position for position, row in enumerate(pooled)}
    assert len(index) == len(pooled)
    return [index[row.numpy().tobytes()] for row in dataset.inputs.reshape(len(dataset), *pooled.shape[1:])]


def assert_folds_partition(val_positions: list[list[int]], train_positions: list[list[int]], pooled: int) -> None:
    """The validation sets are disjoint and cover the pool; each fold trains on all the others."""
    everything = set(range(pooled))
    assert sum(map(len, val_positions)) == pooled and set().union(*map(set, val_positions)) == everything
    for validated, trained in zip(val_positions, train_positions, strict=True):
        assert len(trained) + len(validated) == pooled and set(trained) | set(validated) == everything


def assert_stratified(val_targets: list[torch.Tensor], classes: int) -> None:
    """Each class's count differs by at most one between two folds."""
    counts = torch.stack([targets.bincount(minlength=classes) for targets in val_targets])
    assert (counts.max(dim=0).values - counts.min(dim=0).values).max() <= 1, counts


@pytest.mark.parametrize("folds", [3, 5])
def test_mnist_folds_partition_the_training_file_stratified_and_leave_the_test_file_alone(mnist_root: Path, folds: int):
    splits = [mnist_fold(mnist_root, folds, fold) for fold in range(folds)]  # (which unpacks the .gz files)
    train_file = datasets.MNIST(str(mnist_root), train=True, download=False)
    test_file = datasets.MNIST(str(mnist_root), train=False, download=False)
    val_positions = [positions(split.val_set, train_file.data) for split in splits]
    train_positions = [positions(split.train_set, train_file.data) for split in splits]
    assert_folds_partition(val_positions, train_positions, len(train_file))
    assert_stratified([split.val_set.targets for split in splits], classes=10)
    for split, validated in zip(splits, val_positions, strict=True):
        assert torch.equal(split.val_set.targets, train_file.targets[validated]), "labels stay with their images"
        assert torch.equal(split.test_set.inputs[:, 0], test_file.data)
        assert torch.equal(split.test_set.targets, test_file.targets)


def test_mnist_folds_are_fixed_by_the_datas_seed(mnist_root: Path):
    def validated(seed: int) -> torch.Tensor:
        return mnist_fold(mnist_root, 3, 1, seed).val_set.inputs

    assert torch.equal(validated(0), validated(0))
    assert not torch.equal(validated(0), validated(1))


def test_the_toy_pools_its_five_training_points_and_keeps_its_two_test_points():
    splits = []
    for fold in (0, 1):
        datamodule = ToyDataModule(batch_size=2, seed=123, drop_last=True, folds=2, fold=fold)
        datamodule.setup("fit")
        splits.append(datamodule)
    val_positions = [positions(split.val_set, TRAIN_INPUTS) for split in splits]
    train_positions = [positions(split.train_set, TRAIN_INPUTS) for split in splits]
    assert_folds_partition(val_positions, train_positions, len(TRAIN_INPUTS))
    assert_stratified([split.val_set.targets for split in splits], classes=2)
    assert all(torch.equal(split.test_set.targets, TEST_TARGETS) for split in splits)


def test_a_mid_epoch_checkpoint_of_one_fold_resumes_in_that_fold_only(mnist_root: Path):
    """The training position a checkpoint saves fixes the fold's training set: the same fold resumes, another is
    refused (`TrainingPosition.check_resumable_as`)."""
    saved = mnist_fold(mnist_root, 3, 0).position(epoch=1, batches_done=2, processes=1)
    saved.check_resumable_as(mnist_fold(mnist_root, 3, 0).position(1, 2, 1))
    with pytest.raises(UserError, match="training labels' checksum"):
        saved.check_resumable_as(mnist_fold(mnist_root, 3, 1).position(1, 2, 1))


@pytest.mark.parametrize(
    ("folds", "fold", "message"),
    [
        (1, 0, "data.folds=1: k-fold cross-validation needs a whole number of folds >= 2"),
        ("5", 0, "data.folds='5': k-fold cross-validation needs a whole number of folds >= 2"),
        (3, 3, "data.fold=3 is not one of the 3 folds: give 0 <= data.fold < 3"),
        (3, -1, "data.fold=-1 is not one of the 3 folds"),
        (None, 1, "data.fold=1 picks a fold, but data.folds is null"),
    ],
)
def test_a_fold_choice_that_cannot_be_is_refused_as_the_data_is_built(folds, fold, message: str):
    with pytest.raises(UserError, match=message):
        ToyDataModule(batch_size=2, seed=0, folds=folds, fold=fold)


def test_more_folds_than_a_class_has_samples_is_refused_naming_the_class():
    datamodule = ToyDataModule(batch_size=2, seed=0, folds=3, fold=0)
    with pytest.raises(UserError, match="^data.folds=3 needs at least 3 samples of each class.*class '1' has 2"):
        datamodule.setup("fit")


def test_a_label_outside_the_classes_is_refused_before_any_fold_is_dealt():
    """A data module of the user's own whose labels do not number its classes from 0: one line, not a fold left
    unset or an IndexError."""
    with pytest.raises(UserError, match=r"^data.folds: a label 5 is not one of the 2 classes \(0, 1\)"):
        fold_split(torch.tensor([0, 1, 0, 1, 5, 0]), folds=2, fold=0, seed=0, class_names=("0", "1"))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("overrides", "names"),
    [(("data.folds=3",), ("data.folds=3", "class '1' has 2")), (("data.folds=2", "data.fold=2"), ("data.fold=2",))],
    ids=["more-folds-than-samples", "fold-out-of-range"],
)
def test_bad_folds_end_in_one_error_line_and_exit_2(tmp_path: Path, overrides: tuple[str, ...], names: tuple[str]):
    result = run_module(
        "project.train", *overrides, "logger=none", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, env=ENV
    )
    assert_ends_in_error_line(result.returncode, result.stdout, result.stderr, USER_ERROR, *names)
    assert not (tmp_path / "run" / "results.json").exists()
