"""Golden curves: the per-step losses of the shipped recipes, kept in tests/golden/<recipe>.json, against which the
suite checks that today's numbers are the ones recorded (tests/test_golden.py) and `make golden` reports what moved.

A curve is recorded under a key: the device class (the CPU's model, its cpuid family/model/stepping and a digest of
its feature flags, which decide the kernels MKL and oneDNN pick), its x86-64 level and torch's CPU capability, the
intra-op threads, and the versions that decide the numbers (Python, torch, torchvision, Lightning, NumPy), all read
from the run's own receipt (receipt.json). Where today's key is recorded the curve must equal it bitwise; elsewhere
it is compared with the closest recorded key within `RELATIVE_TOLERANCE`, and the comparison says which key and by
how much: another machine or version moves the last bits of a float32 loss, never its leading digits over these few
steps. docs/testing.md, "Golden curves".

Every recipe runs on the CPU with one intra-op thread, in a few steps: the golden curves are what this machine and
CI can check at every run of the suite; a GPU's curves would need a GPU at every run.
"""

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.foreign_modules import FOREIGN_CONF, write_wikitext
from tests.helpers import REPO, check_ok, histories, read_json, run_module
from tests.idx_files import write_idx_dataset

GOLDEN_DIR = Path(__file__).parent / "golden"
# A loss within this relative difference of the closest recorded key's counts as the same curve (another CPU, or a
# version that changed only the order of a sum, moves float32 losses by about 1e-7 relative over these steps).
RELATIVE_TOLERANCE = 1e-4
# The distributions whose versions are part of a curve's key.
KEY_VERSIONS = ("torch", "torchvision", "lightning", "numpy")
# What every recipe adds: no logger, the CPU (the curves are this machine's and CI's), one intra-op thread; the
# repository on PYTHONPATH (the transformer's data module is the tests').
COMMON = ("logger=none", "trainer.accelerator=cpu")
ENV = {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def write_mnist(directory: Path) -> None:
    """mnist/: 400 training and 100 test images in MNIST's files (tests/idx_files.py), the same at every call."""
    write_idx_dataset(directory / "mnist")


@dataclass(frozen=True)
class Recipe:
    label: str  # as the drift report names it
    overrides: tuple[str, ...]
    writes: Callable[[Path], None] | None = None  # the data it reads, written where it starts
    part: str | None = None  # the optional part it needs


MNIST_FILES = ("data.root=mnist", "data.download=false", "data.val_size=50", "trainer.max_epochs=1")
RECIPES = {
    "toy": Recipe("the toy (make train)", ()),
    "toy_ddp": Recipe("the toy under ddp × 2", ("trainer=ddp", "trainer.devices=2")),
    "mnist_mlp": Recipe("the MNIST MLP (experiment=mnist), 1 epoch", ("experiment=mnist", *MNIST_FILES), write_mnist),
    "cnn": Recipe("the CNN (model=cnn) on MNIST, 1 epoch", ("data=mnist", "model=cnn", *MNIST_FILES), write_mnist),
    "fsdp_transformer": Recipe(
        "Lightning's demo transformer under fsdp × 2, 1 epoch",
        (
            f"hydra.searchpath=[file://{FOREIGN_CONF}]",
            "model=transformer",
            "data=wikitext",
            "trainer=fsdp",
            "trainer.devices=2",
            "trainer.max_epochs=1",
        ),
        write_wikitext,
        "fsdp",
    ),
}


def train(name: str, directory: Path) -> Path:
    """Run recipe `name` in `directory` (its data written there first); its run dir."""
    recipe = RECIPES[name]
    if recipe.writes:
        recipe.writes(directory)
    run_dir = directory / "run"
    args = (*COMMON, *recipe.overrides, f"hydra.run.dir={run_dir}")
    check_ok(run_module("project.train", *args, cwd=directory, env=ENV))
    return run_dir


def key_of(run_dir: Path) -> dict:
    """A run's key, from its receipt: what decides its numbers beside the code."""
    segment = read_json(run_dir / "receipt.json")["segments"][-1]
    machine, environment = segment["machine"], segment["environment"]
    gpus = [gpu["name"] for gpu in machine["gpus"]] if segment["launch"]["accelerator"] == "CUDAAccelerator" else []
    return {
        "device": " + ".join(gpus) or machine["cpu"]["model"],
        "cpuid": None if gpus else machine["cpu"]["cpuid"],
        "cpu_features": None if gpus else machine["cpu"]["features_sha256"],
        "isa_level": machine["cpu"]["isa_level"],
        "cpu_capability": environment["torch"]["cpu_capability"],
        "threads": environment["torch"]["threads"],
        "python": ".".join(environment["python"].split(".")[:2]),
        **{name: environment["distributions"].get(name) for name in KEY_VERSIONS},
    }


def curves_of(run_dir: Path) -> list[list[float]]:
    """Every rank's per-step training losses, in rank order."""
    return [history["step_losses"] for history in histories(run_dir)]


def golden_file(name: str) -> Path:
    return GOLDEN_DIR / f"{name}.json"


def recorded(name: str) -> list[dict]:
    """Recipe `name`'s recorded curves: entries of `key` and `losses` (one list per rank)."""
    path = golden_file(name)
    return read_json(path)["curves"] if path.is_file() else []


def closest(entries: list[dict], key: dict) -> dict | None:
    """The entry of `key` itself, else the one that shares most of its fields (device and instruction set first)."""
    order = list(key)

    def likeness(entry: dict) -> tuple:
        return tuple(entry["key"].get(field) == key[field] for field in order)

    return max(entries, key=likeness, default=None)


def relative_difference(then: float, now: float) -> float:
    if then == now:
        return 0.0
    if not (math.isfinite(then) and math.isfinite(now)):
        return math.inf
    return abs(now - then) / max(abs(then), abs(now))


@dataclass
class Drift:
    """How a curve differs from a recorded one: `exact`, or the largest relative difference and the first step
    (1-based, counted over every rank's steps in turn) where any difference starts."""

    largest: float
    first_step: int | None
    lengths: tuple[int, ...] | None = None  # the steps per rank now, where they differ from the recorded

    @property
    def exact(self) -> bool:
        return self.first_step is None and self.lengths is None

    @property
    def within_tolerance(self) -> bool:
        return self.lengths is None and self.largest <= RELATIVE_TOLERANCE

    def __str__(self) -> str:
        if self.lengths is not None:
            return f"another number of steps per rank: {list(self.lengths)}"
        if self.exact:
            return "exact"
        return f"max relative difference {self.largest:.1e} from step {self.first_step}"


def drift(then: list[list[float]], now: list[list[float]]) -> Drift:
    if [len(losses) for losses in then] != [len(losses) for losses in now]:
        return Drift(math.inf, None, tuple(len(losses) for losses in now))
    flat_then = [loss for losses in then for loss in losses]
    flat_now = [loss for losses in now for loss in losses]
    differences = [relative_difference(old, new) for old, new in zip(flat_then, flat_now, strict=True)]
    first = next((index + 1 for index, difference in enumerate(differences) if difference), None)
    return Drift(max(differences, default=0.0), first)


def key_changes(then: dict, now: dict) -> str:
    """What differs between two keys, `torch 2.14.1 → 2.15.0`; empty where they are the same."""
    return ", ".join(f"{field} {then.get(field)} → {value}" for field, value in now.items() if then.get(field) != value)


def record(name: str, key: dict, losses: list[list[float]]) -> None:
    """Keep `losses` as recipe `name`'s curve under `key`, replacing the one recorded under that key."""
    kept = [entry for entry in recorded(name) if entry["key"] != key]
    entries = sorted([*kept, {"key": key, "losses": losses}], key=lambda entry: json.dumps(entry["key"]))
    GOLDEN_DIR.mkdir(exist_ok=True)
    overrides = [override.replace(f"{REPO}/", "") for override in (*COMMON, *RECIPES[name].overrides)]
    document = {"recipe": RECIPES[name].label, "overrides": overrides, "curves": entries}
    golden_file(name).write_text(json.dumps(document, indent=1) + "\n")


def judged(entries: list[dict], key: dict, losses: list[list[float]]) -> tuple[bool, str]:
    """Whether `losses` are the recorded curve (bitwise where `key` is recorded, else within the tolerance of the
    closest key), and what the comparison was."""
    nearest = closest(entries, key)
    if nearest is None:
        return False, "no golden curve is recorded: `make golden` records it"
    found = drift(nearest["losses"], losses)
    if nearest["key"] == key:
        return found.exact, f"against the curve recorded under this very key: {found}"
    changes = key_changes(nearest["key"], key)
    compared = f"against the closest key recorded ({changes}): {found}, tolerance {RELATIVE_TOLERANCE:g}"
    return found.within_tolerance, f"no curve is recorded under this key; {compared}"
