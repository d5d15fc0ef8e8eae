"""`python -m project.predict`: every sample once and in order, the accuracy `evaluate` reports, pictures that open,
and a data module of your own that names no classes and has no images."""

import csv
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import lightning as L
import matplotlib.image
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torch.utils.data import DataLoader, TensorDataset
from torchvision import datasets

from project.engine.errors import UserError, error_line
from project.engine.trained_run import blamed_on_data_given, predict_step_needed, rebuild_trained
from project.engine.upstream import VERSION_BASE
from project.example.predictions import Predictions, class_names
from project.predict import gathered_shares, predict, write_predictions
from tests.foreign_modules import PairForwardModule, RegressionModule
from tests.helpers import (
    CONF_DIR,
    check_ok,
    mnist_overrides,
    one_rank_process_group,
    part_present,
    run_module,
    untrained_toy_checkpoint,
)

ENV = {"OMP_NUM_THREADS": "1"}
TEST_IMAGES = 100


@pytest.fixture(scope="module")
def barely_trained(tmp_path_factory: pytest.TempPathFactory, mnist_root: Path) -> Path:
    """A checkpoint of one epoch at a tiny learning rate: it gets most test images wrong, so mistakes to draw."""
    cwd = tmp_path_factory.mktemp("barely-trained")
    args = mnist_overrides(
        mnist_root, "trainer.max_epochs=1", "model.optimizer.lr=1e-5", f"hydra.run.dir={cwd / 'run'}"
    )
    check_ok(run_module("project.train", *args, cwd=cwd, env=ENV))
    return cwd / "run" / "checkpoints" / "last.ckpt"


def run_predict(cwd: Path, *args: str) -> tuple[Path, str]:
    """Run project.predict in `cwd`; (its run dir, its stdout)."""
    result = check_ok(run_module("project.predict", *args, cwd=cwd, env=ENV))
    (run_dir,) = re.findall(r"^run dir: (\S+)", result.stdout, flags=re.MULTILINE)
    return Path(run_dir), result.stdout


def read_rows(path: Path) -> list[dict]:
    with path.open() as file:
        return list(csv.DictReader(file))


@pytest.mark.slow
def test_predictions_cover_the_test_split_in_order_with_evaluates_accuracy(
    tmp_path: Path, barely_trained: Path, mnist_root: Path
):
    run_dir, stdout = run_predict(tmp_path, f"ckpt_path={barely_trained}")
    rows = read_rows(run_dir / "predictions.csv")
    labels = datasets.MNIST(str(mnist_root), train=False, download=False).targets.tolist()
    assert [int(row["index"]) for row in rows] == list(range(TEST_IMAGES)), "every sample once, in order"
    assert [int(row["label"]) for row in rows] == labels
    assert all(0 < float(row["confidence"]) <= 1 for row in rows)
    accuracy = sum(row["label"] == row["predicted"] for row in rows) / len(rows)

    evaluated = check_ok(run_module("project.evaluate", f"ckpt_path={barely_trained}", cwd=tmp_path, env=ENV))
    (test_accuracy,) = re.findall(r"^test/acc\s+(\S+)$", evaluated.stdout, flags=re.MULTILINE)
    assert accuracy == pytest.approx(float(test_accuracy), abs=5e-5)
    assert accuracy < 0.5, "the barely trained network makes mistakes to draw"

    per_class = read_rows(run_dir / "per_class.csv")
    assert [row["class"] for row in per_class] == list(datasets.MNIST.classes)
    assert sum(int(row["samples"]) for row in per_class) == TEST_IMAGES
    total = re.search(rf"^all +{TEST_IMAGES} +(\d+) +([\d.]+)$", stdout, flags=re.MULTILINE)
    assert total and float(total[2]) == pytest.approx(accuracy, abs=1e-4), "the table is printed, with its total"
    for picture in ("confusion_matrix.png", "most_confident_mistakes.png"):
        image = matplotlib.image.imread(run_dir / picture)
        assert image.ndim == 3 and min(image.shape[:2]) > 100, picture


@pytest.mark.slow
def test_two_processes_predict_the_same_rows_as_one_under_ddp_and_fsdp(tmp_path: Path, barely_trained: Path):
    """Each rank predicts its share (under FSDP with the network sharded over both); rank 0 alone writes them back
    in order."""
    single, _ = run_predict(tmp_path, f"ckpt_path={barely_trained}")
    for strategy in ("ddp", "fsdp") if part_present("fsdp") else ("ddp",):
        two, _ = run_predict(tmp_path, f"ckpt_path={barely_trained}", f"trainer={strategy}", "trainer.devices=2")
        assert (two / "predictions.csv").read_text() == (single / "predictions.csv").read_text(), strategy
        assert sorted(path.name for path in two.glob("*.log")) == ["predict.log", "predict.rank1.log"]


@pytest.mark.slow
def test_two_ddp_processes_put_uneven_shares_back_in_order(tmp_path: Path, barely_trained: Path):
    """49 validation images (the run held out 50): rank 0 predicts 25 (0, 2, ..., 48), rank 1 the other 24."""
    split = ("split=val", "+data.val_size=49", "data.batch_size=8")
    single, _ = run_predict(tmp_path, f"ckpt_path={barely_trained}", *split)
    ddp, _ = run_predict(tmp_path, f"ckpt_path={barely_trained}", *split, "trainer=ddp", "trainer.devices=2")
    assert [int(row["index"]) for row in read_rows(ddp / "predictions.csv")] == list(range(49))
    assert (ddp / "predictions.csv").read_text() == (single / "predictions.csv").read_text()
    assert (ddp / "predict.rank1.log").is_file(), "two processes predicted"


@pytest.mark.slow
def test_another_split_from_data_moved_elsewhere(tmp_path: Path, barely_trained: Path, mnist_root: Path):
    """The validation split as the run drew it (data.val_size=50), from a copy of the files at another root."""
    moved = tmp_path / "moved"
    shutil.copytree(mnist_root, moved)
    run_dir, _ = run_predict(tmp_path, f"ckpt_path={barely_trained}", "split=val", f"data.root={moved}")
    assert len(read_rows(run_dir / "predictions.csv")) == 50


def assert_one_error_line(result, expected: str) -> None:
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.rstrip().splitlines()[-1].startswith(f"error: {expected}"), result.stderr[-2000:]


@pytest.mark.slow
def test_a_split_that_does_not_exist_ends_in_one_line(tmp_path: Path, barely_trained: Path):
    result = run_module("project.predict", f"ckpt_path={barely_trained}", "split=banana", cwd=tmp_path, env=ENV)
    assert_one_error_line(result, "split must be one of test | val | train, got 'banana'")


@pytest.mark.slow
def test_spawned_workers_which_return_no_predictions_are_refused_in_one_line(tmp_path: Path, barely_trained: Path):
    result = run_module("project.predict", f"ckpt_path={barely_trained}", "trainer=ddp_spawn", cwd=tmp_path, env=ENV)
    assert_one_error_line(result, "project.predict takes the predictions back from its processes")


@pytest.mark.slow
def test_a_data_key_the_checkpoints_data_lacks_ends_in_one_line(tmp_path: Path):
    """The toy data has no files, so no root to move."""
    check_ok(run_module("project.train", "logger=none", f"hydra.run.dir={tmp_path / 'toy'}", cwd=tmp_path, env=ENV))
    toy = tmp_path / "toy" / "checkpoints" / "last.ckpt"
    result = run_module("project.predict", f"ckpt_path={toy}", "data.root=/data", cwd=tmp_path, env=ENV)
    assert_one_error_line(
        result, "data.root: the checkpoint's data (project.example.data.ToyDataModule) has no such key"
    )


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_ranks_shares_arrive_on_the_cpu_whatever_device_predicted(tmp_path: Path, device: str):
    """`all_gather_object` unpickles a GPU tensor onto the sender's GPU, which the receiving rank may not see."""
    probabilities = torch.tensor([[0.9, 0.1], [0.2, 0.8]], device=device)
    labels = torch.tensor([0, 1], device=device)
    with one_rank_process_group(tmp_path):
        (received,) = gathered_shares({"0": probabilities, "1": labels})
    assert received["0"].device.type == received["1"].device.type == "cpu"
    assert torch.equal(received["0"], probabilities.cpu()) and torch.equal(received["1"], labels.cpu())


class PlainDataModule(L.LightningDataModule):
    """A data module of a user's own: no `class_names`, and its test set (torch's TensorDataset) has no `image`."""

    def __init__(self, samples: int) -> None:
        super().__init__()
        inputs = torch.randn(samples, 2, generator=torch.Generator().manual_seed(0))
        self.test_set = TensorDataset(inputs, torch.arange(samples) % 2)

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(self.test_set, batch_size=4)


def test_a_data_module_of_your_own_gets_its_labels_as_class_names_and_no_mistakes_drawn(tmp_path: Path):
    """A checkpoint whose stored config names `PlainDataModule` and the toy network, predicted as `main` does (the
    user trusts their own module's package)."""
    torch.manual_seed(0)
    model = OmegaConf.load(CONF_DIR / "model" / "toy.yaml")
    data = {"_target_": f"{PlainDataModule.__module__}.PlainDataModule", "samples": 9}
    config = {"data": data, "model": OmegaConf.to_container(model)}
    torch.save({"config": config, "state_dict": instantiate(model).state_dict()}, tmp_path / "user.ckpt")
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        trusted = f"+trusted_targets.mine={PlainDataModule.__module__}.*"
        overrides = [f"ckpt_path={tmp_path / 'user.ckpt'}", "trainer=cpu", f"run_dir={tmp_path}", trusted]
        cfg = compose("predict", overrides=overrides)
        outputs, module, datamodule = predict(cfg)
    written = write_predictions(outputs, module, datamodule, tmp_path)
    probabilities, labels = outputs["0"], outputs["1"]
    predictions = Predictions(labels, probabilities, class_names(datamodule, probabilities.shape[1]))
    assert predictions.labels.tolist() == [0, 1, 0, 1, 0, 1, 0, 1, 0]
    assert predictions.class_names == ("0", "1")
    assert [row["class"] for row in read_rows(tmp_path / "per_class.csv")] == ["0", "1"]
    assert predictions.accuracy < 1, "there are mistakes, which image data would have drawn"
    assert written == ["predictions.pt", "predictions.csv", "per_class.csv", "confusion_matrix.png"]


POINTS = (torch.zeros(4, 1), torch.ones(4, 1))  # a batch of (inputs, targets)


def called_below(frames: int, call: Callable[[], object]) -> object:
    """`call()` made `frames` calls deeper: where a traceback meets Lightning's predict_step depends on how deep the
    run that caught it was."""
    return call() if frames == 0 else called_below(frames - 1, call)


DEPTHS = pytest.mark.parametrize("frames", [0, 3, 5, 20])


@DEPTHS
def test_a_forward_that_does_not_take_the_batch_asks_for_a_predict_step_in_one_line(frames: int):
    """Lightning's default predict_step calls forward(batch); a forward of (inputs, targets) cannot take it."""
    module = PairForwardModule()
    with pytest.raises(UserError) as refused, predict_step_needed(module):
        called_below(frames, lambda: module.predict_step(POINTS, 0))
    assert str(refused.value).startswith("PairForwardModule defines no predict_step, and Lightning's default one")
    assert "missing 1 required positional argument: 'targets'" in str(refused.value)
    assert str(refused.value).endswith(
        "define predict_step(self, batch, batch_idx) in the module, returning its predictions"
    )


class ForwardFailingInside(PairForwardModule):
    """A forward that takes the batch, and fails in its own code."""

    def forward(self, batch: tuple) -> torch.Tensor:
        return self.layers(batch)  # a tuple, not a tensor: torch's TypeError, from inside forward


class ForwardFailingInItsOwnLine(PairForwardModule):
    """A forward that takes the batch, and fails in a line of its own (no torch frame below it)."""

    def forward(self, batch: tuple) -> torch.Tensor:
        return batch + "a tuple plus text"


@DEPTHS
@pytest.mark.parametrize(
    ("module", "batch"),
    [(ForwardFailingInside(), POINTS), (ForwardFailingInItsOwnLine(), POINTS), (RegressionModule(), None)],
    ids=["inside-its-forward", "in-its-forwards-own-line", "its-own-predict-step"],
)
def test_a_type_error_of_the_modules_own_code_keeps_its_traceback(module, batch, frames: int):
    """Only the default predict_step's call of forward is reworded: not a TypeError inside forward, nor one of a
    predict_step of the module's own."""
    with pytest.raises(TypeError), predict_step_needed(module):
        called_below(frames, lambda: module.predict_step(batch, 0))


def test_a_type_error_before_any_predict_step_keeps_its_traceback():
    """E.g. the data's own: a batch its loader cannot collate, met before Lightning's predict_step runs."""
    loader = DataLoader([object()], batch_size=1)
    with (
        pytest.raises(TypeError, match="default_collate: batch must contain tensors"),
        predict_step_needed(PairForwardModule()),
    ):
        next(iter(loader))


def refused_rebuild(directory: Path, data: str, given: str) -> tuple[Path, BaseException]:
    """The toy checkpoint trained with `data`, and what rebuilding it for predict with the override `given` raises."""
    checkpoint = untrained_toy_checkpoint(directory, "model=toy", data)
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        cfg = compose("predict", overrides=[f"ckpt_path={checkpoint}", given, f"run_dir={directory}"])
        with pytest.raises(Exception) as refused:
            rebuild_trained(cfg, "project.predict")
    return checkpoint, refused.value


def test_a_data_key_given_for_a_run_that_had_no_data_module_is_one_line(tmp_path: Path):
    checkpoint, refused = refused_rebuild(tmp_path, "data=none", "data.batch_size=4")
    assert isinstance(refused, UserError)
    assert str(refused) == (
        f"data.batch_size: the run of ckpt_path={checkpoint} had no data module (data=none), its module serving its "
        "own batches: leave out data.<key>="
    )


def test_a_data_value_its_data_module_refuses_is_that_modules_own_line(tmp_path: Path):
    """Not "its stored config no longer builds with this version": the value given is wrong, not the checkpoint."""
    _, refused = refused_rebuild(tmp_path, "data=toy", "data.batch_size=0")
    assert error_line(refused) == "error: data.batch_size must be a positive integer, got 0"


def test_a_network_failing_on_the_data_is_blamed_on_the_data_keys_given_and_only_on_them():
    """A failure with no data.<key>= given, or one that is the user's for another reason (memory), keeps its own
    report."""
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        given = compose("predict", overrides=["ckpt_path=unused", "data.root=/elsewhere"])
        none_given = compose("predict", overrides=["ckpt_path=unused"])
    shapes = RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x784 and 2x8)")
    with pytest.raises(UserError) as blamed, blamed_on_data_given(given):
        raise shapes
    assert str(blamed.value).startswith(
        "the checkpoint's network does not take the samples of the data as given (data.root=/elsewhere): mat1 and mat2"
    )
    memory = RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    for cfg, error in ((none_given, shapes), (given, memory)):
        with pytest.raises(RuntimeError) as kept, blamed_on_data_given(cfg):
            raise error
        assert kept.value is error
