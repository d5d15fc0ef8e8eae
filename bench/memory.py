"""Memory of the in-memory path: the peak resident memory of `python -m project.train` with the recipe on
Fashion-MNIST (one epoch, its test included), beside that run's training samples/s, and the peak of a bare
`import lightning, hydra, torchvision` for the floor every run pays.

The MNIST family is held as uint8 pixels and normalised batch by batch where it is fetched, so its 70,000 images
take a quarter of what float32 would; `images_mb` states both.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

from bench.settings import Settings
from bench.startup import BARE_IMPORTS
from bench.training_runs import compose_config, load_datamodule

REPO = Path(__file__).resolve().parents[1]


def peak_rss_mb(command: list[str], log: Path) -> float:
    """The peak resident memory of `command`'s process, as the kernel counted it when it was reaped."""
    with log.open("w") as stderr:
        proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=stderr)
        _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(command[1:3])} failed: {log.read_text()[-500:]}")
    return usage.ru_maxrss / 1024  # kilobytes on Linux


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
