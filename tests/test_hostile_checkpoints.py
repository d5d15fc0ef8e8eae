"""A checkpoint is data: one whose stored config names code this checkout does not name or trust is refused in one
line, before any of it is imported, however it is opened (`project.evaluate`, `project.predict`, `project.train
ckpt_path=<file>` and `ckpt_path=last`, as a single file or a sharded one), and nothing it names happens; the files of
a sharded checkpoint are read without running what they name (project/engine/trusted_targets.py,
project/engine/checkpoints.py).

The hostile callables are ones Hydra's own blocklist lets through (the first test shows each doing its harm when
Hydra instantiates it): pickle readers, file writers and movers, path methods, importers. Each points at a `Bait`:
a file it would create, one it would change, and the files it would read.
"""

import contextlib
import io
import json
import pickle
import re
import shutil
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict
from torch.distributed.checkpoint.metadata import BytesStorageMetadata

import project  # noqa: F401  (registers the ${launch_dir:} resolver)
from project.engine.checkpoints import check_shards, resume_path
from project.engine.errors import UserError
from project.engine.trained_run import rebuild_trained
from project.engine.trusted_targets import (
    TrustedTargets,
    UntrustedConfig,
    config_sources,
    named_in_config_files,
    trusted_targets,
)
from project.engine.upstream import VERSION_BASE
from project.evaluate import evaluate
from tests.faults import BadInput, bad_input_test
from tests.foreign_modules import FOREIGN_CONF, RegressionData, RegressionModule
from tests.helpers import CONF_DIR, untrained_toy_checkpoint


class TouchWhenUnpickled:
    """A pickle that creates `path` as it is read: what any file loaded with pickle may do."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return Path.touch, (Path(self.path),)


class Bait:
    """What a hostile node points at, in `directory`: `sentinel`, a path it must not create, `victim`, a file it
    must not change, and what it would read: `source` (a file to copy over the victim), `pickle_file` and
    `torch_file` (pickles that create the sentinel), a torch.hub dir (`directory`'s hubconf.py) and `module` (a
    module on the path of a process started in `directory`), whose code creates it too."""

    ORIGINAL = b"the user's own file"

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.sentinel, self.victim, self.source = directory / "sentinel", directory / "victim", directory / "source"
        self.pickle_file, self.torch_file = directory / "payload.pkl", directory / "payload.pt"
        self.module = f"planted_{directory.parent.name.replace('-', '_')}"

    def lay(self) -> "Bait":
        self.directory.mkdir(parents=True, exist_ok=True)
        self.victim.write_bytes(self.ORIGINAL)
        self.source.write_text("the checkpoint's text")
        self.pickle_file.write_bytes(pickle.dumps(TouchWhenUnpickled(self.sentinel)))
        buffer = io.BytesIO()
        torch.save(TouchWhenUnpickled(self.sentinel), buffer)
        self.torch_file.write_bytes(buffer.getvalue())
        code = f"import pathlib\npathlib.Path({str(self.sentinel)!r}).touch()\nentry = x = lambda: 0\n"
        (self.directory / "hubconf.py").write_text(code)
        (self.directory / f"{self.module}.py").write_text(code)
        return self

    def harmed(self) -> bool:
        return self.sentinel.exists() or not self.victim.is_file() or self.victim.read_bytes() != self.ORIGINAL

    def assert_untouched(self) -> None:
        assert not self.sentinel.exists(), f"{self.sentinel} was created"
        assert self.victim.read_bytes() == self.ORIGINAL, f"{self.victim} was changed"


def path_of(where: Path) -> dict:
    return {"_target_": "pathlib.Path", "_args_": [str(where)]}


def file_url(path: Path) -> str:
    return f"file://{path}"


# Each one's harm, done when instantiated: (pickle readers) the sentinel made by the pickle it loads; (writers,
# movers, path methods) the victim overwritten, truncated or moved, or the sentinel made; (importers) the sentinel
# made by the code of the module or hub dir it imports.
HOSTILE: dict[str, Callable[[Bait], dict]] = {
    "torch.load": lambda b: {"_target_": "torch.load", "_args_": [str(b.torch_file)], "weights_only": False},
    "numpy.load": lambda b: {"_target_": "numpy.load", "_args_": [str(b.pickle_file)], "allow_pickle": True},
    "pandas.read_pickle": lambda b: {"_target_": "pandas.read_pickle", "_args_": [str(b.pickle_file)]},
    "torch.hub.load_state_dict_from_url": lambda b: {
        "_target_": "torch.hub.load_state_dict_from_url",
        "_args_": [file_url(b.torch_file)],
        "model_dir": str(b.directory / "cache"),
        "weights_only": False,
        "progress": False,
    },
    "shutil.copyfile": lambda b: {"_target_": "shutil.copyfile", "_args_": [str(b.source), str(b.victim)]},
    "shutil.copy": lambda b: {"_target_": "shutil.copy", "_args_": [str(b.source), str(b.victim)]},
    "shutil.copytree": lambda b: {"_target_": "shutil.copytree", "_args_": [str(b.directory), str(b.sentinel)]},
    "torch.save": lambda b: {"_target_": "torch.save", "_args_": ["the checkpoint's", str(b.victim)]},
    "builtins.open": lambda b: {"_target_": "builtins.open", "_args_": [str(b.victim), "w"]},
    "zipfile.ZipFile": lambda b: {"_target_": "zipfile.ZipFile", "_args_": [str(b.victim), "w"]},
    "tarfile.open": lambda b: {"_target_": "tarfile.open", "_args_": [str(b.victim), "w"]},
    "logging.FileHandler": lambda b: {"_target_": "logging.FileHandler", "_args_": [str(b.sentinel)]},
    "os.makedirs": lambda b: {"_target_": "os.makedirs", "_args_": [str(b.sentinel)]},
    "sqlite3.connect": lambda b: {"_target_": "sqlite3.connect", "_args_": [str(b.sentinel)]},
    "urllib.request.urlretrieve": lambda b: {
        "_target_": "urllib.request.urlretrieve",
        "_args_": [file_url(b.source), str(b.victim)],
    },
    "pathlib.Path.touch": lambda b: {"_target_": "pathlib.Path.touch", "_args_": [path_of(b.sentinel)]},
    "pathlib.Path.write_text": lambda b: {"_target_": "pathlib.Path.write_text", "_args_": [path_of(b.victim), "x"]},
    "pathlib.Path.rename": lambda b: {
        "_target_": "pathlib.Path.rename",
        "_args_": [path_of(b.victim), str(b.sentinel)],
    },
    "torch.hub.load": lambda b: {
        "_target_": "torch.hub.load",
        "_args_": [str(b.directory), "entry"],
        "source": "local",
        "trust_repo": True,
    },
    "pkgutil.resolve_name": lambda b: {"_target_": "pkgutil.resolve_name", "_args_": [f"{b.module}:x"]},
    "hydra.utils.get_object": lambda b: {"_target_": "hydra.utils.get_object", "_args_": [f"{b.module}.x"]},
}

# Where in a stored config a hostile node goes: what evaluate and predict build (the module, its network, its
# optimizer as a factory, the data) and what only a training run would (a callback, a logger, the strategy).
PLACEMENTS: dict[str, Callable[[dict, dict], None]] = {
    "model": lambda config, node: config.update(model=node),
    "data": lambda config, node: config.update(data=node),
    "model.network": lambda config, node: config["model"].update(network=node),
    "model.optimizer": lambda config, node: config["model"].update(optimizer={**node, "_partial_": True}),
    "callbacks.model_checkpoint": lambda config, node: config["callbacks"].update(model_checkpoint=node),
    "logger.tensorboard": lambda config, node: config["logger"].update(tensorboard=node),
    "trainer.strategy": lambda config, node: config["trainer"].update(strategy=node),
}
# Every callable, each at one of the places in turn (every place three times).
PAIRS = [(name, list(PLACEMENTS)[index % len(PLACEMENTS)]) for index, name in enumerate(HOSTILE)]


def hostile_copy(checkpoint: Path, written: Path, placement: str, node: dict) -> Path:
    """`checkpoint` (one project.train wrote) with `node` at `placement` of its stored config, as `written`."""
    content = torch.load(checkpoint, map_location="cpu", weights_only=True)
    PLACEMENTS[placement](content["config"], node)
    written.parent.mkdir(parents=True, exist_ok=True)
    torch.save(content, written)
    return written


def plant_as_newest_last(checkpoint: Path, outputs: Path) -> None:
    """`checkpoint` as the last.ckpt of a run under `outputs`: what `ckpt_path=last` takes, being the only one."""
    planted = outputs / "2026-12-05" / "12-00-00" / "checkpoints" / "last.ckpt"
    planted.parent.mkdir(parents=True)
    shutil.copy(checkpoint, planted)


@pytest.fixture(scope="module")
def toy_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return untrained_toy_checkpoint(tmp_path_factory.mktemp("toy"))


@pytest.mark.parametrize("name", HOSTILE)
def test_each_hostile_callable_does_its_harm_past_hydras_own_blocklist(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """What the refusals below prevent: Hydra's `instantiate`, given the node, runs it."""
    bait = Bait(tmp_path / "bait").lay()
    monkeypatch.syspath_prepend(str(bait.directory))  # where `python -m` there would find the planted module
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Hydra 1.4's: instantiating without an allow-list is deprecated
        with contextlib.suppress(Exception):  # the harm is done as it runs; what it returns or raises after is not
            instantiate(OmegaConf.create(HOSTILE[name](bait)))
    assert bait.harmed(), f"{name} did nothing: it proves nothing as a hostile callable"


@pytest.mark.parametrize(("name", "placement"), PAIRS)
def test_evaluate_and_train_refuse_a_hostile_stored_config_before_it_runs(
    name: str, placement: str, tmp_path: Path, toy_checkpoint: Path
):
    """Each opening, as the entry points do it: rebuilding the run (evaluate; predict does the same), resuming a
    file, and `ckpt_path=last` finding the hostile file as the newest run's."""
    bait = Bait(tmp_path / "bait").lay()
    hostile = hostile_copy(toy_checkpoint, tmp_path / "hostile.ckpt", placement, HOSTILE[name](bait))
    plant_as_newest_last(hostile, tmp_path / "outputs")
    named = rf"names {placement}\._target_={name}, which no config file here names"
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        cfg = compose("evaluate", overrides=[f"ckpt_path={hostile}"])
        with pytest.raises(UntrustedConfig, match=named):
            rebuild_trained(cfg, "project.evaluate")
        run_config = OmegaConf.to_container(compose("train", overrides=[f"run_dir={tmp_path}"]), resolve=True)
        for ckpt_path in (str(hostile), "last"):
            with pytest.raises(UntrustedConfig, match=named):
                resume_path(ckpt_path, tmp_path / "run", tmp_path / "outputs", run_config)
    bait.assert_untouched()


def test_a_target_behind_an_interpolation_or_a_resolver_that_acts_is_refused_unresolved(
    tmp_path: Path, toy_checkpoint: Path
):
    """The template stores its configs resolved: an interpolation in one is refused before it resolves, so neither
    the target it hides runs nor a resolver acts (`${launch_dir:}` makes a directory)."""
    bait = Bait(tmp_path / "bait").lay()
    made = bait.directory / "made"
    content = torch.load(toy_checkpoint, map_location="cpu", weights_only=True)
    content["config"]["model"]["network"] = {
        "_target_": "${model.hidden}",
        "_args_": [str(bait.source), str(bait.victim)],
    }
    content["config"]["model"]["hidden"] = "shutil.copyfile"
    torch.save(content, tmp_path / "hidden.ckpt")
    content = torch.load(toy_checkpoint, map_location="cpu", weights_only=True)
    content["config"]["data"]["seed"] = f"${{launch_dir:{made}}}"
    torch.save(content, tmp_path / "resolver.ckpt")
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        for file, key in (("hidden.ckpt", "model.network._target_"), ("resolver.ckpt", "data.seed")):
            cfg = compose("evaluate", overrides=[f"ckpt_path={tmp_path / file}"])
            with pytest.raises(UntrustedConfig, match=rf"holds {key}=\$\{{.*, an interpolation"):
                rebuild_trained(cfg, "project.evaluate")
    bait.assert_untouched()
    assert not made.exists()


@pytest.mark.parametrize(
    ("target", "trusted"),
    [
        ("torch.nn.Linear", True),  # a class of a trusted package
        ("torchvision.models.resnet18", True),  # a module function of one
        ("torch.nn.Module.load_state_dict", False),  # a method: `<Class>.<method>` can write files...
        ("lightning.pytorch.callbacks.ModelCheckpoint.to_yaml", False),  # ...as this one does
        ("torch.optim.optimizer.torch.load", False),  # a name the package imported: torch.load itself
        ("torch.nn.modules.linear.torch.save", False),
        ("torchvision.models.ResNet18_Weights.IMAGENET1K_V1.get_state_dict", False),  # a bound method
        ("torchvision.models.no_such_network", True),  # nothing there: instantiate says so, as for any missing name
        ("torchvision.io.read_file", False),  # beside a trusted package, not in it
    ],
)
def test_a_trusted_package_trusts_what_it_defines_not_what_it_reaches(target: str, trusted: bool):
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        cfg = compose("evaluate", overrides=["ckpt_path=unused"])
        assert trusted_targets(cfg).trusts(target) is trusted


@pytest.mark.parametrize(
    "given", [["my_project.*"], "my_project.*", {"mine": ["my_project.*"]}], ids=["list", "string", "list-value"]
)
def test_trusted_targets_that_is_not_names_mapped_to_targets_is_refused_in_one_line(given: object):
    with pytest.raises(
        UserError, match=r"^trusted_targets must map names to targets .*: e\.g\. \+trusted_targets\.mine="
    ):
        TrustedTargets.of({"model": {"_target_": "my_project.Module"}, "trusted_targets": given})


def test_a_config_file_that_is_not_yaml_is_passed_over_and_the_others_still_name_their_targets(tmp_path: Path):
    """Hydra reports such a file where a run composes it; a run that does not use it still trusts the rest."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "mine.yaml").write_text("_target_: my_project.Module\n")
    (tmp_path / "broken.yaml").write_text("_target_: my_project.Hidden\nkey: [unclosed\n")
    with initialize_config_dir(str(tmp_path), **VERSION_BASE):
        named = named_in_config_files()
    assert "my_project.Module" in named and "my_project.Hidden" not in named


def test_a_search_path_package_that_is_not_installed_adds_no_targets_and_stops_nothing():
    """Hydra warns of such a package itself; the targets the run trusts are those it trusts without it."""
    missing = "pkg://no_such_package_of_configs"
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE), as_a_run_holds_it() as hydra_node:
        with pytest.warns(UserWarning, match="path=no_such_package_of_configs is not available"):
            hydra_node(compose("evaluate", overrides=[f"hydra.searchpath=[{missing}]"], return_hydra_config=True))
        assert ("pkg", "no_such_package_of_configs") in config_sources()
        with_missing = named_in_config_files()
        hydra_node(compose("evaluate", return_hydra_config=True))
        assert with_missing == named_in_config_files()
    assert "project.example.data.ToyDataModule" in with_missing


def test_outside_any_hydra_run_a_config_trusts_only_its_own_targets_and_trusted_targets():
    """With no config sources to read (no Hydra run, no compose API), no config file vouches for a target."""
    trust = TrustedTargets.of({"model": {"_target_": "my_project.Module"}, "trusted_targets": {"t": "torchvision.*"}})
    assert config_sources() == []
    assert trust.named == {"my_project.Module"}
    assert trust.trusts("my_project.Module") and trust.trusts("torchvision.models.resnet18")
    assert not trust.trusts("project.example.data.ToyDataModule"), "named by conf/, which no run here reads"


def sharded_copy(plain: Path, directory: Path) -> Path:
    """A sharded checkpoint in `directory` as `trainer=fsdp` writes one (DCP's shards and index, `meta.pt` with the
    rest), of the weights of `plain` and an optimizer's plain values (which DCP stores as non-tensor values)."""
    content = torch.load(plain, map_location="cpu", weights_only=True)
    state = {"state_dict": content.pop("state_dict"), "optimizer_0": {"param_groups": [{"lr": 0.5, "params": []}]}}
    dcp.save(state, checkpoint_id=directory, no_dist=True)
    torch.save(content, directory / "meta.pt")
    return directory


def with_hostile_index(sharded: Path, bait: Bait) -> Path:
    """DCP's index of the shards replaced by a pickle that creates the sentinel, where DCP unpickles it."""
    (sharded / ".metadata").write_bytes(pickle.dumps(TouchWhenUnpickled(bait.sentinel)))
    return sharded


def with_hostile_value(sharded: Path, bait: Bait) -> Path:
    """A plain value of the checkpoint (a learning rate) replaced by a pickle that creates the sentinel, where DCP
    reads it with `torch.load(weights_only=False)`."""
    with (sharded / ".metadata").open("rb") as file:
        index = pickle.load(file)  # this test's own file
    payload = bait.torch_file.read_bytes()
    for where, stored in index.storage_data.items():
        if isinstance(index.state_dict_metadata[where.fqn], BytesStorageMetadata):
            shard = sharded / stored.relative_path
            stored.offset, stored.length = shard.stat().st_size, len(payload)
            with shard.open("ab") as file:
                file.write(payload)
    (sharded / ".metadata").write_bytes(pickle.dumps(index))
    return sharded


def test_a_sharded_checkpoint_that_would_run_code_is_refused_before_dcp_reads_it(tmp_path: Path, toy_checkpoint: Path):
    """DCP unpickles its index and `torch.load`s plain values with `weights_only=False`: either runs code a hostile
    file names. A sharded checkpoint of the project's own layout opens; one hostile in either way, or whose
    meta.pt names an untrusted target, is refused, and nothing runs."""
    check_shards(sharded_copy(toy_checkpoint, tmp_path / "whole"))
    bait = Bait(tmp_path / "bait").lay()
    index = with_hostile_index(sharded_copy(toy_checkpoint, tmp_path / "index"), bait)
    value = with_hostile_value(sharded_copy(toy_checkpoint, tmp_path / "value"), bait)
    with pytest.raises(UserError, match=r"whose \.metadata is not DCP's index of shards \(it names pathlib"):
        check_shards(index)
    with pytest.raises(UserError, match=r"whose value optimizer_0\.param_groups\.0\.lr is more than a plain value"):
        check_shards(value)
    target = sharded_copy(toy_checkpoint, tmp_path / "target")
    meta = torch.load(target / "meta.pt", weights_only=True)
    meta["config"]["model"] = HOSTILE["shutil.copyfile"](bait)
    torch.save(meta, target / "meta.pt")
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        for sharded in (index, value, target):
            cfg = compose("evaluate", overrides=[f"ckpt_path={sharded}"])
            with pytest.raises(UserError, match=f"ckpt_path={sharded}"):
                rebuild_trained(cfg, "project.evaluate")
    bait.assert_untouched()


def with_index_edited(sharded: Path, edit: Callable[[object], None]) -> Path:
    """DCP's index of the shards read (this test's own file), changed by `edit`, and written back."""
    with (sharded / ".metadata").open("rb") as file:
        index = pickle.load(file)
    edit(index)
    (sharded / ".metadata").write_bytes(pickle.dumps(index))
    return sharded


def point_first_entry(relative_path: str | None = None, transform: list[str] | None = None) -> Callable:
    def edit(index: object) -> None:
        stored = next(iter(index.storage_data.values()))
        stored.relative_path = relative_path or stored.relative_path
        stored.transform_descriptors = transform

    return edit


def test_a_sharded_index_of_plain_values_only_or_one_pointing_outside_the_checkpoint_is_refused(
    tmp_path: Path, toy_checkpoint: Path
):
    """An index unpickled with only the classes DCP writes may still be no index at all (a pickled dict), or point a
    value at a file outside the checkpoint's own (a payload beside it) or through a transform DCP would apply."""
    bait = Bait(tmp_path / "bait").lay()
    not_an_index = sharded_copy(toy_checkpoint, tmp_path / "dict")
    (not_an_index / ".metadata").write_bytes(pickle.dumps({"state_dict.weight": 0}))
    with pytest.raises(UserError, match=r"whose \.metadata holds a dict, not DCP's index of shards: it is not opened"):
        check_shards(not_an_index)
    outside = f"../../bait/{bait.torch_file.name}"
    edits = {"outside": point_first_entry(relative_path=outside), "transformed": point_first_entry(transform=["zstd"])}
    for name, edit in edits.items():
        sharded = with_index_edited(sharded_copy(toy_checkpoint, tmp_path / name / "sharded.ckpt"), edit)
        pointed = re.escape(outside) if name == "outside" else r"__0_0\.distcp through zstd"
        with pytest.raises(UserError, match=rf"whose index reads \S+ from {pointed}, not plainly from its own files"):
            check_shards(sharded)
    bait.assert_untouched()


# What still opens: a checkpoint written before trusted_targets existed, a user's own module named by their config
# dir, one they trust by trusted_targets. (The example's own, and a foreign Lightning checkpoint with model=/data=:
# tests/test_workflow.py, tests/test_foreign_checkpoints.py.)

BEFORE = Path(__file__).parent / "checkpoints" / "before-trusted-targets"


def test_a_checkpoint_written_before_trusted_targets_evaluates_to_its_runs_results_and_resumes(tmp_path: Path):
    """A toy run's last.ckpt written by main 0d60c1c, before this check existed, and its run's results.json."""
    results = json.loads((BEFORE / "results.json").read_text())
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        metrics = evaluate(compose("evaluate", overrides=[f"ckpt_path={BEFORE / 'last.ckpt'}", "accelerator=cpu"]))
        run_config = OmegaConf.to_container(compose("train", overrides=[f"run_dir={tmp_path}"]), resolve=True)
        assert resume_path(str(BEFORE / "last.ckpt"), tmp_path / "run", tmp_path, run_config) == str(
            BEFORE / "last.ckpt"
        )
    assert metrics == {"test/loss": results["test/loss"], "test/acc": results["test/acc"]}


def own_module_checkpoint(directory: Path) -> Path:
    """A checkpoint as project.train stores one of the user's own regression module and data (tests/foreign_modules
    .py), whose config files are in their config dir (tests/foreign_conf), not in conf/."""
    searchpath = f"hydra.searchpath=[file://{FOREIGN_CONF}]"
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        cfg = compose("train", overrides=["model=regression", "data=regression", f"run_dir={directory}", searchpath])
    path = directory / "own.ckpt"
    config = OmegaConf.to_container(cfg, resolve=True)
    torch.save({"config": config, "state_dict": instantiate(cfg.model).state_dict()}, path)
    return path


def test_a_module_of_your_own_opens_with_your_config_dir_or_trusted_targets_and_not_without(tmp_path: Path):
    checkpoint = own_module_checkpoint(tmp_path)
    opened = {
        "your config dir on the search path": [f"hydra.searchpath=[file://{FOREIGN_CONF}]"],
        "your package trusted": ["+trusted_targets.mine=tests.foreign_modules.*"],
    }
    with (
        initialize_config_dir(str(CONF_DIR), **VERSION_BASE),
        pytest.raises(UntrustedConfig, match=r"data\._target_=tests\.foreign_modules\.RegressionData"),
    ):
        rebuild_trained(compose("evaluate", overrides=[f"ckpt_path={checkpoint}"]), "project.evaluate")
    for how, overrides in opened.items():
        with initialize_config_dir(str(CONF_DIR), **VERSION_BASE), as_a_run_holds_it() as hydra_node:
            cfg = compose("evaluate", overrides=[f"ckpt_path={checkpoint}", *overrides], return_hydra_config=True)
            datamodule, module = rebuild_trained(hydra_node(cfg), "project.evaluate")
        assert isinstance(module, RegressionModule) and isinstance(datamodule, RegressionData), how


@contextmanager
def as_a_run_holds_it() -> Iterator[Callable[[DictConfig], DictConfig]]:
    """A function that takes a config composed with its `hydra` node and sets that node as `hydra.main` does for a
    run (`HydraConfig`: its search path as composed, `hydra.searchpath` included), returning the job's keys."""

    def hold(cfg: DictConfig) -> DictConfig:
        HydraConfig.instance().set_config(OmegaConf.masked_copy(cfg, "hydra"))
        with open_dict(cfg):
            del cfg["hydra"]
        return cfg

    try:
        yield hold
    finally:
        HydraConfig.instance().cfg = None


# The same as users meet them: the entry points in processes of their own, on a finished toy run's last.ckpt (and
# the same written by DCP as trainer=fsdp writes it; tests/optional/fsdp opens trained ones), each ending in one
# line, exit 2, nothing of the bait touched.


def hostile_case(case_id: str, name: str, placement: str, module: str, *args: str) -> BadInput:
    def prepare(case_dir: Path, ckpt: Path) -> None:
        bait = Bait(case_dir / "bait").lay()
        hostile = hostile_copy(ckpt, case_dir / "hostile.ckpt", placement, HOSTILE[name](bait))
        plant_as_newest_last(hostile, case_dir / "outputs")

    return BadInput(
        case_id,
        args,
        (f"{placement}._target_={name}", f"+trusted_targets.{name.split('.')[0]}={name}"),
        module=module,
        prepare=prepare,
        check=lambda case_dir: Bait(case_dir / "bait").assert_untouched(),
    )


def sharded_case(case_id: str, make_hostile: Callable[[Path, Bait], Path], module: str, *args: str) -> BadInput:
    def prepare(case_dir: Path, ckpt: Path) -> None:
        make_hostile(sharded_copy(ckpt, case_dir / "sharded.ckpt"), Bait(case_dir / "bait").lay())

    return BadInput(
        case_id,
        args,
        ("ckpt_path={dir}/sharded.ckpt is a sharded checkpoint whose",),
        module=module,
        prepare=prepare,
        check=lambda case_dir: Bait(case_dir / "bait").assert_untouched(),
    )


HOSTILE_FILE, NEWEST = "ckpt_path={dir}/hostile.ckpt", "ckpt_path=last"
HOSTILE_CHECKPOINTS = [
    hostile_case("evaluate-torch-load-at-model", "torch.load", "model", "project.evaluate", HOSTILE_FILE),
    hostile_case("evaluate-copyfile-at-data", "shutil.copyfile", "data", "project.evaluate", HOSTILE_FILE),
    hostile_case("predict-touch-at-network", "pathlib.Path.touch", "model.network", "project.predict", HOSTILE_FILE),
    hostile_case("predict-numpy-at-optimizer", "numpy.load", "model.optimizer", "project.predict", HOSTILE_FILE),
    hostile_case(
        "train-file-hub-at-callback", "torch.hub.load", "callbacks.model_checkpoint", "project.train", HOSTILE_FILE
    ),
    hostile_case("train-file-open-at-logger", "builtins.open", "logger.tensorboard", "project.train", HOSTILE_FILE),
    hostile_case("train-last-zip-at-strategy", "zipfile.ZipFile", "trainer.strategy", "project.train", NEWEST),
    sharded_case("evaluate-sharded-index", with_hostile_index, "project.evaluate", "ckpt_path={dir}/sharded.ckpt"),
    sharded_case("evaluate-sharded-value", with_hostile_value, "project.evaluate", "ckpt_path={dir}/sharded.ckpt"),
    sharded_case(
        "train-fsdp-sharded-index",
        with_hostile_index,
        "project.train",
        "trainer=fsdp",
        "trainer.max_epochs=2",
        "ckpt_path={dir}/sharded.ckpt",
    ),
]

test_bad_input_exits_2_with_one_error_line_naming_it = pytest.mark.slow(bad_input_test(HOSTILE_CHECKPOINTS))
