"""Images read from disk: `data=image_folder` on a folder of Fashion-MNIST PNGs (written by
`project.optional.image_folder.example`), with `experiment=image_folder_cnn`'s CNN.

Measured, interleaved:

    data module      one pass of its training loader alone: decode, seeded augmentation, normalise, collate
    plain decode     a bare DataLoader over the same files that only decodes them (PIL, to a tensor), with the
                     same workers and batch size: the floor of reading these files
    training, N workers  the training steps of an epoch of the CNN through the Lightning path with
                     `data.num_workers=N` (0 and 2), from the epoch's start to its last step (no validation)

The loader keeps ahead of the CNN when its samples/s alone exceed the training's samples/s with the same workers
(`loader_vs_training` > 1); `datamodule_vs_plain` is what the data module's own work costs on top of decoding.
"""

import statistics
import time
from pathlib import Path

from PIL import Image
from torch import Tensor
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import v2

from bench.report import Row, ratio_cell
from bench.settings import Settings
from bench.timing import all_units, interleave, paired_ratio
from bench.training_runs import compose_config, lightning_fit, load_datamodule
from project.optional.image_folder.example import fashion_mnist_splits, write

WORKERS = 2
PER_CLASS = {"quick": 20, "full": 600}  # training images per class; a quarter of that for validation and test


class DecodeOnly(Dataset):
    """The files, decoded and nothing else."""

    def __init__(self, files: list[Path]) -> None:
        self.files = files

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> Tensor:
        with Image.open(self.files[index]) as image:
            return v2.functional.pil_to_tensor(image.convert("L"))


def one_pass(loader: DataLoader) -> list[float]:
    """The seconds to draw every batch of `loader` once, starting its workers included."""
    start = time.perf_counter()
    for _ in loader:
        pass
    return [time.perf_counter() - start]


def run(settings: Settings, recipe: list[str], scratch: Path) -> dict:
    root = scratch / "image-folder"
    per_class = PER_CLASS["quick" if settings.quick else "full"]
    write(fashion_mnist_splits(str(settings.data_root), per_class), root)
    overrides = [
        "experiment=image_folder_cnn",
        f"data.root={root}",
        "model.network.num_classes=10",
        settings.trainer_override(),
        f"trainer.max_epochs={settings.epochs}",
    ]
    datamodule = load_datamodule(compose_config([*overrides, f"data.num_workers={WORKERS}"], scratch))
    samples = len(datamodule.train_set)
    plain = DataLoader(DecodeOnly(datamodule.train_set.files), batch_size=datamodule.batch_size, num_workers=WORKERS)

    def epochs(workers: int):
        cfg = compose_config([*overrides, f"data.num_workers={workers}"], scratch / f"workers{workers}")

        def fit() -> list[float]:
            clock = lightning_fit(cfg, load_datamodule(cfg))[0].clock
            steps = len(clock.step_ends) // len(clock.epoch_starts)
            return [clock.step_ends[(epoch + 1) * steps - 1] - start for epoch, start in enumerate(clock.epoch_starts)]

        return fit

    seconds = interleave(
        {
            "data module": lambda: one_pass(datamodule.train_dataloader()),
            "plain decode": lambda: one_pass(plain),
            "training, 0 workers": epochs(0),
            f"training, {WORKERS} workers": epochs(WORKERS),
        },
        settings.repeats,
    )
    rates = {name: [samples / unit for repeat in seconds[name] for unit in repeat] for name in seconds}
    training = {workers: seconds[f"training, {workers} workers"] for workers in (0, WORKERS)}
    return {
        "overrides": overrides,
        "training_images": samples,
        "workers": WORKERS,
        "seconds": {name: all_units(times).as_dict() for name, times in seconds.items()},
        "samples_per_second": rates,
        "datamodule_vs_plain": paired_ratio(seconds["plain decode"], seconds["data module"]).as_dict(),
        "loader_vs_training": paired_ratio(training[WORKERS], seconds["data module"]).as_dict(),
        "two_workers_vs_none": paired_ratio(training[0], training[WORKERS]).as_dict(),
    }


def rows(result: dict) -> list[Row]:
    rate = {name: statistics.median(values) for name, values in result["samples_per_second"].items()}
    workers = result["workers"]
    training = f"training, {workers} workers"
    return [
        (
            f"image folder: data module / plain decode, {workers} workers",
            ratio_cell(result["datamodule_vs_plain"]),
            f"{rate['data module']:,.0f} vs {rate['plain decode']:,.0f} samples/s",
        ),
        (
            f"image folder: loader / CNN training, {workers} workers",
            ratio_cell(result["loader_vs_training"]),
            f"CNN trains {rate[training]:,.0f} samples/s; > 1: the loader keeps ahead",
        ),
        (
            f"image folder: CNN training, {workers} workers / 0",
            ratio_cell(result["two_workers_vs_none"]),
            f"epoch's steps {result['seconds'][training]['median']:.1f} s vs "
            f"{result['seconds']['training, 0 workers']['median']:.1f} s ({result['training_images']:,} images)",
        ),
    ]
