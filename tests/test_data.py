from pathlib import Path

import pytest
import torch
from torch.utils.data.distributed import DistributedSampler
from torchvision import datasets

from project.engine.checkpoints import SeededOrder
from project.engine.errors import UserError
from project.example.data import MNISTDataModule, ToyDataModule
from tests.helpers import check_ok, run_module
from tests.idx_files import write_idx_dataset


def test_toy_data_is_the_tutorial_points():
    datamodule = ToyDataModule(batch_size=2, seed=123, drop_last=True)
    datamodule.setup("fit")
    assert datamodule.train_set.inputs.shape == (5, 2)
    assert datamodule.train_set.targets.tolist() == [0, 0, 0, 1, 1]
    assert datamodule.test_set.targets.tolist() == [0, 1]
    batches = list(datamodule.train_dataloader())
    assert [len(labels) for _, labels in batches] == [2, 2], "5 points, batch 2, drop_last → two batches"


def test_mnist_module_holds_uint8_pixels_and_serves_normalised_batches_bitwise_as_before(mnist_root: Path):
    """A quarter of float32's memory; each fetched value is the one a whole split normalised at load time gave."""
    datamodule = MNISTDataModule("mnist", str(mnist_root), batch_size=32, seed=0, val_size=50, download=False)
    datamodule.setup("fit")
    assert len(datamodule.train_set) == 350 and len(datamodule.val_set) == 50 and len(datamodule.test_set) == 100
    assert datamodule.train_set.inputs.shape == (350, 1, 28, 28)
    assert datamodule.train_set.inputs.dtype == torch.uint8
    assert datamodule.train_set.targets.dtype == torch.int64

    parsed = datasets.MNIST(str(mnist_root), train=False, download=False)  # torchvision's own parser
    normalised_at_load = parsed.data.unsqueeze(1).float().div_(255).sub_(0.1307).div_(0.3081)
    inputs, labels = datamodule.test_set[:]
    assert inputs.dtype == torch.float32 and torch.equal(inputs, normalised_at_load), "bitwise"
    assert torch.equal(labels, parsed.targets)
    batch, _ = datamodule.test_set.__getitems__([3, 1, 4])
    assert torch.equal(batch, normalised_at_load[[3, 1, 4]])
    first_batch, _ = next(iter(datamodule.test_dataloader()))
    assert torch.equal(first_batch, normalised_at_load[:32])


def test_train_val_split_is_seeded_and_disjoint(mnist_root: Path):
    def split(seed: int) -> MNISTDataModule:
        datamodule = MNISTDataModule("mnist", str(mnist_root), 32, seed=seed, val_size=50, download=False)
        datamodule.setup("fit")
        return datamodule

    first, again, other = split(0), split(0), split(1)
    assert torch.equal(first.val_set.inputs, again.val_set.inputs)
    assert not torch.equal(first.val_set.inputs, other.val_set.inputs)
    rows = {tuple(x.flatten()[:200].tolist()) for x in first.train_set.inputs}
    assert not any(tuple(x.flatten()[:200].tolist()) in rows for x in first.val_set.inputs)


def test_val_size_zero_trains_on_every_training_image_and_validates_on_the_test_set(mnist_root: Path):
    """The Slurm tutorial's split (experiment=mnist_slurm): nothing held out."""
    datamodule = MNISTDataModule("mnist", str(mnist_root), batch_size=32, seed=0, val_size=0, download=False)
    datamodule.setup("fit")
    parsed = datasets.MNIST(str(mnist_root), train=True, download=False)
    assert len(datamodule.train_set) == len(parsed) == 400
    assert torch.equal(datamodule.train_set.targets, parsed.targets)
    assert datamodule.val_set is datamodule.test_set


def test_batches_are_full_tensors(mnist_root: Path):
    datamodule = MNISTDataModule("mnist", str(mnist_root), batch_size=64, seed=0, val_size=50, download=False)
    datamodule.setup("fit")
    inputs, labels = next(iter(datamodule.train_dataloader()))
    assert inputs.shape == (64, 1, 28, 28) and labels.shape == (64,)
    sizes = [len(labels) for _, labels in datamodule.train_dataloader()]
    assert sum(sizes) == 350 and sizes[-1] == 350 % 64


@pytest.mark.parametrize(("name", "folder"), [("fashion_mnist", "FashionMNIST"), ("kmnist", "KMNIST")])
def test_other_mnist_family_datasets_use_their_own_folders(tmp_path: Path, name: str, folder: str):
    write_idx_dataset(tmp_path, folder, train_count=120, test_count=30)
    datamodule = MNISTDataModule(name, str(tmp_path), batch_size=16, seed=0, val_size=20, download=False)
    datamodule.setup("fit")
    assert len(datamodule.train_set) == 100 and len(datamodule.test_set) == 30


def test_epoch_order_depends_on_seed_and_epoch_only():
    dataset = list(range(10))
    sampler = SeededOrder(dataset, seed=7)
    first = list(sampler)
    assert list(sampler) == first, "iterating again must not change the order"
    sampler.set_epoch(1)
    assert list(sampler) != first
    distributed = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=7)
    distributed.set_epoch(1)
    assert list(distributed) == list(sampler), "one process sees the global order of DistributedSampler"


@pytest.mark.parametrize(("replicas", "rank"), [(1, 0), (2, 1)])
def test_a_resumed_epoch_starts_after_the_samples_done_and_later_epochs_are_whole(replicas: int, rank: int):
    dataset = list(range(11))
    whole = SeededOrder(dataset, seed=7, num_replicas=replicas, rank=rank)
    whole.set_epoch(3)
    epoch_three = list(whole)
    resumed = SeededOrder(dataset, seed=7, num_replicas=replicas, rank=rank)
    resumed.start_part_way(3, samples_done=4)
    resumed.set_epoch(3)  # Lightning and the reference loop set the epoch again as it starts
    assert list(resumed) == epoch_three[4:]
    assert len(resumed) == len(epoch_three), "the length stays the whole share's"
    resumed.set_epoch(4)
    whole.set_epoch(4)
    assert list(resumed) == list(whole)


def test_missing_files_offline_names_directory_and_files(tmp_path: Path):
    datamodule = MNISTDataModule("mnist", str(tmp_path), batch_size=8, seed=0, download=False)
    with pytest.raises(UserError) as error:
        datamodule.prepare_data()
    message = str(error.value)
    assert str(tmp_path / "MNIST" / "raw") in message
    for file_name in (
        "train-images-idx3-ubyte",
        "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte",
    ):
        assert file_name in message


@pytest.mark.parametrize("value", [0, -3])
def test_batch_size_must_be_positive(value: int):
    with pytest.raises(UserError, match="data.batch_size must be a positive integer"):
        ToyDataModule(batch_size=value, seed=0)


def test_unknown_dataset_name_is_refused():
    with pytest.raises(UserError, match="data.name='cifar' is not one of mnist, fashion_mnist, kmnist"):
        MNISTDataModule("cifar", "data", batch_size=8, seed=0)


@pytest.mark.slow
def test_missing_files_offline_cli_prints_one_line_and_exits_nonzero(tmp_path: Path):
    result = run_module(
        "project.train",
        "experiment=mnist",
        f"data.root={tmp_path / 'empty'}",
        "data.download=false",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and "t10k-labels-idx1-ubyte" in error_lines[0]


@pytest.mark.slow
def test_training_reads_the_idx_files_end_to_end(tmp_path: Path, mnist_root: Path):
    result = check_ok(
        run_module(
            "project.train",
            "experiment=mnist",
            f"data.root={mnist_root}",
            "data.download=false",
            "data.val_size=50",
            "trainer.max_epochs=3",
            "logger=none",
            f"hydra.run.dir={tmp_path / 'run'}",
            cwd=tmp_path,
        )
    )
    assert "Results" in result.stdout
