"""Start-up: `python -m project.train` on the toy default against `python -c "import lightning, hydra, torchvision"`.

Both are fresh interpreters, so both pay Python's and torch's start; the train run also composes the config,
trains the toy's 6 steps, tests, and writes TensorBoard events, checkpoints and results. Part of that start, the
run's receipt (`write_receipt`: git, versions, machine) is timed on its own, after the imports a run has made.
"""

import subprocess
import sys
import time
from pathlib import Path

from bench.report import Row, ratio_cell
from bench.settings import Settings
from bench.timing import all_units, interleave, paired_ratio

REPO = Path(__file__).resolve().parents[1]
BARE_IMPORTS = "import lightning, hydra, torchvision"
# The receipt of a toy run, written into a new directory, in a process that imported what project.train imports.
RECEIPT = """
import sys, tempfile, time
import project.train, project.example.module, project.example.data
from project.engine.run_dir import write_receipt
targets = ["project.example.module.ClassifierModule", "project.example.data.ToyDataModule", "torch.optim.SGD"]
start = time.perf_counter()
write_receipt(tempfile.mkdtemp(), targets, {"world_size": 1})
print(time.perf_counter() - start)
"""


def timed(command: list[str]) -> list[float]:
    start = time.perf_counter()
    subprocess.run(command, cwd=REPO, check=True, capture_output=True)
    return [time.perf_counter() - start]


def receipt_seconds() -> list[float]:
    done = subprocess.run([sys.executable, "-c", RECEIPT], cwd=REPO, check=True, capture_output=True, text=True)
    return [float(done.stdout.strip().splitlines()[-1])]


def run(settings: Settings, recipe: list[str], scratch: Path) -> dict:
    """(The toy default: `recipe` is not used.)"""
    run_dirs = (scratch / f"run{number}" for number in range(settings.repeats))
    seconds = interleave(
        {
            "imports": lambda: timed([sys.executable, "-c", BARE_IMPORTS]),
            "train": lambda: timed([sys.executable, "-m", "project.train", f"hydra.run.dir={next(run_dirs)}"]),
            "receipt": receipt_seconds,
        },
        settings.repeats,
    )
    return {
        "seconds": {name: all_units(times).as_dict() for name, times in seconds.items()},
        "train_vs_imports": paired_ratio(seconds["train"], seconds["imports"]).as_dict(),
    }


def rows(result: dict) -> list[Row]:
    seconds = result["seconds"]
    note = f"train {seconds['train']['median']:.1f} s, imports {seconds['imports']['median']:.1f} s, goal <= 1.5"
    receipt = seconds["receipt"]
    return [
        ("start-up: project.train toy / bare imports", ratio_cell(result["train_vs_imports"]), note),
        ("start-up: the run's receipt", f"{receipt['median']:.3f} s", f"max {receipt['high']:.3f} s, goal <= 0.2 s"),
    ]
