"""Every option of every config group composes and builds as `project.train` builds it (no training), and the
files say what they hold."""

import contextlib
import logging
import os
import re
import shutil
import sys
import typing
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.conf import ConfigSourceInfo
from hydra.utils import instantiate
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.pytorch.callbacks import ProgressBar
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationKeyError

import project  # noqa: F401  (registers the ${launch_dir:} resolver)
from project.engine import config
from project.engine.build import build, instantiate_group
from project.engine.config import (
    check_a_search_is_a_sweep,
    check_added_keys,
    check_config,
    check_launched_on_every_node,
    command_line_overrides,
    config_source_arguments,
    fits,
    give,
    give_hints,
    mistyped_value,
    switched_on,
    taken_arguments,
)
from project.engine.errors import UserError, error_line, find_user_error
from project.engine.upstream import VERSION_BASE
from tests.foreign_modules import FOREIGN_CONF
from tests.helpers import CONF_DIR, SRUN_TASK_ZERO, held_by_hydra

GROUPS = sorted(path.name for path in CONF_DIR.iterdir() if path.is_dir() and path.name != "hydra")
NEEDS_GPU = {("trainer", "gpu")}
# What an option needs beside it to build: data=none, a module that serves its own batches (Lightning's BoringModel).
COMPANIONS = {("data", "none"): [f"hydra.searchpath=[file://{FOREIGN_CONF}]", "model=boring"]}


def kept_in(tmp_path: Path) -> list[str]:
    """Overrides that keep a composed config's run dir, and Hydra's run and sweep dirs, in `tmp_path`: resolving
    Hydra's own dirs claims them (`${launch_dir:}`), which would make directories under the repository's outputs/."""
    return [f"run_dir={tmp_path}", f"hydra.run.dir={tmp_path}/run", f"hydra.sweep.dir={tmp_path}/sweep"]


def options(group: str) -> list[str]:
    return sorted(path.stem for path in (CONF_DIR / group).glob("*.yaml"))


def compose_train(tmp_path: Path, *overrides: str):
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        return compose("train", overrides=[*overrides, f"run_dir={tmp_path}"])


@pytest.mark.parametrize(("group", "option"), [(g, o) for g in GROUPS for o in options(g)])
def test_every_option_composes_and_builds(tmp_path: Path, group: str, option: str, monkeypatch: pytest.MonkeyPatch):
    if (group, option) in NEEDS_GPU and not torch.cuda.is_available():
        pytest.skip(f"{group}={option} needs a CUDA GPU to instantiate")
    cfg = compose_train(tmp_path, f"{group}={option}", *COMPANIONS.get((group, option), []))
    if cfg.trainer.num_nodes > 1:  # as task 0 of an srun job builds it (outside one it is refused)
        for name, value in SRUN_TASK_ZERO.items():
            monkeypatch.setenv(name, value)
    for name in ("PL_GLOBAL_SEED", "PL_SEED_WORKERS"):  # build seeds; later tests in this process must not inherit it
        monkeypatch.setenv(name, "0")
    if group == "logger":  # logger=mlflow opens its store (outputs/mlflow.db under the working directory) when built
        monkeypatch.chdir(tmp_path)
    setup = build(cfg, tmp_path / "outputs")
    if (group, option) == ("data", "none"):
        assert setup.datamodule is None
    else:
        assert setup.datamodule.batch_size == cfg.data.batch_size
    assert sum(p.numel() for p in setup.module.parameters()) > 0
    assert setup.trainer.max_epochs == (1 if setup.trainer.fast_dev_run else cfg.trainer.max_epochs)


def test_experiment_mnist_is_the_tutorial_recipe(tmp_path: Path):
    cfg = compose_train(tmp_path, "experiment=mnist")
    assert cfg.model.network._target_ == "project.example.networks.DeepNeuralNetwork"
    assert (cfg.model.network.num_layers, cfg.model.network.input_features) == (4, 784)
    assert (cfg.model.network.num_hidden_features, cfg.model.network.num_classes) == (128, 10)
    assert cfg.model.optimizer._target_ == "torch.optim.Adam" and cfg.data.batch_size == 128


def test_default_is_the_toy_tutorial(tmp_path: Path):
    cfg = compose_train(tmp_path)
    assert cfg.seed == 123 and cfg.data.batch_size == 2 and cfg.trainer.max_epochs == 3
    assert cfg.model.optimizer._target_ == "torch.optim.SGD" and cfg.model.optimizer.lr == 0.5


def test_dataset_choice_survives_the_experiment(tmp_path: Path):
    cfg = compose_train(tmp_path, "experiment=mnist", "data=fashion_mnist")
    assert cfg.data.name == "fashion_mnist" and cfg.data.batch_size == 128


def listed_options() -> dict[str, set[str]]:
    """`- data: toy  # which data: toy | mnist | ...; parts: image_folder`: the options train.yaml tells a reader to
    pick from, those of the optional parts (which may be gone) left out."""
    listed = {}
    for line in (CONF_DIR / "train.yaml").read_text().splitlines():
        match = re.match(r"\s*- (\w+): \w+\s*#[^:;]*: ([^;]*)", line)
        if match:
            listed[match[1]] = set(re.findall(r"\w+", match[2]))
    return listed


def test_every_option_train_yaml_lists_is_a_file_that_says_what_it_is():
    """The lists name only options that exist, and each listed file starts with a comment saying what it holds.

    Files a user adds to conf/ need neither (the lists are the template's documentation, not a registry)."""
    listed = listed_options()
    assert set(listed) >= {"data", "model", "trainer", "logger", "callbacks", "experiment", "debug"}
    for group, names in listed.items():
        missing = names - set(options(group))
        assert not missing, f"{group}: listed but missing: {sorted(missing)}"
        names &= set(options(group))
        headless = [
            name for name in sorted(names) if not (CONF_DIR / group / f"{name}.yaml").read_text().startswith("#")
        ]
        assert not headless, f"{group}: {headless} start without a comment"


def test_a_users_own_option_in_conf_composes_without_editing_train_yaml(tmp_path: Path):
    """The README lets a user drop a YAML into a group of conf/: it is picked by name, unlisted and headerless."""
    user_conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, user_conf)
    (user_conf / "data" / "mine.yaml").write_text("defaults:\n  - toy\nbatch_size: 1\n")
    with initialize_config_dir(str(user_conf), **VERSION_BASE):
        cfg = compose("train", overrides=["data=mine", f"run_dir={tmp_path}"])
    assert cfg.data.batch_size == 1 and cfg.data._target_ == compose_train(tmp_path).data._target_


def test_a_value_that_refers_to_a_key_the_config_lacks_is_one_line_naming_both(tmp_path: Path):
    cfg = compose_train(tmp_path, "data.batch_size=${oops.size}")
    with pytest.raises(InterpolationKeyError) as raised:
        check_config(cfg)
    assert error_line(raised.value) == (
        "error: data.batch_size: Interpolation key 'oops.size' not found: point the ${...} at a key the config has "
        "(--cfg job prints the config unresolved), or give the value itself"
    )


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (["optimized_mode=up"], "error: optimized_mode must be min or max, got 'up'"),
        (["results_from=first"], "error: results_from must be last or best, got 'first'"),
        (
            ["results_from=best", "callbacks=none"],
            "error: results_from=best needs the best checkpoint, which only callbacks=default saves: use "
            "callbacks=default, or results_from=last",
        ),
        (
            ["results_from=best", "debug=fast"],
            "error: trainer.fast_dev_run (debug=fast) saves no checkpoint, so results_from=best has none: add "
            "results_from=last",
        ),
    ],
)
def test_how_the_results_are_picked_is_checked_in_one_line_saying_what_is_allowed(
    tmp_path: Path, overrides: list[str], line: str
):
    cfg = compose_train(tmp_path, *overrides)
    with pytest.raises(UserError) as raised:
        check_config(cfg)
    assert error_line(raised.value) == line


@pytest.mark.parametrize(
    ("overrides", "refused"),
    [
        (["trainer.devices=-1"], None),
        (["trainer.devices=-2"], "trainer.devices must be a positive number of devices (or -1 for all), got -2"),
        (["trainer.devices=0"], "trainer.devices must be a positive number of devices (or -1 for all), got 0"),
        (["trainer.strategy=auto"], None),
        (["trainer.strategy=ddp"], None),
        (["trainer.strategy=abc"], "trainer.strategy='abc' is not a known strategy: pick a trainer config"),
    ],
)
def test_a_count_of_devices_and_a_strategy_name_are_checked_before_lightning_reads_them(
    tmp_path: Path, overrides: list[str], refused: str | None
):
    """-1 is every device; a name is `auto` or one of Lightning's registry (an unknown one fails deep inside it)."""
    cfg = compose_train(tmp_path, *overrides)
    if refused is None:
        check_config(cfg)
        return
    with pytest.raises(UserError, match="^" + re.escape(refused)):
        check_config(cfg)


@pytest.mark.parametrize(
    ("mode", "rank", "typed", "sweeper", "refused"),
    [
        ("RUN", "0", [], "optuna", True),
        ("MULTIRUN", "0", [], "optuna", False),
        ("RUN", "1", [], "optuna", False),
        ("RUN", "0", ["hydra.mode=RUN"], "optuna", False),
        ("RUN", "0", [], "basic", False),
    ],
    ids=["one-run", "a-sweeps-job", "rank-1", "one-trial-re-run", "no-search"],
)
def test_a_search_chosen_for_one_run_is_refused_by_rank_zero_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, rank: str, typed: list[str], sweeper: str, refused: bool
):
    """A sweeper without `-m` would train once: refused, on rank 0 (which speaks for the run), unless `hydra.mode=RUN`
    is typed (one trial re-run with its search's settings); a sweep's job, or the basic sweeper, is no such case."""
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        cfg = compose("train", overrides=[f"run_dir={tmp_path}"], return_hydra_config=True)
    cfg.hydra.runtime.choices["hydra/sweeper"] = sweeper
    cfg.hydra.mode = mode
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setattr(sys, "argv", ["project/train.py", *typed])
    said = r"^hydra/sweeper=optuna runs a search, a sweep of runs, .*add -m"
    with held_by_hydra(cfg), pytest.raises(UserError, match=said) if refused else contextlib.nullcontext():
        check_a_search_is_a_sweep()


@pytest.mark.parametrize(
    ("seed", "refused"), [(0, False), (2**32 - 1, False), (2**32, True), (2**33, True), (-1, True)]
)
def test_a_seed_is_an_integer_that_fits_32_bits(tmp_path: Path, seed: int, refused: bool):
    """The seeds numpy and the loader workers take: from 0 to 2**32 - 1."""
    cfg = compose_train(tmp_path, f"seed={seed}")
    if refused:
        with pytest.raises(UserError, match=rf"^seed must be an integer from 0 to 2\*\*32 - 1, got {seed}$"):
            check_config(cfg)
    else:
        check_config(cfg)


def test_a_process_a_run_starts_is_given_its_config_name_and_the_config_dirs_of_its_command_line_alone(
    tmp_path: Path,
):
    """A DDP rank or the reference path composes what its launcher composed: `--config-dir` is where the user's own
    configs came from; Hydra's own, the main conf dir, the search path and a plugin's find their way by themselves."""
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        cfg = compose("train", overrides=[f"hydra.searchpath=[file://{tmp_path}]"], return_hydra_config=True)
    for provider, path in (("command-line", "/my/conf"), ("a-plugin", "/plugin/conf")):
        cfg.hydra.runtime.config_sources.append(ConfigSourceInfo(path=path, schema="file", provider=provider))
    with held_by_hydra(cfg):
        assert config_source_arguments() == ["--config-name=train", "--config-dir=/my/conf"]


@pytest.mark.parametrize(
    ("nodes", "environment", "refused"),
    [(1, {}, False), (2, {}, True), (2, {"LOCAL_RANK": "0"}, False)],
    ids=["one-node", "two-nodes-nothing-starts-them", "two-nodes-started-outside"],
)
def test_more_than_one_node_is_refused_where_nothing_starts_each_nodes_processes(
    nodes: int, environment: dict, refused: bool, monkeypatch: pytest.MonkeyPatch
):
    """Rank 0 would wait for the other nodes forever; srun or torchrun (LOCAL_RANK set) starts them."""
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    trainer = SimpleNamespace(num_nodes=nodes, strategy=SimpleNamespace(cluster_environment=LightningEnvironment()))
    if refused:
        with pytest.raises(UserError, match=r"^trainer.num_nodes=2 but nothing starts the other nodes' processes"):
            check_launched_on_every_node(trainer)
    else:
        check_launched_on_every_node(trainer)


@pytest.mark.parametrize(
    ("override", "refused"),
    [("+lerning_rate=0.1", True), ("++lerning_rate=0.1", False), ("+model.extra=1", False), ("+data=toy", False)],
)
def test_an_added_top_level_key_that_nothing_reads_is_refused_unless_added_on_purpose(
    tmp_path: Path, override: str, refused: bool, monkeypatch: pytest.MonkeyPatch
):
    """`+name=value` of no config group is most likely a typo; `++` says it is meant, and a dotted key or a group is
    read."""
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        cfg = compose("train", overrides=[f"run_dir={tmp_path}"], return_hydra_config=True)
    cfg.hydra.overrides.task = [override]
    said = r"^\+lerning_rate=0.1 adds a top-level key that nothing reads"
    with held_by_hydra(cfg), pytest.raises(UserError, match=said) if refused else contextlib.nullcontext():
        check_added_keys()


def test_an_override_that_refers_to_another_key_is_taken_as_given(tmp_path: Path):
    """The command line's `${...}` belongs to the value it sets: the check for misspelt keys must not resolve it."""
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        overrides = ["model.optimizer.lr=${data.batch_size}", f"run_dir={tmp_path}"]
        cfg = compose("train", overrides=overrides, return_hydra_config=True)
    with held_by_hydra(OmegaConf.masked_copy(cfg, "hydra")):  # as a run holds it: without the job's keys
        check_added_keys()
        assert command_line_overrides()[0] == "model.optimizer.lr=${data.batch_size}"


def test_a_value_of_the_wrong_type_for_the_network_names_the_key_and_the_type_it_takes(tmp_path: Path, monkeypatch):
    """Not the constructor's own "'<' not supported between instances of 'str' and 'int'"."""
    monkeypatch.setenv("PL_GLOBAL_SEED", "0")
    cfg = compose_train(tmp_path, "experiment=mnist", "model.network.num_layers=two")
    with pytest.raises(UserError) as raised:
        build(cfg, tmp_path / "outputs")
    assert error_line(raised.value) == (
        "error: model.network.num_layers=two is a str, but DeepNeuralNetwork's num_layers takes int: give it int"
    )


def test_values_are_judged_by_any_targets_annotations():
    network = OmegaConf.create(
        {"_target_": "project.example.networks.ConvolutionalNetwork", "in_channels": 1, "num_classes": 10}
    )
    assert mistyped_value(network, "model.network") is None
    network.channels = 16.0
    assert mistyped_value(network, "model.network") == (
        "model.network.channels=16.0 is a float, but ConvolutionalNetwork's channels takes int: give it int"
    )
    unknown = OmegaConf.create({"_target_": "no.such.Class", "size": "big"})
    assert mistyped_value(unknown, "model") is None


def test_an_int_fits_a_float_a_bool_fits_no_number_and_a_hint_of_other_types_judges_nothing():
    """A momentum of `1` is a float; `True` is no count; SGD's `lr: float | Tensor` is no hint a command line's plain
    values are judged by, so a failing constructor says its own words."""
    assert fits(1, float) and fits(1.5, float) and not fits(1.5, int) and not fits(True, int)
    assert not fits(True, float) and not fits(1, str) and fits("a", str) and fits(None, int | None)
    optimizer = OmegaConf.create({"_target_": "torch.optim.SGD", "lr": 0.1, "momentum": 1})
    assert fits(0.1, typing.get_type_hints(torch.optim.SGD.__init__)["lr"]) is None
    assert mistyped_value(optimizer, "model.optimizer") is None


class NetworkThatFails(torch.nn.Module):
    """A network whose constructor raises `error` (a ValueError: a value it refuses; a RuntimeError: a bug)."""

    def __init__(self, error: str) -> None:
        super().__init__()
        raise {"ValueError": ValueError, "RuntimeError": RuntimeError}[error](f"the network's own {error}")


def test_a_constructor_refusing_a_value_is_one_line_naming_the_group_and_its_bug_keeps_its_traceback():
    refusing = OmegaConf.create({"_target_": f"{__name__}.NetworkThatFails", "error": "ValueError"})
    with pytest.raises(UserError) as refused:
        instantiate_group("model", refusing)
    assert str(refused.value) == "model: the network's own ValueError"
    failing = OmegaConf.create({"_target_": f"{__name__}.NetworkThatFails", "error": "RuntimeError"})
    with pytest.raises(Exception) as raised:
        instantiate_group("model", failing)
    assert find_user_error(raised.value) is None, "a bug: the entry point prints its traceback"
    assert str(raised.value.__cause__ or raised.value) == "the network's own RuntimeError"


def test_a_list_of_configs_is_left_to_the_constructors_own_words():
    """Only a mapping's `_target_` has annotations to judge its values by."""
    assert mistyped_value(OmegaConf.create([{"_target_": "torch.nn.Linear", "in_features": "two"}]), "model") is None


def test_a_target_whose_signature_python_cannot_read_takes_no_named_arguments():
    """`torch.zeros` and the like are written in C, without a signature: no hint of `cfg.hints` is given to them."""
    assert taken_arguments(torch.zeros) == set()
    assert taken_arguments(0.5) == set(), "a _target_ naming a value, not a callable"
    assert {"lr", "momentum"} <= taken_arguments(torch.optim.SGD)


def test_a_callback_key_set_where_the_callbacks_config_has_no_such_callback_is_one_line(tmp_path: Path, monkeypatch):
    """`callbacks=none` then `+callbacks.early_stopping.enabled=true` would build a callback from that key alone."""
    monkeypatch.setenv("PL_GLOBAL_SEED", "0")
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        overrides = ["callbacks=none", "+callbacks.early_stopping.enabled=true", *kept_in(tmp_path)]
        cfg = compose("train", overrides=overrides, return_hydra_config=True)
    with held_by_hydra(OmegaConf.masked_copy(cfg, "hydra")), pytest.raises(UserError) as raised:
        build(OmegaConf.masked_copy(cfg, [key for key in cfg if key != "hydra"]), tmp_path / "outputs")
    assert error_line(raised.value) == (
        "error: callbacks.early_stopping has no _target_: callbacks=none defines no early_stopping for its keys to "
        "set; use callbacks=default, or give callbacks.early_stopping._target_"
    )


def hinted(tmp_path: Path, *overrides: str) -> DictConfig:
    """The train config of `overrides` after `give_hints`, as a run holds it."""
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        cfg = compose("train", overrides=[*overrides, *kept_in(tmp_path)], return_hydra_config=True)
    with held_by_hydra(OmegaConf.masked_copy(cfg, "hydra")):
        give_hints(cfg)
    return cfg


def test_a_network_swapped_by_target_alone_gets_only_the_arguments_it_names(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """`model.network._target_=torchvision.models.resnet18` over model=cnn: the CNN's keys of the model's YAML are
    left out, in one line saying so; what the command line gives (num_classes) is kept; the network builds."""
    caplog.set_level(logging.INFO, logger="lightning.pytorch.utilities.rank_zero")
    swapped = ["model.network._target_=torchvision.models.resnet18", "model.network.num_classes=2"]
    cfg = hinted(tmp_path, "model=cnn", *swapped)
    assert OmegaConf.to_container(cfg.model.network) == {"_target_": "torchvision.models.resnet18", "num_classes": 2}
    assert instantiate(cfg.model.network)(torch.zeros(2, 3, 32, 32)).shape == (2, 2)
    [said] = [record.getMessage() for record in caplog.records if "left out" in record.getMessage()]
    assert said.startswith("model.network: torchvision.models.resnet18 names no in_channels, ")
    caplog.clear()
    hinted(tmp_path, "model=cnn", "model.network._target_=project.example.networks.ConvolutionalNetwork")
    assert not [record for record in caplog.records if "left out" in record.getMessage()], "nothing left out"


def test_a_callback_is_switched_on_unless_null_or_enabled_false():
    assert switched_on({}) and switched_on({"enabled": True}) and switched_on(OmegaConf.create({"every_n": 2}))
    assert not switched_on(None) and not switched_on({"enabled": False})


@pytest.mark.parametrize(("typed", "given"), [(set(), True), ({"model.scheduler"}, False)])
def test_a_hint_for_a_part_the_config_leaves_null_gives_it_whole_unless_typed_null(typed: set[str], given: bool):
    """`hints:` completes what the user left out: a part the recipe leaves null is given as the hint has it; one the
    command line switched off (`model.scheduler=null`) stays off."""
    cfg = OmegaConf.create({"model": {"_target_": "project.example.module.ClassifierModule", "scheduler": None}})
    give(cfg, OmegaConf.create({"model": {"scheduler": {"total_steps": 10}}}), "", typed)
    assert cfg.model.scheduler == ({"total_steps": 10} if given else None)


def test_subfolders_counts_a_dirs_folders_and_a_dir_not_made_yet_as_none(tmp_path: Path):
    """`${subfolders:<dir>}`: files are not counted; before the first run the dir is not there."""
    assert config.subfolders(str(tmp_path / "not_yet")) == 0
    for name in ("0", "1"):
        (tmp_path / name).mkdir()
    (tmp_path / "multirun.yaml").write_text("")
    assert config.subfolders(str(tmp_path)) == 2


def test_the_project_imported_again_in_one_process_registers_its_resolvers_again(tmp_path: Path):
    """As a notebook's `importlib.reload(project)` does: each registration replaces the one before, and resolves."""
    config.register_resolvers()
    config.register_resolvers()
    (tmp_path / "0").mkdir()
    assert OmegaConf.create({"runs": f"${{subfolders:{tmp_path}}}"}).runs == 1


class TakesAnything:
    """A module of the user's whose constructor takes any keyword (`**settings`)."""

    def __init__(self, **settings: object) -> None:
        self.settings = settings


def test_a_group_chosen_on_the_command_line_keeps_every_key_its_yaml_gives(tmp_path: Path):
    """Only a `_target_` replaced by name leaves out the old target's keys: `model=<option>` is the option's YAML as
    written, whatever its constructor declares (here `**settings`)."""
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        cfg = compose("train", overrides=["model=toy", *kept_in(tmp_path)], return_hydra_config=True)
    cfg.model = OmegaConf.create({"_target_": f"{__name__}.TakesAnything", "width": 3})
    with held_by_hydra(OmegaConf.masked_copy(cfg, "hydra")):
        give_hints(cfg)
    assert instantiate(cfg.model).settings == {"width": 3}


def test_optimizer_arguments_need_no_plus_and_a_swapped_optimizer_gets_only_those_it_names(tmp_path: Path):
    """The toy's SGD lists momentum and weight decay; AdamW by `_target_` is not handed SGD's momentum."""
    momentum = compose_train(tmp_path, "model.optimizer.momentum=0.9")
    parameters = [torch.nn.Parameter(torch.zeros(2))]
    assert instantiate(momentum.model.optimizer)(parameters).defaults["momentum"] == 0.9
    cfg = hinted(tmp_path, "model.optimizer._target_=torch.optim.AdamW", "model.optimizer.weight_decay=0.1")
    adamw = instantiate(cfg.model.optimizer)(parameters)
    assert isinstance(adamw, torch.optim.AdamW) and adamw.defaults["weight_decay"] == 0.1


@pytest.mark.skipif(torch.cuda.is_available(), reason="float16 autocast is refused only where there is no CUDA GPU")
@pytest.mark.parametrize("precision", ["16", "16-mixed"])
def test_float16_autocast_without_a_gpu_is_refused_not_trained_in_bf16(tmp_path: Path, precision: str):
    cfg = compose_train(tmp_path, f"trainer.precision={precision}")
    with pytest.raises(UserError) as raised:
        check_config(cfg)
    assert error_line(raised.value) == (
        f"error: trainer.precision={precision} is float16 autocast, which needs a CUDA GPU (Lightning would quietly "
        "train in bf16-mixed instead): on this machine use trainer.precision=bf16-mixed or 32-true"
    )


def test_a_recipes_hint_never_overwrites_a_value_typed_on_the_command_line(tmp_path: Path):
    """`hints:` completes what the user left out: a typed `num_classes` stays, an untyped `in_channels` is given."""
    overrides = ["model=cnn", "model.network.num_classes=3", "+hints.model.network.num_classes=7"]
    overrides += ["+hints.model.network.in_channels=5"]
    cfg = hinted(tmp_path, *overrides)
    assert (cfg.model.network.num_classes, cfg.model.network.in_channels) == (3, 5)


@pytest.mark.parametrize(("max_epochs", "refused"), [(-1, False), (1, False), (0, True), (-2, True)])
def test_max_epochs_is_a_positive_count_or_minus_one_for_no_limit(tmp_path: Path, max_epochs: int, refused: bool):
    cfg = compose_train(tmp_path, f"trainer.max_epochs={max_epochs}")
    if not refused:
        check_config(cfg)
        return
    with pytest.raises(
        UserError, match=f"trainer.max_epochs must be an integer >= 1 \\(or -1 for no limit\\), got {max_epochs}"
    ):
        check_config(cfg)


def test_a_run_seeds_its_loader_workers_and_with_logger_none_has_no_logger(tmp_path: Path, monkeypatch):
    """`seed=` reaches DataLoader workers too (Lightning's PL_SEED_WORKERS); `logger=none` is no logger at all, not
    Lightning's default TensorBoard one."""
    for name in ("PL_GLOBAL_SEED", "PL_SEED_WORKERS"):  # build sets them: restored after the test
        monkeypatch.setenv(name, "0")
    setup = build(compose_train(tmp_path, "logger=none", *kept_in(tmp_path)[1:]), tmp_path / "outputs")
    assert os.environ["PL_SEED_WORKERS"] == "1"
    assert setup.trainer.loggers == []


def test_a_constructor_refusing_a_value_names_the_overrides_of_its_group_you_typed(tmp_path: Path):
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        overrides = ["data.batch_size=4", "+model.error=ValueError", "trainer.max_epochs=2", f"run_dir={tmp_path}"]
        cfg = compose("train", overrides=overrides, return_hydra_config=True)
    refusing = OmegaConf.create({"_target_": f"{__name__}.NetworkThatFails", "error": "ValueError"})
    with held_by_hydra(OmegaConf.masked_copy(cfg, "hydra")), pytest.raises(UserError) as refused:
        instantiate_group("model", refusing)
    assert str(refused.value) == "model (your overrides: +model.error=ValueError): the network's own ValueError"


def test_a_run_builds_what_its_switches_ask_and_the_divergence_guard_first(tmp_path: Path, monkeypatch):
    """The divergence guard runs before any other callback (a checkpoint must not store a diverged step); `compile`,
    `stop_when_diverged` and the loggers are what the config says; with callbacks=none Lightning adds no progress bar
    of its own."""
    for name in ("PL_GLOBAL_SEED", "PL_SEED_WORKERS"):  # build sets them: restored after the test
        monkeypatch.setenv(name, "0")
    plain = build(compose_train(tmp_path, "logger=csv", *kept_in(tmp_path)[1:]), tmp_path / "outputs").trainer
    built = [type(callback).__name__ for callback in plain.callbacks]
    assert built[0] == "DivergenceGuard" and "CompileNetworks" not in built
    assert [type(logger).__name__ for logger in plain.loggers] == ["CSVLogger"]
    switched_dir = tmp_path / "switched"
    switches = ("compile=true", "stop_when_diverged=false", "callbacks=none", "logger=none")
    switched = build(compose_train(switched_dir, *switches, *kept_in(switched_dir)[1:]), tmp_path / "outputs").trainer
    built = [type(callback).__name__ for callback in switched.callbacks]
    assert "CompileNetworks" in built and "DivergenceGuard" not in built
    assert not any(isinstance(callback, ProgressBar) for callback in switched.callbacks)
    own_dir = tmp_path / "own"  # a config of the user's own that leaves the key out: the guard is on
    own = build(compose_train(own_dir, "~stop_when_diverged", *kept_in(own_dir)[1:]), tmp_path / "outputs").trainer
    assert type(own.callbacks[0]).__name__ == "DivergenceGuard"
