"""`data=image_folder`: images read from disk by DataLoader workers, with augmentation seeded per image, give the same
numbers on both paths (alone and under DDP), learn the example dataset, and refuse bad folders and files in one line.
docs/image-folder.md's steps for a network of your own run as written under DDP.
"""

import csv
import re
import shutil
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader
from torchvision.transforms import v2

from project.engine.errors import UserError
from project.optional.image_folder.datamodule import EpochTaggedShuffleSampler, ImageFolderDataModule, converted, fitted
from project.optional.image_folder.example import main as write_example
from tests.docs_commands import follow_steps, section_blocks
from tests.faults import (
    assert_ends_in_error_line,
)
from tests.helpers import (
    MID_EPOCH_ON,
    REPO,
    STOPPED_BY_SIGTERM,
    TRUST_TEST_CODE,
    assert_resumed_exactly,
    check_ok,
    read_json,
    requires,
    run_module,
    signal_at,
)

TOLERANCE = 1e-6
PER_CLASS = 48  # the example's 4 shapes: 192 training images, 12 per class for validation and for test
ENV = {"OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def example_images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("images") / "example"
    write_example([str(root), "--per-class", str(PER_CLASS)])
    return root


def image_folder(root: Path, *extra: str) -> list[str]:
    return ["experiment=image_folder_cnn", f"data.root={root}", "data.batch_size=32", "logger=none", *extra]


def datamodule(root: Path, num_workers: int) -> ImageFolderDataModule:
    augment = [v2.RandomCrop(28, padding=2), v2.RandomHorizontalFlip()]
    module = ImageFolderDataModule(
        str(root),
        32,
        seed=3,
        image_size=28,
        mean=[0.5],
        std=[0.5],
        channels=1,
        augment=augment,
        num_workers=num_workers,
    )
    module.setup("fit")
    return module


def test_the_example_has_every_split_and_class(example_images: Path):
    module = datamodule(example_images, num_workers=0)
    assert module.class_names == ("across", "diagonal", "down", "ring")
    assert (len(module.train_set), len(module.val_set), len(module.test_set)) == (4 * PER_CLASS, 4 * 12, 4 * 12)
    assert module.train_set.targets.bincount().tolist() == [PER_CLASS] * 4


def test_augmentation_depends_on_seed_epoch_and_index_only(example_images: Path):
    """Whichever worker loads an image, and however many there are, it gets the same crop and flip."""
    module = datamodule(example_images, num_workers=0)
    sampler = EpochTaggedShuffleSampler(module.train_set, seed=3)
    batches = {}
    for workers in (0, 2):
        module.num_workers = workers
        loader = module.loader(module.train_set, sampler, train=True)
        sampler.set_epoch(1)
        batches[workers] = [inputs for inputs, _ in loader]
    assert all(torch.equal(a, b) for a, b in zip(batches[0], batches[2], strict=True))
    image_epoch_1, _ = module.train_set[(1, 5)]
    assert torch.equal(image_epoch_1, module.train_set[(1, 5)][0])
    differs = [not torch.equal(module.train_set[(epoch, 5)][0], image_epoch_1) for epoch in range(2, 8)]
    assert any(differs), "another epoch draws another augmentation"
    plain, _ = module.train_set[5]  # an index alone (validation, test): not augmented
    assert torch.equal(plain, module.val_set.normalise(module.train_set.image(5)))


@pytest.mark.slow
def test_a_cnn_learns_the_example_from_its_folder(tmp_path: Path, example_images: Path):
    run_dir = tmp_path / "run"
    check_ok(
        run_module("project.train", *image_folder(example_images), f"hydra.run.dir={run_dir}", cwd=tmp_path, env=ENV)
    )
    results = read_json(run_dir / "results.json")
    assert results["epochs"] == 5 and results["test/acc"] >= 0.9, results


@pytest.mark.slow
@requires("reference")
@pytest.mark.parametrize("strategy", [(), ("trainer=ddp", "trainer.devices=2")], ids=["single", "ddp"])
def test_both_paths_agree_with_two_workers_and_random_augmentation(
    tmp_path: Path, example_images: Path, strategy: tuple[str, ...]
):
    overrides = image_folder(example_images, "data.num_workers=2", "trainer.max_epochs=2", *strategy)
    run_dir = tmp_path / "compare"
    compare = run_module(
        "project.optional.reference.compare", *overrides, f"hydra.run.dir={run_dir}", cwd=tmp_path, env=ENV, timeout=900
    )
    check_ok(compare)  # both paths, each with its processes and their workers: more processes than this machine's cores
    comparison = read_json(run_dir / "comparison.json")
    print(f"\n{strategy or 'single'}: {comparison['max_step_loss_diff']:.2e} {comparison['max_weight_diff']:.2e}")
    assert comparison["max_step_loss_diff"] <= TOLERANCE and comparison["max_weight_diff"] <= TOLERANCE


@pytest.mark.slow
def test_predict_under_ddp_lists_every_test_image_once_and_draws_the_mistakes(tmp_path: Path, example_images: Path):
    """Images read from their files for the CSV and for the picture; the accuracy is `evaluate`'s."""
    run_dir = tmp_path / "run"
    overrides = image_folder(example_images, "trainer.max_epochs=1", "model.optimizer.lr=1e-5")
    check_ok(run_module("project.train", *overrides, f"hydra.run.dir={run_dir}", cwd=tmp_path, env=ENV))
    checkpoint = f"ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}"
    predicted = check_ok(
        run_module("project.predict", checkpoint, "trainer=ddp", "trainer.devices=2", cwd=tmp_path, env=ENV)
    )
    (predict_dir,) = re.findall(r"^run dir: (\S+)", predicted.stdout, flags=re.MULTILINE)
    with (Path(predict_dir) / "predictions.csv").open() as file:
        rows = list(csv.DictReader(file))
    labels = datamodule(example_images, num_workers=0).test_set.targets.tolist()
    assert [int(row["index"]) for row in rows] == list(range(len(labels)))
    assert [int(row["label"]) for row in rows] == labels
    accuracy = sum(row["label"] == row["predicted"] for row in rows) / len(rows)
    evaluated = check_ok(run_module("project.evaluate", checkpoint, cwd=tmp_path, env=ENV))
    (test_accuracy,) = re.findall(r"^test/acc\s+(\S+)$", evaluated.stdout, flags=re.MULTILINE)
    assert accuracy == pytest.approx(float(test_accuracy), abs=5e-5) and accuracy < 1
    picture = matplotlib.image.imread(Path(predict_dir) / "most_confident_mistakes.png")
    assert picture.ndim == 3 and min(picture.shape[:2]) > 100


@pytest.mark.slow
@requires("mid_epoch")  # the SIGTERM checkpoint
def test_a_run_stopped_inside_an_epoch_resumes_to_the_same_augmented_batches(tmp_path: Path, example_images: Path):
    """SIGTERM after step 9 (epoch 1, batch 3 of 6), with 2 workers: the resumed run draws the same images with the
    same crops and flips, so its losses and final weights are bitwise those of a run never stopped."""
    overrides = image_folder(example_images, "data.num_workers=2", "trainer.max_epochs=3")
    env = {**ENV, "PYTHONPATH": str(REPO)}  # lets the run import tests.crash_callback
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    check_ok(run_module("project.train", *overrides, f"hydra.run.dir={whole}", cwd=tmp_path, env=env))
    signalled = run_module(
        "project.train",
        *overrides,
        *signal_at(9, "SIGTERM"),
        MID_EPOCH_ON,
        f"hydra.run.dir={stopped}",
        cwd=tmp_path,
        env=env,
    )
    assert signalled.returncode == STOPPED_BY_SIGTERM, signalled.stderr[-2000:]
    resumed = tmp_path / "resumed"
    last = f"ckpt_path={stopped / 'checkpoints' / 'last.ckpt'}"
    resume = [*overrides, last, TRUST_TEST_CODE, f"hydra.run.dir={resumed}"]
    check_ok(run_module("project.train", *resume, cwd=tmp_path, env=env))
    assert_resumed_exactly(resumed, whole, first_step=9)


def write_bad_image(root: Path, case: str) -> Path:
    """Damage a copy of the example in one way; the file or folder the error must name."""
    down = root / "train" / "down"
    if case == "split missing":
        shutil.rmtree(root / "val")
        return root / "val"
    if case == "class empty":
        for path in down.iterdir():
            path.unlink()
        return down
    if case == "classes differ":
        (root / "test" / "down").rename(root / "test" / "sideways")
        return root / "test"
    (down / "00003.png").write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    return down / "00003.png"


@pytest.mark.slow
@pytest.mark.parametrize("case", ["split missing", "class empty", "classes differ", "corrupt image"])
def test_bad_folders_and_images_end_in_one_line_naming_them(tmp_path: Path, example_images: Path, case: str):
    root = tmp_path / "images"
    shutil.copytree(example_images, root)
    named = write_bad_image(root, case)
    result = run_module(
        "project.train", *image_folder(root), f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, env=ENV
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and str(named) in errors[0], errors


@pytest.mark.slow
def test_a_network_scoring_another_number_of_classes_is_refused_in_one_line(tmp_path: Path, example_images: Path):
    overrides = image_folder(example_images, "model.network.num_classes=3", f"hydra.run.dir={tmp_path / 'run'}")
    result = run_module("project.train", *overrides, cwd=tmp_path, env=ENV)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: model.network scores 3 classes, the data has 4 (across, diagonal, down, ring): "
        "set model.network.num_classes=4"
    ]


def test_mean_and_std_take_one_value_for_every_channel_or_one_per_channel(example_images: Path):
    every = ImageFolderDataModule(str(example_images), 32, seed=0, image_size=28, mean=[0.5], std=[0.25], channels=3)
    assert every.normalise.keywords == {"mean": [0.5] * 3, "std": [0.25] * 3}
    with pytest.raises(UserError, match="one per channel"):
        ImageFolderDataModule(str(example_images), 32, seed=0, image_size=28, mean=[0.5, 0.5], std=[0.5], channels=3)


def sixteen_bit(value: int) -> Image.Image:
    return Image.fromarray(np.full((6, 4), value, dtype=np.uint16))


def test_images_of_any_mode_are_converted_and_any_size_fitted():
    """16-bit grey is scaled down (PIL alone would clip it to white); a palette with transparency, RGBA and CMYK
    become RGB; any size becomes image_size square, its shorter side resized and its centre cropped."""
    assert converted(sixteen_bit(65535), "L").getpixel((0, 0)) == 255
    assert converted(sixteen_bit(257 * 100), "L").getpixel((0, 0)) == 100
    palette = Image.new("P", (5, 5))
    palette.info["transparency"] = 0
    for image in (palette, Image.new("RGBA", (5, 5)), Image.new("CMYK", (5, 5)), Image.new("L", (5, 5))):
        assert converted(image, "RGB").mode == "RGB"
    wide = torch.arange(3 * 30 * 40, dtype=torch.int32).reshape(3, 30, 40).to(torch.uint8)
    assert fitted(wide, 28).shape == (3, 28, 28)
    square = torch.randint(0, 255, (1, 28, 28), dtype=torch.uint8)
    assert fitted(square, 28) is square


def write_mixed_photos(root: Path) -> None:
    """Two classes of images as a camera, a scanner and the web give them: every size, mode and format differs."""
    kinds = [
        ("jpg", lambda: Image.new("RGB", (40, 30), (200, 30, 30))),
        ("png", lambda: Image.new("L", (20, 50), 90)),
        ("gif", lambda: Image.new("P", (33, 33), 3)),
        ("png", lambda: Image.new("RGBA", (64, 48), (10, 200, 10, 128))),
        ("jpg", lambda: Image.new("CMYK", (31, 29), (0, 100, 200, 0))),
        ("png", lambda: sixteen_bit(40000).resize((45, 45))),
        ("webp", lambda: Image.new("RGB", (28, 70), (0, 0, 250))),
    ]
    for split in ("train", "val", "test"):
        for label, shade in (("dark", 0.3), ("light", 1.0)):
            folder = root / split / label
            folder.mkdir(parents=True)
            for number, (suffix, make) in enumerate(kinds):
                image = make()
                image = image.point(lambda value, shade=shade: int(value * shade)) if image.mode != "I;16" else image
                image.save(folder / f"{number}.{suffix}")


@pytest.mark.slow
def test_a_folder_of_mixed_photos_trains_with_nothing_but_its_root_typed(tmp_path: Path):
    root = tmp_path / "photos"
    write_mixed_photos(root)
    run_dir = tmp_path / "run"
    overrides = ["experiment=image_folder_cnn", f"data.root={root}", "logger=none", "trainer.max_epochs=1"]
    check_ok(run_module("project.train", *overrides, f"hydra.run.dir={run_dir}", cwd=tmp_path, env=ENV))
    network = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["config"]["model"]["network"]
    assert (network["num_classes"], network["in_channels"]) == (2, 3), "counted from the folders, RGB by default"
    assert read_json(run_dir / "results.json")["test/acc"] >= 0

    # The checkpoint scores `dark` and `light`: a folder with a third class is refused, not scored against them.
    three_classes = shutil.copytree(root, tmp_path / "three_classes")
    for split in ("train", "val", "test"):
        shutil.copytree(root / split / "dark", three_classes / split / "medium")
    checkpoint = f"ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}"
    evaluated = run_module("project.evaluate", checkpoint, f"data.root={three_classes}", cwd=tmp_path, env=ENV)
    line = assert_ends_in_error_line(
        evaluated.returncode,
        evaluated.stdout,
        evaluated.stderr,
        2,
        "['dark', 'light', 'medium']",
        "trained on ['dark', 'light']",
    )
    assert line.startswith("error: the data has the classes")
    # Grey samples for a network trained on RGB: one line naming the key given.
    predicted = run_module("project.predict", checkpoint, "+data.channels=1", cwd=tmp_path, env=ENV)
    line = assert_ends_in_error_line(
        predicted.returncode, predicted.stdout, predicted.stderr, 2, "data.channels=1", "to have 3 channels, but got 1"
    )
    assert line.startswith("error: the checkpoint's network does not take the samples of the data as given")


def test_the_loader_keeps_its_workers_between_epochs(example_images: Path):
    module = datamodule(example_images, num_workers=2)
    loader = module.loader(module.val_set)
    assert isinstance(loader, DataLoader) and loader.persistent_workers and loader.num_workers == 2


@pytest.mark.slow
def test_the_docs_steps_add_a_network_and_train_it_under_ddp(tmp_path: Path):
    """docs/image-folder.md's network class, YAML and commands as written, in a fresh directory."""
    steps = section_blocks(REPO / "docs" / "image-folder.md", "A network of your own on your images, step by step")
    assert [language for language, _ in steps] == ["python", "yaml", "bash"]
    results = follow_steps(steps, tmp_path, ENV)
    assert read_json(results)["world_size"] == 2
    checkpoint = torch.load(results.parent / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["config"]["model"]["network"]["_target_"] == "my_models.TinyCNN"
