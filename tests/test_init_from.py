"""Starting a new run from weights (`init_from`, `init_into`, `freeze`): the tensors of a file that fit the module are
loaded before it trains, with a fresh optimizer at epoch 0, step 0, and the run says what it loaded, left and froze;
what cannot give that is one line. The user's own project (tests/csv_project.py) fine-tuned from 3 classes to 2 at the
command line, the rest in-process through `build`."""

import re
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from hydra import compose, initialize_config_dir

from project.engine.build import TrainingSetup, build
from project.engine.checkpoints import LONGEST_NAME, first_few, start_from_weights
from project.engine.errors import UserError, error_line
from project.engine.upstream import VERSION_BASE
from tests.csv_project import BackboneClassifier, write_backbone, write_png_dataset
from tests.foreign_modules import FOREIGN_CONF
from tests.helpers import CONF_DIR, REPO, check_ok, read_json, run_module

CSV_PROJECT = [f"hydra.searchpath=[file://{FOREIGN_CONF}]", "model=backbone_classifier", "data=csv_images"]
FREEZE_BACKBONE = "freeze=[backbone.*]"
ON_THE_PATH = {"PYTHONPATH": str(REPO)}  # tests.csv_project, from the run's own working directory


def csv_run(directory: Path, classes: tuple[str, ...], *overrides: str) -> list[str]:
    """The command line of one epoch of the csv project on a data set of `classes` written in `directory`."""
    root = write_png_dataset(directory / f"{len(classes)}-classes", 48, classes)
    return [*CSV_PROJECT, f"data.root={root}", "trainer.max_epochs=1", "logger=none", *overrides]


@pytest.fixture(scope="module")
def three_class_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run dir of one epoch of the csv project's classifier on 3 classes."""
    directory = tmp_path_factory.mktemp("three-classes")
    run_dir = directory / "run"
    args = csv_run(directory, ("circle", "stripe", "dot"), f"hydra.run.dir={run_dir}")
    check_ok(run_module("project.train", *args, cwd=directory, env=ON_THE_PATH))
    return run_dir


def best_of(run_dir: Path) -> Path:
    (best,) = (run_dir / "checkpoints").glob("best-*.ckpt")
    return best


@pytest.mark.slow
def test_a_two_class_run_starts_from_a_three_class_runs_best_weights_with_its_backbone_frozen(
    tmp_path: Path, three_class_run: Path
):
    best = best_of(three_class_run)
    run_dir = tmp_path / "fine-tuned"
    args = csv_run(tmp_path, ("circle", "stripe"), f"init_from={best}", "model.num_classes=2", FREEZE_BACKBONE)
    result = check_ok(run_module("project.train", *args, f"hydra.run.dir={run_dir}", cwd=tmp_path, env=ON_THE_PATH))

    before_the_config = result.stdout.split("\nConfig\n")[0].splitlines()
    assert [line for line in before_the_config if line.startswith(("init_from", "freeze"))] == [
        f"init_from={best}: loaded 2 of BackboneClassifier's 4 tensors (backbone 2 of 2, head 0 of 2); epoch 0, "
        "step 0, a fresh optimizer and schedule",
        "init_from: of another shape, left at initialisation: head.weight: file [3, 16], here [2, 16]; "
        "head.bias: file [3], here [2]",
        "freeze: 2 of 4 parameters frozen (backbone.1.weight, backbone.1.bias), 2 train",
    ]
    trained = torch.load(best, weights_only=True)["state_dict"]
    last = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    for name in ("backbone.1.weight", "backbone.1.bias"):  # loaded at step 0, and frozen since
        assert torch.equal(last["state_dict"][name], trained[name])
    assert list(last["state_dict"]["head.weight"].shape) == [2, 16]
    # 24 training images in batches of 8: one epoch counted from epoch 0, step 0, not on from the file's.
    assert (last["epoch"], last["global_step"]) == (0, 3)
    assert read_json(run_dir / "results.json")["epochs"] == 1
    assert last["config"]["init_from"] == str(best)


def build_csv_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *overrides: str) -> TrainingSetup:
    """`build` of the csv project on 2 classes, in this process."""
    monkeypatch.setenv("PL_GLOBAL_SEED", "0")  # build seeds; later tests in this process must not inherit it
    args = csv_run(tmp_path, ("circle", "stripe"), "model.num_classes=2", *overrides, f"run_dir={tmp_path}")
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        return build(compose("train", overrides=args), tmp_path / "outputs")


def refusal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *overrides: str) -> str:
    with pytest.raises(UserError) as raised:
        build_csv_project(tmp_path, monkeypatch, *overrides)
    return error_line(raised.value)


def test_a_backbones_pth_without_the_prefix_loads_into_the_submodule_init_into_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
):
    pth = write_backbone(tmp_path / "backbone.pth")  # keys 1.weight, 1.bias
    module = build_csv_project(tmp_path, monkeypatch, f"init_from={pth}", "init_into=backbone").module
    file = torch.load(pth, weights_only=True)
    assert torch.equal(module.backbone[1].weight, file["1.weight"]) and torch.equal(
        module.backbone[1].bias, file["1.bias"]
    )
    assert capsys.readouterr().out.splitlines()[:2] == [
        f"init_from={pth}: loaded 2 of BackboneClassifier's 4 tensors (backbone 2 of 2, head 0 of 2); epoch 0, step 0, "
        "a fresh optimizer and schedule",
        "init_from: not in the file, left at initialisation: head.weight; head.bias",
    ]


@pytest.mark.parametrize("layout", ["bare", "state_dict", "model"])
def test_a_pth_of_a_bare_state_dict_or_one_under_state_dict_or_model_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str
):
    torch.manual_seed(5)
    weights = BackboneClassifier(num_classes=2).state_dict()
    path = tmp_path / "weights.pth"
    torch.save(weights if layout == "bare" else {layout: weights, "epoch": 7}, path)
    module = build_csv_project(tmp_path, monkeypatch, f"init_from={path}").module
    assert all(torch.equal(value, weights[name]) for name, value in module.state_dict().items())


def test_a_sharded_checkpoint_loads_its_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    torch.manual_seed(5)
    weights = BackboneClassifier(num_classes=2).state_dict()
    sharded = tmp_path / "last.ckpt"  # as trainer=fsdp writes one: DCP's shards and index, meta.pt with the rest
    dcp.save({"state_dict": weights}, checkpoint_id=sharded, no_dist=True)
    torch.save({"epoch": 0, "global_step": 3}, sharded / "meta.pt")
    module = build_csv_project(tmp_path, monkeypatch, f"init_from={sharded}").module
    assert all(torch.equal(value, weights[name]) for name, value in module.state_dict().items())


@pytest.mark.parametrize(
    "patterns, frozen, line",
    [
        (
            "[backbone.*.weight,head.bias]",
            {"backbone.1.weight", "head.bias"},
            "2 of 4 parameters frozen (backbone.1.weight, head.bias), 2 train",
        ),
        ("[head.bias]", {"head.bias"}, "1 of 4 parameters frozen (head.bias), 3 train"),
    ],
)
def test_freeze_stops_training_the_parameters_its_patterns_match(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    patterns: str,
    frozen: set,
    line: str,
):
    """The line counts what is frozen and what trains (1 of 4: 2 of 4 would read alike with `4 // 2` trained)."""
    module = build_csv_project(tmp_path, monkeypatch, f"freeze={patterns}").module
    assert {name for name, p in module.named_parameters() if not p.requires_grad} == frozen
    assert f"freeze: {line}" in capsys.readouterr().out


def test_names_read_from_a_file_are_cut_to_the_longest_shown_and_the_others_counted():
    """A weight's name in a file may be any string: a line shows the first three, each cut to `LONGEST_NAME`
    characters (the last three of them dots), and how many it left out."""
    longest = "w" * LONGEST_NAME
    assert first_few([longest + "w", "a", "b", "c", "d", "e"]) == f"{longest[:-3]}..., a, b and 3 more"
    assert first_few([longest]) == longest


def test_a_run_that_resumes_its_own_checkpoint_loads_not_init_from_over_it(tmp_path: Path, capsys):
    """A requeued or restarted run resumes its own last.ckpt (ckpt_path null): Lightning restores those weights."""
    module = BackboneClassifier(num_classes=2)
    before = {name: value.clone() for name, value in module.state_dict().items()}
    start_from_weights(module, str(tmp_path / "nowhere.pth"), None, resumes="run/checkpoints/last.ckpt")
    assert all(torch.equal(value, before[name]) for name, value in module.state_dict().items())
    assert "not loaded, this run resumes its own checkpoint run/checkpoints/last.ckpt" in capsys.readouterr().out


class WritesWhenUnpickled:
    """A pickled object that, where a reader unpickled it, would create `sentinel`."""

    def __init__(self, sentinel: Path) -> None:
        self.sentinel = sentinel

    def __reduce__(self):
        return (Path.touch, (self.sentinel,))


def test_a_file_of_pickled_objects_is_one_line_and_nothing_of_it_runs(tmp_path: Path, monkeypatch):
    sentinel = tmp_path / "ran"
    path = tmp_path / "hostile.pth"
    torch.save({"state_dict": {"head.weight": WritesWhenUnpickled(sentinel)}}, path)
    assert refusal(tmp_path, monkeypatch, f"init_from={path}").startswith(
        f"error: init_from={path} is not a file torch.load reads as data (damaged, another kind of file, or one that "
        "holds pickled objects, which are never loaded)"
    )
    assert not sentinel.exists()


REFUSALS = {
    "resume and start": (
        ["ckpt_path=runs/last.ckpt", "init_from=runs/best.ckpt"],
        "error: ckpt_path=runs/last.ckpt resumes a run (its weights, optimizer, schedule, epoch and step) and "
        "init_from=runs/best.ckpt starts a new one from weights: give one of them",
    ),
    "a URL": (["init_from=https://example.com/w.pth"], "error: init_from=https://example.com/w.pth is a URL"),
    "no such file": (["init_from={tmp}/none.pth"], "error: init_from={tmp}/none.pth: no such file"),
    "no tensors": (["init_from={tmp}/notes.pth"], "error: init_from={tmp}/notes.pth holds no tensors by name (a dict"),
    "nothing matches": (
        ["init_from={tmp}/backbone.pth"],
        "error: init_from={tmp}/backbone.pth: none of its 2 tensors (1.weight, 1.bias) is one of BackboneClassifier's "
        "(backbone.1.weight, backbone.1.bias, head.weight and 1 more) by name and shape",
    ),
    "not a submodule": (
        ["init_from={tmp}/backbone.pth", "init_into=trunk"],
        "error: init_into=trunk is not a submodule of BackboneClassifier (its submodules: backbone, head)",
    ),
    "freeze matches nothing": (
        ["freeze=[encoder.*]"],
        "error: freeze=encoder.* matches none of BackboneClassifier's 4 parameters (backbone.1.weight, "
        "backbone.1.bias, head.weight and 1 more): give patterns of their names, such as backbone.*",
    ),
    "freeze leaves nothing to train": (["freeze=[*]"], "error: freeze=['*'] freezes all 4 parameters"),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_what_cannot_start_a_run_from_weights_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str):
    overrides, line = REFUSALS[case]
    write_backbone(tmp_path / "backbone.pth")
    torch.save({"state_dict": {"note": "no weights"}, "epoch": 1}, tmp_path / "notes.pth")
    overrides = [override.replace("{tmp}", str(tmp_path)) for override in overrides]
    assert refusal(tmp_path, monkeypatch, *overrides).startswith(line.replace("{tmp}", str(tmp_path)))


def test_names_read_from_the_file_are_printed_escaped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
):
    path = tmp_path / "weights.pth"
    torch.save({"backbone.1.weight": torch.zeros(16, 64), "\x1b[2Jhead.weight": torch.zeros(2, 16)}, path)
    build_csv_project(tmp_path, monkeypatch, f"init_from={path}")
    out = capsys.readouterr().out
    assert "\x1b" not in out and "init_from: in the file, not used: \\x1b[2Jhead.weight" in out
    assert re.search(r"loaded 1 of BackboneClassifier's 4 tensors \(backbone 1 of 2, head 0 of 2\)", out), out
