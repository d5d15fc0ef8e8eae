"""Memory of the in-memory path: the peak resident memory of `python -m project.train` with the recipe on
Fashion-MNIST (one epoch, its test included), beside that run's training samples/s, and the peak of a bare
`import lightning, hydra, torchvision` for the floor every run pays.

The MNIST family is held as uint8 pixels and normalised batch by batch where it is fetched, so its 70,000 images
take a quarter of what float32 would; `images_mb` states both.
"""

import json
import subprocess
import sys
from pathlib import Path

from bench.report import Row
from bench.settings import Settings
from bench.startup import BARE_IMPORTS
from bench.training_runs import compose_config, load_datamodule

REPO = Path(__file__).resolve().parents[1]


# Starts the command given as its arguments and prints its peak resident memory (kilobytes on Linux) and exit status.
PEAK_OF_COMMAND = """
import os, subprocess, sys
process = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
_, status, usage = os.wait4(process.pid, 0)
print(usage.ru_maxrss, os.waitstatus_to_exitcode(status))
"""


def peak_rss_mb(command: list[str], log: Path) -> float:
    """The peak resident memory of `command`'s process, as the kernel counted it when it was reaped.

    A small Python without site packages starts it: Linux counts in a process's peak the resident memory of the
    process it was forked from (kept across exec), and this one is large once other suites have run in it.
    """
    with log.open("w") as stderr:
        measured = subprocess.run(
            [sys.executable, "-S", "-c", PEAK_OF_COMMAND, *command], cwd=REPO, stdout=subprocess.PIPE, stderr=stderr
        )
    kilobytes, status = measured.stdout.split() if measured.returncode == 0 else (0, 1)
    if int(status) != 0:
        raise RuntimeError(f"{' '.join(command[1:3])} failed: {log.read_text()[-500:]}")
    return int(kilobytes) / 1024


def run(settings: Settings, recipe: list[str], scratch: Path) -> dict:
    overrides = [*recipe, settings.trainer_override(), "trainer.max_epochs=1", "logger=none"]
    train = [sys.executable, "-m", "project.train", *overrides, f"hydra.run.dir={scratch / 'run'}"]
    train_mb = peak_rss_mb(train, scratch / "train.log")
    imports_mb = peak_rss_mb([sys.executable, "-c", BARE_IMPORTS], scratch / "imports.log")
    results = json.loads((scratch / "run" / "results.json").read_text())
    datamodule = load_datamodule(compose_config(overrides, scratch / "sizes"))
    splits = [datamodule.train_set, datamodule.val_set, datamodule.test_set]
    pixels = sum(split.inputs.numel() for split in splits)
    return {
        "overrides": overrides,
        "peak_rss_mb": {"train": train_mb, "imports": imports_mb},
        "samples_per_second": results["samples_per_second"],
        "images": sum(len(split) for split in splits),
        "images_mb": {"uint8": pixels / 2**20, "float32": 4 * pixels / 2**20},
    }


def rows(result: dict) -> list[Row]:
    peak, images = result["peak_rss_mb"], result["images_mb"]
    note = (
        f"{result['samples_per_second']:,.0f} samples/s; bare imports {peak['imports']:.0f} MB; "
        f"{result['images']:,} images held in {images['uint8']:.0f} MB (float32: {images['float32']:.0f} MB)"
    )
    return [("memory: peak RSS, recipe 1 epoch", f"{peak['train']:6.0f} MB", note)]
