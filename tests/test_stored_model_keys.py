"""`project.evaluate` and `project.predict` rebuild a checkpoint's model from its stored config, where `+model.<key>=`
changes a key of it as `data.<key>=` changes one of its data (a file its constructor reads that has moved); a stored
path that is no longer there is named in one line with the key that points elsewhere."""

import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from project.engine.errors import UserError
from project.engine.trained_run import missing_file_given_by, with_model_given
from tests.csv_project import write_backbone, write_png_dataset
from tests.helpers import check_ok, error_lines, train_own

STORED_MODEL = {"_target_": "tests.csv_project.BackboneClassifier", "num_classes": 3, "backbone_weights": "/old.pth"}


@pytest.mark.slow
def test_a_checkpoint_whose_backbone_file_moved_names_the_key_and_opens_with_it(user_dir: Path):
    """The csv project trained on a backbone file, which then moves: evaluate names the stored key and its path, and
    evaluates with `+model.backbone_weights=<where it is now>`."""
    weights = write_backbone(user_dir / "pretrained" / "bb.pth")
    trained = (
        "model=backbone_classifier",
        "data=csv_images",
        f"data.root={write_png_dataset(user_dir / 'pngs', 24)}",
        f"model.backbone_weights={weights}",
        "optimized_metric=val/acc",
        "trainer.max_epochs=1",
        "logger=none",
        "hydra.run.dir=outputs/csv",
    )
    check_ok(train_own(user_dir, *trained))
    moved = shutil.move(weights, user_dir / "bb-moved.pth")
    last = user_dir / "outputs" / "csv" / "checkpoints" / "last.ckpt"

    refused = train_own(user_dir, f"ckpt_path={last}", module="project.evaluate")
    assert refused.returncode == 2
    assert error_lines(refused.stderr) == [
        f"error: ckpt_path={last}: its stored model.backbone_weights={weights}: no such file (moved, or trained on "
        "another machine): give +model.backbone_weights=<where it is now>"
    ]
    evaluated = check_ok(train_own(user_dir, f"ckpt_path={last}", f"+model.backbone_weights={moved}",
                                   module="project.evaluate"))  # fmt: skip
    accuracy = float(next(line.split()[1] for line in evaluated.stdout.splitlines() if line.startswith("test/acc")))
    assert 0 <= accuracy <= 1


def test_a_model_key_given_replaces_the_stored_one_and_a_key_it_lacks_is_refused():
    given = OmegaConf.create({"model": {"backbone_weights": "/new.pth"}})
    rebuilt = with_model_given(given, OmegaConf.create(STORED_MODEL))
    assert OmegaConf.to_container(rebuilt) == {**STORED_MODEL, "backbone_weights": "/new.pth"}
    misspelt = OmegaConf.create({"model": {"backbone_weight": "/new.pth"}})
    with pytest.raises(UserError) as refused:
        with_model_given(misspelt, OmegaConf.create(STORED_MODEL))
    assert str(refused.value) == (
        "model.backbone_weight: the checkpoint's model (tests.csv_project.BackboneClassifier) has no such key; it has "
        "num_classes, backbone_weights"
    )


@pytest.mark.parametrize(
    ("where", "given"),
    [
        ("model.backbone_weights", "+model.backbone_weights"),
        ("model.root", "+model.root"),  # a model's key of the same name as the data config's
        ("data.root", "data.root"),  # a key of the data config the command line composes: no plus
        ("data.labels_file", "+data.labels_file"),
    ],
)
def test_a_stored_path_that_is_gone_is_named_with_the_override_that_points_elsewhere(where: str, given: str):
    """The key whose value is the missing file, found among paths that sort before it, and the override that gives it
    a new value; the file's name as the constructor built it (`str(Path(value))`, an equal string, not the same)."""
    missing = "/data/moved/file"
    config = {
        "model": {"_target_": "my_project.Model", "backbone_weights": "/a", "root": "/a", "network": {"size": 3}},
        "data": {"_target_": "my_project.Data", "root": "/a", "labels_file": "/a"},
    }
    group, key = where.split(".")
    config[group][key] = missing
    cfg = OmegaConf.create({"ckpt_path": "run/last.ckpt", "data": {"root": "/elsewhere"}})
    error = RuntimeError("building the model failed")
    error.__cause__ = FileNotFoundError(2, "No such file or directory", str(Path(missing)))
    assert str(missing_file_given_by(error, cfg, config)) == (
        f"ckpt_path=run/last.ckpt: its stored {where}={missing}: no such file (moved, or trained on another machine): "
        f"give {given}=<where it is now>"
    )
