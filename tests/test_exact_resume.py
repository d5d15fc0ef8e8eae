"""Exactly right with a user's own code (tests/csv_project.py): PNGs from a labels.csv in a data module written the
plain way (`shuffle=True`, no `state_dict`), a classifier that starts from a pretrained backbone's file, and Lightning's
own weight-averaging callback (`WeightAveraging`, whose state the checkpoints keep). A run stopped by
`trainer.max_steps`, `trainer.max_time`, an epoch's end or a SIGTERM resumes to the per-step losses and final weights
of a run never stopped, alone and under DDP; a checkpoint resumed with other data is refused in one line; and under
DDP the validation and test numbers count each sample once, as `project.evaluate` on one process does.

Before the engine kept the training order (`TrainingOrder`), a `max_steps` checkpoint resumed with the next epoch's
first batch and stopped an epoch early, and `shuffle=True` drew each resumed epoch's order from another random state;
before it evaluated without repeats (`ddp.evaluated_once`), 15 test images on two processes counted 16.
"""

import math
from pathlib import Path

import pytest
import torch

from project.engine.checkpoints import classes_unlike
from tests.csv_project import write_backbone, write_png_dataset
from tests.foreign_modules import FOREIGN_CONF
from tests.helpers import (
    MID_EPOCH_ON,
    REPO,
    STOPPED_BY_SIGTERM,
    check_ok,
    error_lines,
    fresh_interpreters,
    histories,
    read_json,
    requires,
    run_module,
    signal_at,
)

# 60 images: 30 train (4 batches of 8 a process alone, 2 under DDP), 15 validate, 15 test (8 + 7 under DDP).
IMAGES = 60
EPOCHS = 3
ENV = {"PYTHONPATH": str(REPO)}
DDP = ("trainer=ddp", "trainer.devices=2")
pytestmark = pytest.mark.slow


def csv_project(images: Path, *overrides: str) -> list[str]:
    """The user's project on `images`, from the backbone file `write_png_dataset`'s caller wrote beside them."""
    return [
        f"hydra.searchpath=[file://{FOREIGN_CONF}]",
        "model=backbone_classifier",
        "data=csv_images",
        f"data.root={images}",
        f"model.backbone_weights={images.parent / 'backbone.pth'}",
        "optimized_metric=val/acc",
        "logger=none",
        f"trainer.max_epochs={EPOCHS}",
        "+callbacks.averaged._target_=lightning.pytorch.callbacks.WeightAveraging",
        *overrides,
    ]


def train(directory: Path, name: str, images: Path, *overrides: str):
    arguments = [*csv_project(images, *overrides), f"hydra.run.dir={name}"]
    return run_module("project.train", *arguments, cwd=directory, env=ENV)


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("csv")
    write_backbone(directory / "backbone.pth")
    return write_png_dataset(directory / "images", IMAGES)


@pytest.fixture(scope="module")
def never_stopped(tmp_path_factory: pytest.TempPathFactory, images: Path) -> dict[str, Path]:
    """The runs never stopped, alone and under DDP (3 epochs each)."""
    directory = tmp_path_factory.mktemp("whole")
    check_ok(train(directory, "alone", images))
    check_ok(train(directory, "ddp", images, *DDP))
    return {"alone": directory / "alone", "ddp": directory / "ddp"}


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


def assert_resumed_exactly(resumed: Path, whole: Path, first_step: int) -> None:
    """Every rank's losses after `first_step`, and the final weights, bitwise those of the run never stopped."""
    for again, once in zip(histories(resumed), histories(whole), strict=True):
        assert again["first_step"] == first_step
        assert again["step_losses"] == once["step_losses"][first_step:], "the resumed run trained other batches"
    expected, resumed_weights = weights(whole), weights(resumed)
    assert resumed_weights.keys() == expected.keys()
    assert all(torch.equal(resumed_weights[name], tensor) for name, tensor in expected.items()), "weights differ"
    assert read_json(resumed / "results.json")["epochs"] == EPOCHS


def resume(directory: Path, stopped: str, images: Path, *overrides: str) -> Path:
    last = directory / stopped / "checkpoints" / "last.ckpt"
    check_ok(train(directory, f"{stopped}-resumed", images, f"ckpt_path={last}", *overrides))
    return directory / f"{stopped}-resumed"


def test_a_run_stopped_by_max_steps_inside_an_epoch_resumes_to_the_run_never_stopped(
    tmp_path: Path, images: Path, never_stopped: dict[str, Path]
):
    """`trainer.max_steps=6` stops in the second epoch (after its second batch): Lightning ends the epoch there and
    saves it as if it had ended; the resumed run, in an interpreter of its own as a user's is, trains that epoch's
    last two batches, then the third epoch."""
    check_ok(train(tmp_path, "stopped", images, "trainer.max_steps=6"))
    assert torch.load(tmp_path / "stopped" / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 6
    with fresh_interpreters():
        resumed = resume(tmp_path, "stopped", images)
    assert_resumed_exactly(resumed, never_stopped["alone"], first_step=6)


def test_a_run_stopped_by_max_time_resumes_to_the_run_never_stopped(
    tmp_path: Path, images: Path, never_stopped: dict[str, Path]
):
    """A time limit ends the run after the step that reaches it (held there past it: step 6), with a validation
    and a checkpoint; the run goes on from the next batch."""
    hold = ["+callbacks.hold._target_=tests.crash_callback.HoldAtStep", "+callbacks.hold.step=6"]
    check_ok(train(tmp_path, "stopped", images, "+trainer.max_time=00:00:00:01", *hold, "+callbacks.hold.seconds=1.5"))
    first_step = torch.load(tmp_path / "stopped" / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
    assert 6 <= first_step < 12
    assert_resumed_exactly(resume(tmp_path, "stopped", images), never_stopped["alone"], first_step)


def test_a_run_stopped_at_an_epochs_end_resumes_its_shuffled_order(
    tmp_path: Path, images: Path, never_stopped: dict[str, Path]
):
    """`shuffle=True` draws each epoch's order from the global random state, which a resumed run does not share: the
    engine's seeded order makes the third epoch that of the run never stopped. An epoch-end checkpoint stores the next
    epoch's start as where training stands (after epochs 1 and 2: `epoch + 1`, which no other operation on 1 or on 2
    with 1 gives on both)."""
    check_ok(train(tmp_path, "stopped", images, "trainer.max_epochs=2"))
    for run, epochs in ((tmp_path / "stopped", 2), (never_stopped["alone"], 3)):
        stored = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
        (position,) = [state["position"] for state in stored["callbacks"].values() if "position" in state]
        assert (position["epoch"], position["batches_done"]) == (epochs, 0), "it stands at the next epoch's start"
    assert_resumed_exactly(resume(tmp_path, "stopped", images), never_stopped["alone"], first_step=8)


@requires("mid_epoch")
@pytest.mark.parametrize("processes", ["alone", "ddp"])
def test_a_run_stopped_by_sigterm_resumes_to_the_run_never_stopped(
    tmp_path: Path, images: Path, never_stopped: dict[str, Path], processes: str
):
    """SIGTERM inside an epoch (alone: the second, of 4 steps; under DDP, where the ranks agree on it a step later:
    the third, of 2 steps), with the mid-epoch checkpoint on: the checkpoint at the step it stops resumes at the next
    batch."""
    ddp = DDP if processes == "ddp" else ()
    stopped = train(tmp_path, "stopped", images, *ddp, MID_EPOCH_ON, *signal_at(3 if ddp else 5, "SIGTERM"))
    assert stopped.returncode == STOPPED_BY_SIGTERM, stopped.stderr[-3000:]
    first_step = torch.load(tmp_path / "stopped" / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
    assert first_step % (2 if ddp else 4), "a checkpoint inside an epoch"
    resumed = resume(tmp_path, "stopped", images, *ddp)
    assert_resumed_exactly(resumed, never_stopped[processes], first_step)


def test_a_ddp_run_stopped_by_max_steps_resumes_to_the_run_never_stopped(
    tmp_path: Path, images: Path, never_stopped: dict[str, Path]
):
    check_ok(train(tmp_path, "stopped", images, *DDP, "trainer.max_steps=3"))
    assert_resumed_exactly(resume(tmp_path, "stopped", images, *DDP), never_stopped["ddp"], first_step=3)


def test_ddp_validates_and_tests_each_sample_once_as_evaluate_does_on_one_process(
    tmp_path: Path, never_stopped: dict[str, Path]
):
    """15 test images on two processes: 8 and 7, none twice (Lightning's sampler would count 16), and the mean over
    processes weighs each process by its count (Lightning's, in integers, would divide by 7)."""
    run = never_stopped["ddp"]
    results = read_json(run / "results.json")
    evaluated = run_module(
        "project.evaluate",
        f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}",
        f"hydra.searchpath=[file://{FOREIGN_CONF}]",
        f"hydra.run.dir={tmp_path / 'evaluate'}",
        cwd=tmp_path,
        env=ENV,
    )
    check_ok(evaluated)
    lines = dict(line.split() for line in evaluated.stdout.splitlines() if line.startswith("test/"))
    assert results["world_size"] == 2
    assert f"{results['test/acc']:.4f}" == lines["test/acc"] and f"{results['test/loss']:.4f}" == lines["test/loss"]
    correct = results["test/acc"] * 15
    assert math.isclose(correct, round(correct), abs_tol=1e-4), "a share of 15 samples"


@pytest.mark.parametrize(
    ("count", "classes", "differs"),
    [
        (IMAGES, ("bag", "coat", "dress"), "class 0 is 'circle' (in this data: 'bag')"),
        (IMAGES + 8, ("circle", "stripe", "dot"), "training samples 30 (this data: 34)"),
    ],
    ids=["other-classes", "more-samples"],
)
def test_a_checkpoint_resumed_with_other_data_is_refused_before_training(
    tmp_path: Path, never_stopped: dict[str, Path], count: int, classes: tuple[str, ...], differs: str
):
    """Labels are positions in the class list: data of other classes (or in another order) or of another size
    would train on with the wrong meaning, whatever the data modules are called."""
    write_backbone(tmp_path / "backbone.pth")
    images = write_png_dataset(tmp_path / "other", count, classes)
    last = never_stopped["alone"] / "checkpoints" / "last.ckpt"
    result = train(tmp_path, "resumed", images, f"ckpt_path={last}", "trainer.max_epochs=4")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    (line,) = error_lines(result.stderr)
    assert line.startswith(f"error: ckpt_path={last} trained on other data than CsvImageData gives: its {differs}")
    assert not (tmp_path / "resumed" / "checkpoints").exists(), "refused before the first step"


def test_class_lists_that_differ_are_named_at_their_first_difference_whichever_sorts_first():
    assert classes_unlike(["circle", "stripe"], ["circle", "dot"]) == "its class 1 is 'stripe' (in this data: 'dot')"
    assert classes_unlike(["circle", "dot"], ["circle", "stripe"]) == "its class 1 is 'dot' (in this data: 'stripe')"
    assert classes_unlike(["circle"], ["circle", "dot"]) == "its 1 classes (this data: 2)"
    assert classes_unlike(["circle", "dot"], ["circle", "dot"]) is None
    assert classes_unlike(None, ["circle"]) is None and classes_unlike(["circle"], None) is None
