"""`python -m project.predict`: every sample once and in order, the accuracy `evaluate` reports, pictures that open."""

import csv
import re
import shutil
from pathlib import Path

import matplotlib.image
import pytest
from torchvision import datasets

from tests.helpers import check_ok, mnist_overrides, run_module

pytestmark = pytest.mark.slow
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


def predict(cwd: Path, *args: str) -> tuple[Path, str]:
    """Run project.predict in `cwd`; (its run dir, its stdout)."""
    result = check_ok(run_module("project.predict", *args, cwd=cwd, env=ENV))
    (run_dir,) = re.findall(r"^run dir: (\S+)", result.stdout, flags=re.MULTILINE)
    return Path(run_dir), result.stdout


def read_rows(path: Path) -> list[dict]:
    with path.open() as file:
        return list(csv.DictReader(file))


def test_predictions_cover_the_test_split_in_order_with_evaluates_accuracy(
    tmp_path: Path, barely_trained: Path, mnist_root: Path
):
    run_dir, stdout = predict(tmp_path, f"ckpt_path={barely_trained}")
    rows = read_rows(run_dir / "predictions.csv")
    labels = datasets.MNIST(str(mnist_root), train=False, download=False).targets.tolist()
    assert [int(row["index"]) for row in rows] == list(range(TEST_IMAGES)), "every sample once, in order"
    assert [int(row["label"]) for row in rows] == labels
    assert all(0 < float(row["confidence"]) <= 1 for row in rows)
    accuracy = sum(row["label"] == row["predicted"] for row in rows) / len(rows)

    evaluated = check_ok(run_module("project.evaluate", f"ckpt_path={barely_trained}", cwd=tmp_path, env=ENV))
    (test_accuracy,) = re.findall(r"^test/acc\s+(\S+)$", evaluated.stdout, flags=re.MULTILINE)
    assert accuracy == pytest.approx(float(test_accuracy), abs=1e-6)
    assert accuracy < 0.5, "the barely trained network makes mistakes to draw"

    per_class = read_rows(run_dir / "per_class.csv")
    assert [row["class"] for row in per_class] == list(datasets.MNIST.classes)
    assert sum(int(row["samples"]) for row in per_class) == TEST_IMAGES
    total = re.search(rf"^all +{TEST_IMAGES} +(\d+) +([\d.]+)$", stdout, flags=re.MULTILINE)
    assert total and float(total[2]) == pytest.approx(accuracy, abs=1e-4), "the table is printed, with its total"
    for picture in ("confusion_matrix.png", "most_confident_mistakes.png"):
        image = matplotlib.image.imread(run_dir / picture)
        assert image.ndim == 3 and min(image.shape[:2]) > 100, picture


def test_two_ddp_processes_predict_the_same_rows_as_one(tmp_path: Path, barely_trained: Path):
    """Each rank predicts its share; rank 0 alone writes them back in order."""
    single, _ = predict(tmp_path, f"ckpt_path={barely_trained}")
    ddp, _ = predict(tmp_path, f"ckpt_path={barely_trained}", "trainer=ddp", "trainer.devices=2")
    assert (ddp / "predictions.csv").read_text() == (single / "predictions.csv").read_text()
    assert sorted(path.name for path in ddp.glob("*.log")) == ["predict.log", "predict.rank1.log"]


def test_another_split_from_data_moved_elsewhere(tmp_path: Path, barely_trained: Path, mnist_root: Path):
    """The validation split as the run drew it (data.val_size=50), from a copy of the files at another root."""
    moved = tmp_path / "moved"
    shutil.copytree(mnist_root, moved)
    run_dir, _ = predict(tmp_path, f"ckpt_path={barely_trained}", "split=val", f"data.root={moved}")
    assert len(read_rows(run_dir / "predictions.csv")) == 50


def assert_one_error_line(result, expected: str) -> None:
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.rstrip().splitlines()[-1].startswith(f"error: {expected}"), result.stderr[-2000:]


def test_a_split_that_does_not_exist_ends_in_one_line(tmp_path: Path, barely_trained: Path):
    result = run_module("project.predict", f"ckpt_path={barely_trained}", "split=banana", cwd=tmp_path, env=ENV)
    assert_one_error_line(result, "split must be one of test | val | train, got 'banana'")


def test_spawned_workers_which_return_no_predictions_are_refused_in_one_line(tmp_path: Path, barely_trained: Path):
    result = run_module("project.predict", f"ckpt_path={barely_trained}", "trainer=ddp_spawn", cwd=tmp_path, env=ENV)
    assert_one_error_line(result, "project.predict takes the predictions back from its processes")


def test_a_data_key_the_checkpoints_data_lacks_ends_in_one_line(tmp_path: Path):
    """The toy data has no files, so no root to move."""
    check_ok(run_module("project.train", "logger=none", f"hydra.run.dir={tmp_path / 'toy'}", cwd=tmp_path, env=ENV))
    toy = tmp_path / "toy" / "checkpoints" / "last.ckpt"
    result = run_module("project.predict", f"ckpt_path={toy}", "data.root=/data", cwd=tmp_path, env=ENV)
    assert_one_error_line(result, "data.root: the checkpoint's data (project.data.ToyDataModule) has no such key")
