"""A conformance zoo: modules and data modules no one here wrote, through every switch, fresh and from checkpoints.

Rows (`ROWS`): Lightning's demo `BoringModel` on its `BoringDataModule`; the same module serving its own batches
(`data=none`: no data module); Lightning's demo `LightningTransformer` (`nn.Transformer` inside, `forward(inputs,
target)`, no validation, test or predict step) on its `WikiText2` dataset, read from a small local file; torchvision's
`resnet18` as the example classifier's network, on an image folder. Columns (`SWITCHES`): one process; ddp, ddp_spawn
and fsdp, two CPU processes over gloo; bf16-mixed; a `-m` sweep of two seeds; a resume from the one-process run's
last.ckpt; `project.evaluate` and `project.predict` of the resumed run's last.ckpt.

`CELLS` declares each cell's outcome, once: `works`, or `refused: <what the one error line says to do>`. The table in
docs/your-code.md says the same (`test_the_docs_table_is_the_declared_cells`). A run's output that the next cell needs
is made once per row (`ChainedRuns`: one process → resume → evaluate, predict); every other cell is one tiny run, on
either worker.
"""

import math
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from project.engine.reports import format_value
from tests.foreign_modules import FOREIGN_CONF, write_wikitext
from tests.helpers import REPO, check_ok, error_lines, histories, read_json, requires, train_own


def write_images(directory: Path) -> None:
    """images/: four classes of 28×28 pictures, 4 of each to train, 1 of each to validate and to test."""
    from project.optional.image_folder.example import shape_splits, write  # a part's: its row is marked to need it

    write(shape_splits(per_class=4), directory / "images")


@dataclass(frozen=True)
class Row:
    label: str  # its first column in docs/your-code.md's table
    overrides: tuple[str, ...]
    train_samples: int  # per epoch, over all processes
    predicted: int  # samples project.predict predicts
    files: tuple = ()  # what writes the data it reads, in the directory the run starts in
    marks: tuple = ()  # `requires` of the optional parts it needs
    # What evaluate and predict take besides the checkpoint: the trust of a target typed on the training command line,
    # which no config file names (docs/checkpoints.md, "A checkpoint is data").
    opening: tuple[str, ...] = ()


ROWS = {
    "boring": Row("Lightning's `BoringModel` on its `BoringDataModule`", ("model=boring", "data=boring"), 64, 64),
    "boring_own_data": Row(
        "Lightning's `BoringModel` serving its own batches (`data=none`)", ("model=boring", "data=none"), 64, 64
    ),
    "transformer": Row(
        "Lightning's `LightningTransformer` on its `WikiText2`",
        ("model=transformer", "data=wikitext"),
        8,
        3,
        (write_wikitext,),
    ),
    "resnet18": Row(
        "torchvision's `resnet18` in the example's classifier, on an image folder",
        (
            "experiment=image_folder_cnn",
            "model.network._target_=torchvision.models.resnet18",
            "model.network.num_classes=4",  # the builder passes **kwargs on: the recipe's hint cannot reach it
            "data.root=images",
            "data.num_workers=0",
            "data.batch_size=8",
        ),
        16,
        4,
        (write_images,),
        (requires("image_folder"),),
        ("+trusted_targets.resnet18=torchvision.models.resnet18",),
    ),
}
SWITCHES = ("single", "ddp", "ddp_spawn", "fsdp", "bf16-mixed", "sweep", "resume", "evaluate", "predict")
WORKS = "works"
ALL_WORK = dict.fromkeys(SWITCHES, WORKS)
CELLS: dict[tuple[str, str], str] = {
    (row, switch): outcome
    for row, outcomes in {
        "boring": ALL_WORK,
        "boring_own_data": ALL_WORK,
        "transformer": {**ALL_WORK, "evaluate": "refused: define test_step", "predict": "refused: define predict_step"},
        "resnet18": ALL_WORK,
    }.items()
    for switch, outcome in outcomes.items()
}
WORLD_SIZE = {"single": 1, "ddp": 2, "ddp_spawn": 2, "fsdp": 2, "bf16-mixed": 1, "sweep": 1}
OWN_RUN = {  # the switches whose cell is one run of its own: their overrides
    "ddp": ("trainer=ddp",),
    "ddp_spawn": ("trainer=ddp_spawn",),
    "fsdp": ("trainer=fsdp",),
    "bf16-mixed": ("trainer.precision=bf16-mixed",),
    "sweep": ("-m", "seed=1,2", "hydra.sweep.dir=sweep"),
}
TINY = ("logger=none", "trainer.max_epochs=1")


def cells(switches: tuple[str, ...]) -> list:
    """The cells of `switches` in every row, each skipped where an optional part it needs is deleted."""
    params = []
    for name, row in ROWS.items():
        for switch in switches:
            marks = [*row.marks, *([requires("fsdp")] if switch == "fsdp" else [])]
            params.append(pytest.param(name, switch, id=f"{name}-{switch}", marks=marks))
    return params


def user_directory(directory: Path, row: Row) -> Path:
    """A user's working directory for `row`: the YAML files of the zoo's modules in my_conf/, and the row's data."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copytree(FOREIGN_CONF, directory / "my_conf")
    for write_files in row.files:
        write_files(directory)
    return directory


def assert_refused(result: subprocess.CompletedProcess, fix: str) -> None:
    """Exit 2, no traceback, and last on stderr one `error:` line that names `fix`."""
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.rstrip().splitlines()[-1] == error_lines(result.stderr)[-1]
    assert fix in error_lines(result.stderr)[-1], error_lines(result.stderr)[-1]


def assert_trained(run_dir: Path, row: Row, world_size: int, epochs: int = 1, first_epoch: int = 0) -> None:
    """Every rank trained its share of each epoch (DistributedSampler's, rounded up) with finite losses."""
    ranks = histories(run_dir)
    assert [(h["rank"], h["world_size"], h["first_epoch"]) for h in ranks] == [
        (rank, world_size, first_epoch) for rank in range(world_size)
    ]
    share = -(-row.train_samples // world_size)
    assert all(h["epoch_samples"] == [share] * (epochs - first_epoch) for h in ranks), ranks
    assert all(math.isfinite(loss) for h in ranks for loss in h["step_losses"])
    assert read_json(run_dir / "results.json")["epochs"] == epochs


def check_cell(name: str, switch: str, result: subprocess.CompletedProcess, where: Path) -> None:
    """The cell's declared outcome: refused in its one line, or what the run left in `where` (a run dir, a sweep
    dir, an evaluation's output)."""
    outcome, row = CELLS[name, switch], ROWS[name]
    if outcome != WORKS:
        assert_refused(result, outcome.removeprefix("refused: "))
        return
    check_ok(result)
    if switch == "sweep":
        jobs = sorted(path for path in where.iterdir() if path.is_dir() and not path.name.startswith("."))
        assert [job.name for job in jobs] == ["0", "1"] and "Sweep: 2 job(s)" in result.stdout
        for job in jobs:
            assert_trained(job, row, 1)
    elif switch in WORLD_SIZE:
        assert_trained(where, row, WORLD_SIZE[switch])
        if switch == "bf16-mixed":
            stored = torch.load(where / "checkpoints" / "last.ckpt", weights_only=True)["config"]
            assert stored["trainer"]["precision"] == "bf16-mixed"
    elif switch == "resume":
        assert_trained(where, row, 1, epochs=2, first_epoch=1)
    elif switch == "evaluate":
        printed = dict(line.split() for line in result.stdout.splitlines() if line.startswith("test/"))
        tested = {key: value for key, value in read_json(where / "results.json").items() if key.startswith("test/")}
        shown = {key: format_value(value) for key, value in tested.items()}
        assert printed == shown, "the resumed run's own test numbers, as its results table shows them"
        assert re.search(r"^test step (\d+)/\1\b", result.stdout, flags=re.MULTILINE), "its last test batch run"
    else:
        outputs = torch.load(where / "predictions.pt", weights_only=True)
        assert outputs and all(len(output) == row.predicted for output in outputs.values()), outputs.keys()


@pytest.mark.slow
@pytest.mark.parametrize(("name", "switch"), cells(tuple(OWN_RUN)))
def test_a_cell_of_its_own_works_or_is_refused_in_one_line(name: str, switch: str, tmp_path: Path):
    cwd = user_directory(tmp_path, ROWS[name])
    result = train_own(cwd, *ROWS[name].overrides, *TINY, *OWN_RUN[switch], "hydra.run.dir=run")
    check_cell(name, switch, result, cwd / ("sweep" if switch == "sweep" else "run"))


class ChainedRuns:
    """Each row's one-process run, and its resume from that run's last.ckpt (one epoch more), each made once, when a
    cell first needs it, in a user's directory per row."""

    def __init__(self, base: Path) -> None:
        self.base, self.runs = base, {}

    def directory(self, name: str) -> Path:
        cwd = self.base / name
        return cwd if cwd.is_dir() else user_directory(cwd, ROWS[name])

    def single(self, name: str) -> subprocess.CompletedProcess:
        if (name, "single") not in self.runs:
            args = (*ROWS[name].overrides, *TINY, "hydra.run.dir=single")
            self.runs[name, "single"] = train_own(self.directory(name), *args)
        return self.runs[name, "single"]

    def resumed(self, name: str) -> subprocess.CompletedProcess:
        if (name, "resume") not in self.runs:
            check_ok(self.single(name))
            last = self.directory(name) / "single" / "checkpoints" / "last.ckpt"
            args = (*ROWS[name].overrides, *TINY, f"ckpt_path={last}", "trainer.max_epochs=2", "hydra.run.dir=resumed")
            self.runs[name, "resume"] = train_own(self.directory(name), *args)
        return self.runs[name, "resume"]


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> ChainedRuns:
    return ChainedRuns(tmp_path_factory.mktemp("zoo"))


@pytest.mark.slow
@pytest.mark.parametrize(("name", "switch"), cells(("single", "resume", "evaluate", "predict")))
def test_a_chained_cell_works_or_is_refused_in_one_line(name: str, switch: str, chain: ChainedRuns):
    """single → resume → evaluate and predict of the resumed run's last.ckpt."""
    cwd = chain.directory(name)
    if switch == "single":
        check_cell(name, switch, chain.single(name), cwd / "single")
    elif switch == "resume":
        check_cell(name, switch, chain.resumed(name), cwd / "resumed")
    else:
        check_ok(chain.resumed(name))
        last = cwd / "resumed" / "checkpoints" / "last.ckpt"
        opening = ROWS[name].opening
        result = train_own(cwd, f"ckpt_path={last}", *opening, f"hydra.run.dir={switch}", module=f"project.{switch}")
        check_cell(name, switch, result, cwd / ("resumed" if switch == "evaluate" else switch))


YOUR_CODE = REPO / "docs" / "your-code.md"


def docs_table() -> dict[tuple[str, str], str]:
    """docs/your-code.md's zoo table: (row label, column) → its cell."""
    section = YOUR_CODE.read_text().split("## Code written elsewhere\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip().strip("`") for cell in lines[0].strip("|").split("|")]
    table = {}
    for line in lines[2:]:
        label, *outcomes = (cell.strip() for cell in line.strip("|").split("|"))
        table |= {(label, column): outcome for column, outcome in zip(header[1:], outcomes, strict=True)}
    return table


def test_the_docs_table_is_the_declared_cells():
    declared = {(ROWS[name].label, switch): outcome for (name, switch), outcome in CELLS.items()}
    assert docs_table() == declared
