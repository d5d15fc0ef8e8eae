"""A Lightning checkpoint this project did not write (a plain `Trainer.save_checkpoint`, from before the template):
`project.evaluate`, `project.predict` and `project.train ckpt_path=` take it with the `model=`/`data=` given, load
it strictly, and name in one line the keys that do not fit, or the choices it needs."""

import csv
import json
import re
from pathlib import Path

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from project.engine import trusted_targets
from project.engine.checkpoints import load_lightning_checkpoint
from project.engine.errors import UserError
from project.engine.reports import format_value
from project.engine.trained_run import confinement_of, prepares_within, rebuild_from_stored_config, rebuild_trained
from project.engine.trusted_targets import TrustedTargets
from project.engine.upstream import VERSION_BASE
from project.example.data import ToyDataModule
from tests.foreign_modules import RegressionData, RegressionModule
from tests.helpers import (
    CONF_DIR,
    REGRESSION,
    check_ok,
    error_lines,
    run_module,
    train_own,
    untrained_toy_checkpoint,
)

TOY = ("model=toy", "data=toy")


@pytest.fixture(scope="module")
def foreign(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    """(a checkpoint of one epoch of the toy, written by plain Lightning, with no config of this project's; the test
    accuracy its weights give in-process)."""
    directory = tmp_path_factory.mktemp("before-the-template")
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        cfg = compose("train", overrides=[*TOY, f"run_dir={directory}"])
    L.seed_everything(cfg.seed)
    module, datamodule = instantiate(cfg.model), instantiate(cfg.data)
    trainer = L.Trainer(
        max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False, default_root_dir=directory
    )
    trainer.fit(module, datamodule=datamodule)
    path = directory / "before.ckpt"
    trainer.save_checkpoint(path)
    trainer.test(module, datamodule=datamodule, verbose=False)
    return path, trainer.callback_metrics["test/acc"].item()


def one_error_line(result) -> str:
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    (line,) = error_lines(result.stderr)
    assert result.stderr.rstrip().endswith(line)
    return line


@pytest.mark.slow
def test_evaluate_and_predict_take_a_foreign_checkpoint_with_the_model_and_data_given(tmp_path: Path, foreign):
    path, accuracy = foreign
    evaluated = check_ok(run_module("project.evaluate", f"ckpt_path={path}", *TOY, cwd=tmp_path))
    (printed,) = re.findall(r"^test/acc\s+(\S+)$", evaluated.stdout, flags=re.MULTILINE)
    assert printed == format_value(accuracy)

    predicted = check_ok(run_module("project.predict", f"ckpt_path={path}", *TOY, cwd=tmp_path))
    (run_dir,) = re.findall(r"^run dir: (\S+)", predicted.stdout, flags=re.MULTILINE)
    with (Path(run_dir) / "predictions.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert len(rows) == 2  # the toy's two test points
    assert sum(row["label"] == row["predicted"] for row in rows) / len(rows) == accuracy


@pytest.mark.slow
def test_train_resumes_a_foreign_checkpoint_and_its_own_checkpoints_then_refuse_model_and_data(tmp_path: Path, foreign):
    """Lightning restores the epoch, step and optimizer; the run's own checkpoint then stores its config, which
    evaluate rebuilds from, refusing a `model=` that it would not use."""
    path, _ = foreign
    run = tmp_path / "resumed"
    result = check_ok(
        run_module(
            "project.train",
            f"ckpt_path={path}",
            *TOY,
            "trainer.max_epochs=2",
            f"hydra.run.dir={run}",
            cwd=tmp_path,
        )
    )
    assert "Restored all states from the checkpoint" in result.stderr
    results = json.loads((run / "results.json").read_text())
    assert results["epochs"] == 2

    own = run / "checkpoints" / "last.ckpt"
    check_ok(run_module("project.evaluate", f"ckpt_path={own}", cwd=tmp_path))
    line = one_error_line(run_module("project.evaluate", f"ckpt_path={own}", "model=toy", cwd=tmp_path))
    assert f"ckpt_path={own} stores the config" in line and "leave out model=" in line


@pytest.mark.slow
def test_a_foreign_checkpoint_of_your_own_module_is_taken_with_your_options(user_dir: Path):
    """Your own module and data, their options in your `hydra.searchpath` dir: evaluated, predicted and resumed."""
    L.seed_everything(123)
    module, datamodule = RegressionModule(), RegressionData(batch_size=8, seed=123)
    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(module, datamodule=datamodule)
    path = user_dir / "regression-before.ckpt"
    trainer.save_checkpoint(path)
    trainer.test(module, datamodule=datamodule, verbose=False)
    mse = trainer.callback_metrics["test/mse"].item()

    mine = ("model=regression", "data=regression")
    evaluated = check_ok(train_own(user_dir, f"ckpt_path={path}", *mine, module="project.evaluate"))
    (printed,) = re.findall(r"^test/mse\s+(\S+)$", evaluated.stdout, flags=re.MULTILINE)
    assert float(printed) == pytest.approx(mse, abs=5e-5), "4 decimals"
    predict_dir = user_dir / "outputs" / "predict-before"
    check_ok(train_own(user_dir, f"ckpt_path={path}", *mine, f"hydra.run.dir={predict_dir}", module="project.predict"))
    rows = (predict_dir / "predictions.csv").read_text().splitlines()
    assert rows[0] == "index,output" and len(rows) == 1 + 16, "what predict_step returned, for every test point"
    run = user_dir / "outputs" / "resumed-before"
    check_ok(train_own(user_dir, f"ckpt_path={path}", *REGRESSION, "trainer.max_epochs=2", f"hydra.run.dir={run}"))
    assert json.loads((run / "results.json").read_text())["epochs"] == 2


@pytest.mark.slow
@pytest.mark.parametrize(
    ("program", "overrides", "named"),
    [
        (
            "project.evaluate",
            ("model=mnist_mlp", "data=toy"),
            "missing: network.layers.1.weight, network.layers.1.bias",
        ),
        (
            "project.predict",
            ("model=mnist_mlp", "data=toy"),
            "unexpected: network.layers.4.weight, network.layers.4.bias",
        ),
        (
            "project.train",
            (*TOY, "model.network.num_outputs=3", "trainer.max_epochs=2"),
            "of another shape: network.layers.4.weight [2, 20] (the module's [3, 20])",
        ),
    ],
)
def test_a_foreign_checkpoint_into_another_module_is_one_line_naming_its_keys(
    tmp_path: Path, foreign, program: str, overrides: tuple[str, ...], named: str
):
    path, _ = foreign
    result = run_module(program, f"ckpt_path={path}", *overrides, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    line = one_error_line(result)
    assert f"ckpt_path={path}: its weights do not fit ClassifierModule" in line and named in line
    assert "give the model= (and model.<key>=) that trained it" in line
    assert not (tmp_path / "run" / "checkpoints").exists(), "refused before anything trained"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("program", "overrides", "asked"),
    [
        ("project.evaluate", (), "give model=<option> and data=<option>"),
        ("project.predict", ("model=toy",), "give data=<option>"),
    ],
)
def test_a_foreign_checkpoint_without_model_or_data_names_what_to_give(
    tmp_path: Path, foreign, program: str, overrides: tuple[str, ...], asked: str
):
    path, _ = foreign
    line = one_error_line(run_module(program, f"ckpt_path={path}", *overrides, cwd=tmp_path))
    assert f"ckpt_path={path} is a Lightning checkpoint this project did not write" in line
    assert "holds weights, a state_dict, but no config" in line and asked in line


@pytest.mark.parametrize(
    ("content", "told"),
    [
        ({"weight": torch.zeros(2, 2)}, "holds a network's weights only (a bare state_dict)"),
        ({"epoch": 3, "model": {}}, "is not a checkpoint of this project (it holds epoch, model: no state_dict"),
        ([torch.zeros(2)], "is not a checkpoint of this project (it holds a list, no state_dict of weights)"),
        (torch.zeros(2), "is not a checkpoint of this project (it holds a Tensor, no state_dict of weights)"),
    ],
    ids=["bare-state-dict", "other-keys", "list", "tensor"],
)
def test_a_file_torch_reads_that_is_no_lightning_checkpoint_is_named_by_what_it_holds(
    tmp_path: Path, content: object, told: str
):
    path = tmp_path / "saved.pt"
    torch.save(content, path)
    with pytest.raises(UserError) as refused:
        load_lightning_checkpoint(path, TrustedTargets.of({}))
    assert str(refused.value).startswith(f"ckpt_path={path} {told}")
    assert str(refused.value).endswith(
        "give a checkpoint project.train wrote (<run dir>/checkpoints/last.ckpt), "
        "or one of Lightning's Trainer.save_checkpoint"
    )


def rebuilt_for_evaluate(*overrides: str) -> tuple:
    """The data module and module `project.evaluate` rebuilds from the checkpoint `overrides` name."""
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        return rebuild_trained(compose("evaluate", overrides=list(overrides)), "evaluate")


def test_a_data_modules_state_stored_in_the_checkpoint_is_restored_where_its_run_is_rebuilt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """evaluate and predict rebuild the data module as it trained: the state Lightning stored under its class's name
    (a vocabulary, a normalisation) is loaded into it."""
    checkpoint = untrained_toy_checkpoint(tmp_path)
    stored = torch.load(checkpoint, weights_only=True)
    stored["ToyDataModule"] = {"vocabulary": ["circle", "stripe"]}
    torch.save(stored, checkpoint)
    loaded = []
    monkeypatch.setattr(ToyDataModule, "load_state_dict", lambda self, state: loaded.append(state), raising=False)
    datamodule, _ = rebuilt_for_evaluate(f"ckpt_path={checkpoint}")
    assert isinstance(datamodule, ToyDataModule) and loaded == [{"vocabulary": ["circle", "stripe"]}]


@pytest.mark.parametrize(
    ("given", "may_connect"),
    [([], False), (["data.download=true"], True), (["data.download=1"], False), (["data=mnist"], False)],
)
def test_building_a_checkpoints_stored_config_connects_out_only_where_the_command_line_says_download_true(
    given: list[str], may_connect: bool
):
    """A download is the user's to allow, in the words of the config (`true`) given as a key of the checkpoint's data,
    never the checkpoint's own, nor a data config chosen whole (`data=mnist`, which says `download: true` itself)."""
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        cfg = compose("evaluate", overrides=["ckpt_path=last.ckpt", *given])
    assert confinement_of(cfg).may_connect is may_connect


def test_a_rebuilt_data_modules_prepare_data_and_setup_run_inside_the_confinement(tmp_path: Path):
    """Lightning calls them as the run starts, after the build: they are where a data module fetches and unpacks its
    files, so the net that watched its construction watches them too."""
    seen = []

    class Data:
        def prepare_data(self) -> None:
            seen.append(trusted_targets.ACTIVE_CONFINEMENT)

        def setup(self, stage: str) -> None:
            seen.append(trusted_targets.ACTIVE_CONFINEMENT)

    data, confinement = Data(), trusted_targets.Confinement("ckpt_path=x", (tmp_path,), False, "fix")
    prepares_within(confinement, data)
    data.prepare_data()
    data.setup("test")
    assert seen == [confinement, confinement] and trusted_targets.ACTIVE_CONFINEMENT is None


def test_evaluate_and_predict_prepare_the_rebuilt_data_inside_the_confinement_through_its_own_hooks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The rebuilt data module's and module's `prepare_data` and `setup` are confined, and still stand as the
    hooks they wrap (their names, for Lightning's and the user's own checks)."""
    seen = []
    monkeypatch.setattr(ToyDataModule, "prepare_data", lambda self: seen.append(trusted_targets.ACTIVE_CONFINEMENT))
    checkpoint = untrained_toy_checkpoint(tmp_path)
    datamodule, module = rebuilt_for_evaluate(f"ckpt_path={checkpoint}")
    datamodule.prepare_data()
    assert isinstance(seen[0], trusted_targets.Confinement) and trusted_targets.ACTIVE_CONFINEMENT is None
    assert (datamodule.setup.__name__, module.prepare_data.__name__) == ("setup", "prepare_data")


def test_a_data_key_the_checkpoints_data_lacks_is_refused_naming_the_first_and_the_keys_it_has(tmp_path: Path):
    checkpoint = untrained_toy_checkpoint(tmp_path)
    given = [f"ckpt_path={checkpoint}", "+data.zzz=1", "+data.nope=1"]
    with pytest.raises(UserError) as refused:
        rebuilt_for_evaluate(*given)
    said = str(refused.value)
    assert said.startswith("data.nope: the checkpoint's data (project.example.data.ToyDataModule) has no such key")
    assert said.split("; it has ")[1].startswith("batch_size, drop_last, seed, folds"), said


@pytest.mark.parametrize(
    ("stored", "said"),
    [
        ({"model": {"_target_": "my_project.Model"}}, "its stored config has no data to rebuild"),
        ({"data": {"_target_": "my_project.Data"}}, "its stored config has no model to rebuild"),
        ({}, "its stored config has no data to rebuild"),
        ({"data": {}, "model": {"_target_": "my_project.Model"}}, "data.a: the run of ckpt_path=x had no data module"),
    ],
    ids=["no-data", "no-model", "neither", "data=none"],
)
def test_a_stored_config_lacking_what_to_rebuild_is_refused_naming_the_first_part_missing(stored: dict, said: str):
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        cfg = compose("evaluate", overrides=["ckpt_path=x", "+data.b=1", "+data.a=2"])
    with pytest.raises(UserError, match=re.escape(said)):
        rebuild_from_stored_config(cfg, stored)
