"""Start-up: `python -m project.train` on the toy default against `python -c "import lightning, hydra, torchvision"`.

Both are fresh interpreters, so both pay Python's and torch's start; the train run also composes the config,
trains the toy's 6 steps, tests, and writes TensorBoard events, checkpoints and results.
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


def timed(command: list[str]) -> list[float]:
    start = time.perf_counter()
    subprocess.run(command, cwd=REPO, check=True, capture_output=True)
    return [time.perf_counter() - start]


def run(settings: Settings, recipe: list[str], scratch: Path) -> dict:
    """(The toy default: `recipe` is not used.)"""
    run_dirs = (scratch / f"run{number}" for number in range(settings.repeats))
    seconds = interleave(
        {
            "imports": lambda: timed([sys.executable, "-c", BARE_IMPORTS]),
            "train": lambda: timed([sys.executable, "-m", "project.train", f"hydra.run.dir={next(run_dirs)}"]),
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
    return [("start-up: project.train toy / bare imports", ratio_cell(result["train_vs_imports"]), note)]
