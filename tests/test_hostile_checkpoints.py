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
import functools
import importlib
import inspect
import io
import json
import os
import pickle
import pkgutil
import re
import shutil
import sqlite3
import stat
import subprocess
import sys
import warnings
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import FrozenInstanceError, dataclass
from pathlib import Path, PurePosixPath

import pytest
import torch
import torch.distributed.checkpoint as dcp
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict
from torch import nn
from torch.distributed.checkpoint.metadata import BytesStorageMetadata

import project  # noqa: F401  (registers the ${launch_dir:} resolver)
import project.engine.trusted_targets as trusted_targets_module
from project.engine.checkpoints import ShardsIndexUnpickler, check_shards, resume_path
from project.engine.errors import UserError
from project.engine.trained_run import rebuild_trained
from project.engine.trusted_targets import (
    CHANGES_PATHS,
    DIR_FD_ARGUMENT,
    UNAUDITED,
    ActedOutsideTheRun,
    Confinement,
    TrustedTargets,
    UntrustedConfig,
    check_stored_config,
    composed_targets,
    config_sources,
    job_whitelist,
    named_in_config_files,
    trusted_targets,
)
from project.engine.upstream import VERSION_BASE
from project.evaluate import evaluate
from project.example.module import ClassifierModule
from tests.acting_targets import ACTIONS, ActingNetwork
from tests.faults import USER_ERROR, assert_ends_in_error_line
from tests.foreign_modules import FOREIGN_CONF, RegressionData, RegressionModule
from tests.helpers import CONF_DIR, REPO, proxied_to, run_module, untrained_toy_checkpoint, watched_port


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


def bind_chain(module: str, function: str, argument: str) -> dict:
    """`bind(argument, bind(function, lazy_deprecated_import([function], "torch.nn", module)))`: a config of torch.nn
    callables alone that calls `<module>.<function>(argument)`."""
    getter = {
        "_target_": "torch.nn.utils._deprecation_utils.lazy_deprecated_import",
        "all": [function],
        "old_module": "torch.nn",
        "new_module": module,
    }
    found = {"_target_": "torch.nn.utils.rnn.bind", "optional": function, "fn": getter}
    return {"_target_": "torch.nn.utils.rnn.bind", "optional": argument, "fn": found}


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
    # torch.nn's own gadgets, trusted with the namespace: bind(x, f) calls f(x), and the lazy importer hands back any
    # module's function; chained, they call os.makedirs.
    "torch.nn.utils.rnn.bind": lambda b: bind_chain("os", "makedirs", str(b.sentinel)),
    "pkgutil.resolve_name": lambda b: {"_target_": "pkgutil.resolve_name", "_args_": [f"{b.module}:x"]},
    "hydra.utils.get_object": lambda b: {"_target_": "hydra.utils.get_object", "_args_": [f"{b.module}.x"]},
}

# Where in a stored config a hostile node goes. What evaluate and predict rebuild: the module, its network, its
# optimizer as a factory, the data, and a list inside them (a schedule chain's)...
REBUILT_PLACEMENTS: dict[str, Callable[[dict, dict], None]] = {
    "model": lambda config, node: config.update(model=node),
    "data": lambda config, node: config.update(data=node),
    "model.network": lambda config, node: config["model"].update(network=node),
    "model.scheduler": lambda config, node: config["model"].update(scheduler=node),
    "model.optimizer": lambda config, node: config["model"].update(optimizer={**node, "_partial_": True}),
    "model.scheduler.schedulers[0]": lambda config, node: config["model"].update(
        scheduler={"_target_": "torch.optim.lr_scheduler.ChainedScheduler", "_partial_": True, "schedulers": [node]}
    ),
}
# ...and what a checkpoint only records, never read back (a callback, a logger, the strategy): the user's config
# gives those.
RECORD_PLACEMENTS: dict[str, Callable[[dict, dict], None]] = {
    "callbacks.model_checkpoint": lambda config, node: config["callbacks"].update(model_checkpoint=node),
    "logger.tensorboard": lambda config, node: config["logger"].update(tensorboard=node),
    "trainer.strategy": lambda config, node: config["trainer"].update(strategy=node),
}
PLACEMENTS = REBUILT_PLACEMENTS | RECORD_PLACEMENTS
# Every callable, each at one of the rebuilt places in turn.
PAIRS = [(name, list(REBUILT_PLACEMENTS)[index % len(REBUILT_PLACEMENTS)]) for index, name in enumerate(HOSTILE)]


def hostile_copy(checkpoint: Path, written: Path, placement: str, node: object) -> Path:
    """`checkpoint` (one project.train wrote) with `node` at `placement` of its stored config, as `written`."""
    return edited_copy(checkpoint, written, lambda config: PLACEMENTS[placement](config, node))


def edited_copy(checkpoint: Path, written: Path, edit: Callable[[dict], None]) -> Path:
    """`checkpoint` with its stored config changed by `edit`, as `written`."""
    content = torch.load(checkpoint, map_location="cpu", weights_only=True)
    edit(content["config"])
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


def opening_refuses(checkpoint: Path, outputs: Path, run_dir: Path, match: str) -> None:
    """Each opening of `checkpoint`, as the entry points do it, ends in an `UntrustedConfig` matching `match`:
    rebuilding the run (evaluate; predict rebuilds it the same way, and opens a hostile file end to end below),
    resuming the file, and `ckpt_path=last` finding it as the newest run's."""
    plant_as_newest_last(checkpoint, outputs)
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        with pytest.raises(UntrustedConfig, match=match):
            rebuild_trained(compose("evaluate", overrides=[f"ckpt_path={checkpoint}"]), "project.evaluate")
        for ckpt_path in (str(checkpoint), "last"):
            with pytest.raises(UntrustedConfig, match=match):
                resume_path(ckpt_path, run_dir, outputs, train_config())


@functools.cache
def train_config() -> dict:
    """project.train's resolved config (its run dir unused here), composed once, inside the caller's
    `initialize_config_dir`."""
    return OmegaConf.to_container(compose("train", overrides=["run_dir=unused"]), resolve=True)


@pytest.mark.parametrize(("name", "placement"), PAIRS)
def test_evaluate_predict_and_train_refuse_a_hostile_stored_config_before_it_runs(
    name: str, placement: str, tmp_path: Path, toy_checkpoint: Path
):
    bait = Bait(tmp_path / "bait").lay()
    hostile = hostile_copy(toy_checkpoint, tmp_path / "hostile.ckpt", placement, HOSTILE[name](bait))
    named = rf"names {re.escape(placement)}\._target_={name}, which no config file here names"
    opening_refuses(hostile, tmp_path / "outputs", tmp_path / "run", named)
    bait.assert_untouched()


@pytest.mark.parametrize("placement", RECORD_PLACEMENTS)
def test_what_a_stored_config_only_records_is_never_built_and_the_checkpoint_opens(
    placement: str, tmp_path: Path, toy_checkpoint: Path
):
    """A callback, logger or strategy of the run that wrote the checkpoint comes from the user's config when it is
    resumed, and is not part of what evaluate and predict rebuild: a hostile one there is never imported."""
    bait = Bait(tmp_path / "bait").lay()
    hostile = hostile_copy(toy_checkpoint, tmp_path / "hostile.ckpt", placement, HOSTILE["shutil.copyfile"](bait))
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        datamodule, module = rebuild_trained(compose("evaluate", overrides=[f"ckpt_path={hostile}"]), "evaluate")
        run_config = OmegaConf.to_container(compose("train", overrides=[f"run_dir={tmp_path}"]), resolve=True)
        assert resume_path(str(hostile), tmp_path / "run", tmp_path, run_config) == str(hostile)
    assert type(module).__name__ == "ClassifierModule" and type(datamodule).__name__ == "ToyDataModule"
    bait.assert_untouched()


# The corpus: every class and function of every namespace the defaults trusted before exact names, each as a stored
# target in a dict, in a list and in a tuple. Trusting a namespace trusted its gadgets: torch.nn.utils.rnn.bind(x, f)
# calls f(x), and torch.nn.utils._deprecation_utils.lazy_deprecated_import hands back any module's function.
OLD_DEFAULT_NAMESPACES = (
    "project.example.networks",
    "torch.nn",
    "torch.optim",
    "torchvision.models",
    "lightning.pytorch.callbacks",
    "lightning.pytorch.loggers",
    "lightning.pytorch.strategies",
)
CONTAINERS: dict[str, Callable[[str], object]] = {
    "dict": lambda name: {"_target_": name},
    "list": lambda name: [{"_target_": name}],
    "tuple": lambda name: ({"_target_": name},),
}


def callables_under(package: str) -> list[str]:
    """Every class and function each module of `package` defines, by the name it is defined under, and everything
    callable the package itself exports, by the short name a config would give."""
    root = importlib.import_module(package)
    modules = [root]
    for found in pkgutil.walk_packages(getattr(root, "__path__", []), f"{package}.", onerror=lambda name: None):
        with contextlib.suppress(Exception):  # a module needing a package not installed here: none to trust
            modules.append(importlib.import_module(found.name))
    names = {
        f"{module.__name__}.{name}"
        for module in modules
        for name, value in vars(module).items()
        if (inspect.isclass(value) or inspect.isfunction(value)) and value.__module__ == module.__name__
    }
    return sorted(names | {f"{package}.{name}" for name, value in vars(root).items() if callable(value)})


def exactly_named_here() -> set[str]:
    """The targets a checkpoint may name in this checkout: the config files' and the default trusted_targets'."""
    trusted = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "trusted_targets.yaml"))["trusted_targets"]
    listed = {name for names in trusted.values() for name in ([names] if isinstance(names, str) else names)}
    return set(named_in_config_files()) | listed


@pytest.mark.parametrize("namespace", OLD_DEFAULT_NAMESPACES)
def test_no_callable_of_a_namespace_is_trusted_unless_named_exactly(namespace: str, toy_checkpoint: Path):
    """Each callable at the network's place, in each container: refused (by name, or as a tuple), unless this
    checkout names it exactly."""
    config = torch.load(toy_checkpoint, map_location="cpu", weights_only=True)["config"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated modules warn as they are imported
        corpus = callables_under(namespace)
    opened: dict[str, set[str]] = {container: set() for container in CONTAINERS}
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        trust = trusted_targets(compose("evaluate", overrides=["ckpt_path=unused"]))
        allowed = exactly_named_here()
        for name in corpus:
            for container, wrap in CONTAINERS.items():
                config["model"]["network"] = wrap(name)
                try:
                    check_stored_config(config, "ckpt_path=theirs.ckpt", trust)
                    opened[container].add(name)
                except UntrustedConfig as refusal:
                    assert name in str(refusal) or "holds a tuple" in str(refusal)
    assert len(corpus) > 3
    assert opened["dict"] == opened["list"] == {name for name in corpus if name in allowed}
    assert opened["tuple"] == set()


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


def test_an_interpolation_inside_a_list_of_the_rebuilt_config_is_refused_too(tmp_path: Path, toy_checkpoint: Path):
    hidden = edited_copy(
        toy_checkpoint,
        tmp_path / "hidden.ckpt",
        lambda config: config["model"]["network"].update(sizes=[2, "${oc.env:HOME}"]),
    )
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        cfg = compose("evaluate", overrides=[f"ckpt_path={hidden}"])
        with pytest.raises(
            UntrustedConfig, match=r"holds model\.network\.sizes\[1\]=\$\{oc\.env:HOME\}, an interpolation"
        ):
            rebuild_trained(cfg, "project.evaluate")


def comes_back_from_a_checkpoint(value: object) -> bool:
    buffer = io.BytesIO()
    torch.save({"config": value}, buffer)
    buffer.seek(0)
    try:
        torch.load(buffer, weights_only=True)
    except pickle.UnpicklingError:  # weights_only refuses it: no checkpoint the project opens holds one
        return False
    return True


# A value of each type that `torch.load(weights_only=True)` gives back and plain data does not hold (of these
# candidates, those it refuses are left out as they are met: a checkpoint holding one is not opened at all).
CANDIDATES = {
    "tuple": ({"_target_": "shutil.copyfile"},),
    "set": {1, 2},
    "frozenset": frozenset({1}),
    "bytes": b"torch.save",
    "bytearray": bytearray(b"x"),
    "complex": 1j,
    "OrderedDict": OrderedDict(_target_="torch.nn.Identity"),
    "defaultdict": defaultdict(list, {"_target_": "torch.nn.Identity"}),
    "Size": torch.Size([2, 2]),
    "Tensor": torch.zeros(2),
    "dtype": torch.float32,
    "device": torch.device("cpu"),
    "slice": slice(1, 2),
    "range": range(3),
}
STORED_TYPES = {kind: value for kind, value in CANDIDATES.items() if comes_back_from_a_checkpoint(value)}


@pytest.mark.parametrize("kind", list(STORED_TYPES))
def test_a_stored_config_that_holds_anything_but_plain_data_is_refused_naming_where(
    kind: str, tmp_path: Path, toy_checkpoint: Path
):
    """Dicts, lists, strings, numbers, booleans and null; `weights_only` loading gives back more, which OmegaConf
    would take (a tuple as a list, the check walking past it). In the rebuilt part or in the record, each is refused."""
    value = STORED_TYPES[kind]
    edited = edited_copy(toy_checkpoint, tmp_path / "model.ckpt", lambda c: c["model"].update(scheduler=value))
    type_name = type(torch.load(edited, weights_only=True)["config"]["model"]["scheduler"]).__name__
    in_record = edited_copy(toy_checkpoint, tmp_path / "record.ckpt", lambda c: c["trainer"].update(plugins=value))
    opening_refuses(edited, tmp_path / "outputs", tmp_path / "run", rf"holds a {type_name} at model\.scheduler, where")
    opening_refuses(in_record, tmp_path / "o2", tmp_path / "run2", rf"holds a {type_name} at trainer\.plugins, where")


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ([{"model": {}}], "is a list, not a mapping of keys to values"),
        ({1: "a", 2: "b"}, "holds a key that is not a string (1) at its top"),
        ({"model": {"network": {("a",): 1}}}, "holds a key that is not a string (('a',)) at model.network"),
    ],
    ids=["a list", "numbers as keys", "a tuple as a key"],
)
def test_a_stored_config_that_is_no_mapping_of_names_is_refused_naming_the_first_odd_key_and_where(
    config: object, words: str
):
    with pytest.raises(UntrustedConfig, match="^" + re.escape(f"ckpt_path=x: its stored config {words}")):
        check_stored_config(config, "ckpt_path=x", TrustedTargets.of({}))


@pytest.mark.parametrize(
    "target", [["shutil.copyfile"], 7, None, "shutil copyfile", "os.system;rm", "evil\x1b[2J.x", ""], ids=str
)
def test_a_target_that_is_not_a_dotted_name_is_refused_without_a_trust_hint(target: object):
    """A hint to trust it could not be typed, or would do something else than the user reads."""
    config = {"model": {"_target_": "project.example.module.ClassifierModule", "network": {"_target_": target}}}
    trust = TrustedTargets.of({"trusted_targets": {"module": "project.example.module.ClassifierModule"}})
    with pytest.raises(UntrustedConfig, match="which is not the dotted name of a class or function") as refused:
        check_stored_config(config, "ckpt_path=x", trust)
    assert "+trusted_targets" not in str(refused.value)


def test_the_trust_hint_is_a_command_that_works_as_printed(tmp_path: Path):
    """The printed `+trusted_targets.<label>=<target>`, given as it stands, opens the checkpoint."""
    checkpoint = own_module_checkpoint(tmp_path)
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        cfg = compose("evaluate", overrides=[f"ckpt_path={checkpoint}"])
        hints = []
        for _ in range(3):  # one target per refusal: the data's, then the module's
            try:
                rebuild_trained(cfg, "project.evaluate")
                break
            except UntrustedConfig as refusal:
                hints.append(re.search(r"add (\+trusted_targets\S+)", str(refusal)).group(1))
                cfg = compose("evaluate", overrides=[f"ckpt_path={checkpoint}", *hints])
        datamodule, module = rebuild_trained(cfg, "project.evaluate")
    assert hints == [
        "+trusted_targets.RegressionData=tests.foreign_modules.RegressionData",
        "+trusted_targets.RegressionModule=tests.foreign_modules.RegressionModule",
    ]
    assert isinstance(module, RegressionModule) and isinstance(datamodule, RegressionData)


@pytest.mark.parametrize(
    ("target", "trusted"),
    [
        ("torch.optim.AdamW", True),  # listed by name in conf/trusted_targets.yaml
        ("torch.optim.lr_scheduler.OneCycleLR", True),
        ("project.example.networks.NeuralNetwork", True),  # named by conf/model/toy.yaml
        ("torch.nn.Linear", False),  # a namespace is trusted only where the user writes one
        ("torchvision.models.resnet18", False),
        ("torch.nn.utils.rnn.bind", False),
        ("torch.optim.optimizer.torch.load", False),
    ],
)
def test_by_default_a_checkpoint_may_name_only_what_is_listed_or_named_by_name(target: str, trusted: bool):
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        assert trusted_targets(compose("evaluate", overrides=["ckpt_path=unused"])).trusts(target) is trusted


@pytest.mark.parametrize(
    ("target", "trusted"),
    [
        ("torch.nn.Linear", True),  # a class of a package the user trusts
        ("torchvision.models.resnet18", True),  # a module function of one
        ("torch.nn.utils.rnn.bind", True),  # what that hands over: every function of it (Confinement is the net)
        ("torch.nn.Module.load_state_dict", False),  # a method: `<Class>.<method>` can write files...
        ("lightning.pytorch.callbacks.ModelCheckpoint.to_yaml", False),  # ...as this one does
        ("torch.optim.optimizer.torch.load", False),  # a name the package imported: torch.load itself
        ("torch.nn.modules.linear.torch.save", False),
        ("torchvision.models.ResNet18_Weights.IMAGENET1K_V1.get_state_dict", False),  # a bound method
        ("torchvision.models.no_such_network", True),  # nothing there: instantiate says so, as for any missing name
        ("torchvision.io.read_file", False),  # beside a trusted package, not in it
    ],
)
def test_a_package_the_user_trusts_trusts_what_it_defines_not_what_it_reaches(target: str, trusted: bool):
    written = ["+trusted_targets.nn=torch.nn.*", "+trusted_targets.tv=torchvision.models.*"]
    written += ["+trusted_targets.cb=lightning.pytorch.callbacks.*"]
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        cfg = compose("evaluate", overrides=["ckpt_path=unused", *written])
        assert trusted_targets(cfg).trusts(target) is trusted


@pytest.mark.parametrize(
    "given",
    [["my_project.*"], "my_project.*", {"mine": [1]}, {"mine": {"a": "b"}}],
    ids=["list", "string", "a number listed", "a mapping"],
)
def test_trusted_targets_that_is_not_names_mapped_to_targets_is_refused_in_one_line(given: object):
    with pytest.raises(
        UserError, match=r"^trusted_targets must map names to targets .*: e\.g\. \+trusted_targets\.mine="
    ):
        TrustedTargets.of({"model": {"_target_": "my_project.Module"}, "trusted_targets": given})


def test_the_trust_hint_for_a_name_of_no_package_is_that_name():
    """A dotted name may be one name (`print`): its hint trusts it under that name."""
    with pytest.raises(UntrustedConfig, match=r"add \+trusted_targets\.print=print \(or give"):
        check_stored_config({"model": {"_target_": "print"}}, "ckpt_path=x", TrustedTargets.of({}))


def test_a_package_pattern_trusts_that_package_not_one_whose_name_begins_alike():
    """`torch.*` is torch and its modules; torchvision is another package."""
    trust = TrustedTargets.of({"trusted_targets": {"t": "torch.*"}})
    assert trust.trusts("torch.nn.Linear")
    assert not trust.trusts("torchvision.models.resnet18")


def test_what_a_run_trusts_cannot_be_widened_once_it_is_made():
    """The trust judging a checkpoint is made before any of its targets is built: code that runs meanwhile (a trusted
    target's constructor) cannot add to it."""
    trust = TrustedTargets.of({"trusted_targets": {"t": "my_project.*"}})
    with pytest.raises(FrozenInstanceError):
        trust.patterns = ("os.*",)


def test_a_target_the_composed_config_gives_by_interpolation_is_trusted_by_the_name_it_resolves_to():
    """The user composed it: the run's trust, Hydra 1.4's whitelist for a job and the one for building a group hold the
    name (`${chosen}` resolved), not the interpolation's text; a callback switched off is no job's target."""
    cfg = OmegaConf.create(
        {
            "chosen": "my_project.Module",
            "model": {"_target_": "${chosen}"},
            "callbacks": {
                "on": {"_target_": "my_project.On"},
                "off": {"_target_": "my_project.Off", "enabled": False},
                "none": None,
            },
        }
    )
    assert trusted_targets(cfg).trusts("my_project.Module")
    assert composed_targets(cfg.model)() == ["my_project.Module"]
    assert job_whitelist(cfg) == ["my_project.Module", "my_project.On"]
    assert job_whitelist(OmegaConf.create({"model": {"_target_": "my_project.Module"}})) == ["my_project.Module"]


@pytest.mark.parametrize("target", ["null", "5", "[a, b]"])
def test_a_config_file_whose_target_is_no_name_is_passed_over(target: str, tmp_path: Path):
    """Such a file names nothing to trust (Hydra says what is wrong where a run uses it); the others still do."""
    (tmp_path / "odd.yaml").write_text(f"_target_: {target}\n")
    (tmp_path / "mine.yaml").write_text("_target_: my_project.Module\n")
    with initialize_config_dir(str(tmp_path), **VERSION_BASE):
        assert named_in_config_files() == {"my_project.Module"}


def test_a_config_source_that_is_not_there_does_not_hide_the_sources_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    (tmp_path / "mine.yaml").write_text("_target_: my_project.Module\n")
    sources = [("pkg", "no_such_package_of_configs"), ("file", str(tmp_path))]
    monkeypatch.setattr(trusted_targets_module, "config_sources", lambda: sources)
    assert named_in_config_files() == {"my_project.Module"}


def test_a_config_package_on_the_search_path_names_the_targets_of_its_yaml_files_at_any_depth(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """`hydra.searchpath=[pkg://<package>]`: configs shipped in a package vouch for their targets as a dir's do."""
    package = tmp_path / "configs_of_the_user"
    (package / "model").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "model" / "mine.yaml").write_text("_target_: my_project.Module\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(trusted_targets_module, "config_sources", lambda: [("pkg", "configs_of_the_user")])
    assert named_in_config_files() == {"my_project.Module"}


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


# What a target named exactly does as it is built, given the arguments a checkpoint stores: `Confinement` stops it
# writing outside the run, connecting out, starting a program or unpickling (tests/acting_targets.py tries each,
# catching the error it meets).


def acting_checkpoint(checkpoint: Path, written: Path, action: str, where: str) -> Path:
    """`checkpoint` whose network is `tests.acting_targets.ActingNetwork(action, where)`, with weights that fit it."""
    content = torch.load(checkpoint, map_location="cpu", weights_only=True)
    content["config"]["model"]["network"] = {"_target_": f"{ActingNetwork.__module__}.ActingNetwork"}
    content["config"]["model"]["network"] |= {"action": action, "where": where}
    module = ClassifierModule(nn.Linear(2, 2), functools.partial(torch.optim.SGD, lr=0.5))
    content["state_dict"] = module.state_dict()
    torch.save(content, written)
    return written


TRUST_ACTING = f"+trusted_targets.acting={ActingNetwork.__module__}.ActingNetwork"
REFUSED_AS = {
    "connect": "connect out",
    "fetch": "connect out",
    "start": "start a program",
    "shell": "start a program",
    "unpickle": "unpickle pathlib.PurePosixPath",
}


@pytest.mark.parametrize("action", ACTIONS)
def test_a_trusted_target_is_stopped_from_acting_outside_the_run_even_where_it_catches_the_refusal(
    action: str, tmp_path: Path, toy_checkpoint: Path
):
    bait = Bait(tmp_path / "bait").lay()
    with watched_port() as (port, accepted):
        where = f"127.0.0.1:{port}" if action in ("connect", "fetch") else str(bait.sentinel)
        if action in ("append", "delete", "rename", "copy_over"):
            where = str(bait.victim)
        elif action == "delete_tree":
            where = str(bait.directory)
        hostile = acting_checkpoint(toy_checkpoint, tmp_path / "acting.ckpt", action, where)
        with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
            cfg = compose("evaluate", overrides=[f"ckpt_path={hostile}", TRUST_ACTING])
            tried = REFUSED_AS.get(action, "write")
            with pytest.raises(ActedOutsideTheRun, match=rf"stored config describes tried to {tried}"):
                rebuild_trained(cfg, "project.evaluate")
    bait.assert_untouched()
    assert accepted == []


def test_a_rebuilt_run_writes_inside_its_own_dir_and_where_the_command_line_says(tmp_path: Path, toy_checkpoint: Path):
    """The run's dir, and a `data.<key>=` dir the user gave, are the run's: writing there goes on."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    inside = acting_checkpoint(toy_checkpoint, tmp_path / "inside.ckpt", "write", str(run_dir / "written"))
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE), as_a_run_holds_it() as hydra_node:
        overrides = [f"ckpt_path={inside}", TRUST_ACTING, f"hydra.runtime.output_dir={run_dir}"]
        rebuild_trained(hydra_node(compose("evaluate", overrides=overrides, return_hydra_config=True)), "evaluate")
    assert (run_dir / "written").is_file()


def test_the_confinement_ends_with_the_outermost_of_its_nested_entries(
    tmp_path: Path, toy_checkpoint: Path, mnist_root: Path
):
    """The MNIST data module's `setup` calls its `prepare_data`, each confined: once both end, nothing is (a DDP
    prediction gathers its ranks' shares by pickles after)."""
    checkpoint = mnist_checkpoint(toy_checkpoint, tmp_path / "mnist.ckpt", mnist_root)
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        cfg = compose("evaluate", overrides=[f"ckpt_path={checkpoint}", f"data.root={mnist_root}"])
        datamodule, _ = rebuild_trained(cfg, "evaluate")
    datamodule.setup("test")  # where the .gz files are unpacked: the dir the command line gave
    assert pickle.loads(pickle.dumps(PurePosixPath("unpickled after"))) == PurePosixPath("unpickled after")


def mnist_checkpoint(checkpoint: Path, written: Path, root: Path) -> Path:
    """`checkpoint` whose stored data is the MNIST data module at `root`, to be downloaded (as conf/data/mnist.yaml
    stores it): where it reads, and whether it fetches, are the checkpoint's to say."""
    data = {"_target_": "project.example.data.MNISTDataModule", "name": "mnist", "root": str(root), "download": True}
    return edited_copy(
        checkpoint, written, lambda config: config.update(data=data | {"batch_size": 2, "seed": 1, "val_size": 100})
    )


def test_a_stored_data_dir_and_download_switch_write_and_fetch_nothing_unless_the_command_line_gives_them(
    tmp_path: Path, toy_checkpoint: Path
):
    """The checkpoint's data module would make its dir (outside the run) and download into it: refused; with
    `data.root=` given it may write there, and still fetches nothing without `data.download=true`."""
    outside = tmp_path / "outside" / "data"
    hostile = mnist_checkpoint(toy_checkpoint, tmp_path / "mnist.ckpt", outside)
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        cfg = compose("evaluate", overrides=[f"ckpt_path={hostile}"])
        datamodule, _ = rebuild_trained(cfg, "project.evaluate")
        with pytest.raises(ActedOutsideTheRun, match=rf"tried to write {outside.parent} \(outside"):
            datamodule.prepare_data()
        cfg = compose("evaluate", overrides=[f"ckpt_path={hostile}", f"data.root={outside}"])
        datamodule, _ = rebuild_trained(cfg, "project.evaluate")
        with pytest.raises(ActedOutsideTheRun, match=r"tried to connect out \(urllib\.Request https://"):
            datamodule.prepare_data()
    assert outside.is_dir() and not any(outside.rglob("*.gz"))


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


def test_a_shards_index_takes_a_dtype_by_its_name_in_torch_alone():
    """DCP's index names dtypes (`torch.float32`); the same name in another module (`builtins.int`: `torch.int` is a
    dtype too) is refused: a name is trusted whole, module and all."""
    assert ShardsIndexUnpickler(io.BytesIO(pickle.dumps(torch.int32))).load() is torch.int32
    for module in ("builtins", "torchvision"):  # sorting before and after torch
        with pytest.raises(pickle.UnpicklingError, match=rf"^it names {module}\.int$"):
            ShardsIndexUnpickler(io.BytesIO(f"c{module}\nint\n.".encode())).load()


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


# The same as users meet them: the entry points in processes of their own (fresh interpreters where a target acts
# as it is built), each with its own working dir, HOME and TORCH_HOME, its proxies pointing at a port the test
# watches, on a finished toy run's last.ckpt made hostile. Each ends in one line, exit 2, no connection made, and
# nothing outside the run's dir changed.


@dataclass(frozen=True)
class Opening:
    """One way of opening a hostile file: the entry point, its arguments (`{dir}` is the case's dir, `{port}` the
    watched one), what its error line names, and `lay`, which writes the hostile file from a finished run's."""

    id: str
    module: str
    args: tuple[str, ...]
    names: tuple[str, ...]
    lay: Callable[[Path, Path, int], None]
    # Started as a user starts it, in a fresh interpreter: where what is refused is what a target does as it is built,
    # whose imports (and the files they would write) a Python forked from the tests' preloaded one has done already.
    fresh: bool = False


def opening(
    case_id: str, module: str, args: str, names: str, node: Callable[[Bait, int], object], at: str, fresh: bool = False
) -> Opening:
    def lay(case_dir: Path, finished: Path, port: int) -> None:
        bait = Bait(case_dir / "bait").lay()
        hostile = hostile_copy(finished, case_dir / "hostile.ckpt", at, node(bait, port))
        plant_as_newest_last(hostile, case_dir / "cwd" / "outputs")

    return Opening(case_id, module, tuple(args.split()), tuple(names.split(" | ")), lay, fresh)


def sharded_opening(case_id: str, make_hostile: Callable[[Path, Bait], Path], module: str, args: str) -> Opening:
    def lay(case_dir: Path, finished: Path, port: int) -> None:
        make_hostile(sharded_copy(finished, case_dir / "sharded.ckpt"), Bait(case_dir / "bait").lay())

    return Opening(case_id, module, tuple(args.split()), ("sharded.ckpt is a sharded checkpoint whose",), lay)


def mnist_opening(case_id: str, args: str, names: str, fresh: bool = False) -> Opening:
    def lay(case_dir: Path, finished: Path, port: int) -> None:
        Bait(case_dir / "bait").lay()
        mnist_checkpoint(finished, case_dir / "hostile.ckpt", case_dir / "bait" / "data")

    return Opening(case_id, "project.evaluate", tuple(args.split()), tuple(names.split(" | ")), lay, fresh)


FILE, NEWEST, NN = "ckpt_path={dir}/hostile.ckpt", "ckpt_path=last", "+trusted_targets.nn=torch.nn.*"
URL = "http://127.0.0.1:{port}/weights.pt"
OPENINGS = [
    opening(
        "evaluate-bind-chain",
        "project.evaluate",
        FILE,
        "model.network._target_=torch.nn.utils.rnn.bind | +trusted_targets.bind=torch.nn.utils.rnn.bind",
        lambda bait, port: HOSTILE["torch.nn.utils.rnn.bind"](bait),
        "model.network",
    ),
    opening(
        "predict-tuple-at-scheduler",
        "project.predict",
        FILE,
        "holds a tuple at model.scheduler",
        lambda bait, port: (HOSTILE["shutil.copyfile"](bait),),
        "model.scheduler",
    ),
    opening(
        "train-url-at-data",
        "project.train",
        f"{FILE} trainer.max_epochs=4",
        "data._target_=torch.hub.load_state_dict_from_url",
        lambda bait, port: {"_target_": "torch.hub.load_state_dict_from_url", "url": URL.format(port=port)},
        "data",
    ),
    opening(
        "train-last-copyfile-at-optimizer",
        "project.train",
        f"{NEWEST} trainer.max_epochs=4",
        "model.optimizer._target_=shutil.copyfile",
        lambda bait, port: HOSTILE["shutil.copyfile"](bait),
        "model.optimizer",
    ),
    opening(
        "evaluate-your-namespace-chained-to-a-connection",
        "project.evaluate",
        f"{FILE} {NN}",
        "tried to connect out (socket.",
        lambda bait, port: bind_chain("socket", "create_connection", ["127.0.0.1", port]),
        "model.network",
        fresh=True,
    ),
    opening(
        "predict-your-namespace-chained-to-makedirs",
        "project.predict",
        f"{FILE} {NN}",
        "tried to write {dir}/bait/sentinel",
        lambda bait, port: HOSTILE["torch.nn.utils.rnn.bind"](bait),
        "model.network",
    ),
    opening(
        "evaluate-escape-codes-in-a-target",
        "project.evaluate",
        FILE,
        "model.network._target_='evil\\x1b[2J.x', which is not the dotted name",
        lambda bait, port: {"_target_": "evil\x1b[2J.x"},
        "model.network",
    ),
    mnist_opening("evaluate-stored-data-dir-outside", FILE, "tried to write {dir}/bait/data", fresh=True),
    mnist_opening(
        "evaluate-download-not-asked-for", f"{FILE} data.root={{dir}}/yours/data", "tried to connect out (urllib"
    ),
    sharded_opening("evaluate-sharded-index", with_hostile_index, "project.evaluate", "ckpt_path={dir}/sharded.ckpt"),
    sharded_opening("evaluate-sharded-value", with_hostile_value, "project.evaluate", "ckpt_path={dir}/sharded.ckpt"),
    sharded_opening(
        "train-fsdp-sharded-index",
        with_hostile_index,
        "project.train",
        "trainer=fsdp trainer.max_epochs=4 ckpt_path={dir}/sharded.ckpt",
    ),
]


def own_environment(case_dir: Path, port: int) -> dict[str, str]:
    """A user's environment, but for a home, a torch cache and proxies of the case's own."""
    homes = {"HOME": case_dir / "home", "TORCH_HOME": case_dir / "home" / "torch", "MPLCONFIGDIR": case_dir / "mpl"}
    for home in homes.values():
        home.mkdir(parents=True, exist_ok=True)
    return {**os.environ, **proxied_to(port), **{name: str(path) for name, path in homes.items()}, "no_proxy": ""} | {
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO),
    }


def snapshot(case_dir: Path) -> dict[str, tuple]:
    """Every path under `case_dir` but the run's dir, matplotlib's cache and `yours` (a dir the command line gives
    the run), with its size and times."""
    return {
        str(path): (path.is_dir(), path.lstat().st_size, path.lstat().st_mtime_ns)
        for path in case_dir.rglob("*")
        if path.relative_to(case_dir).parts[0] not in ("run", "mpl", "yours")
    }


def open_as_a_user(case: Opening, case_dir: Path, finished: Path, port: int) -> tuple:
    """(the process's result, what the case's dir held before it, and after)."""
    case.lay(case_dir, finished, port)
    (case_dir / "cwd").mkdir(exist_ok=True)
    env = own_environment(case_dir, port)
    before = snapshot(case_dir)
    args = [f"hydra.run.dir={case_dir / 'run'}", *(arg.format(dir=case_dir, port=port) for arg in case.args)]
    if case.module == "project.train":
        args.append("logger=none")
    if case.fresh:
        command = [sys.executable, "-m", case.module, *args]
        result = subprocess.run(command, cwd=case_dir / "cwd", env=env, capture_output=True, text=True, timeout=300)
    else:
        result = run_module(case.module, *args, cwd=case_dir / "cwd", env=env)
    return result, before, snapshot(case_dir)


@pytest.fixture(scope="module")
def openings(tmp_path_factory: pytest.TempPathFactory, finished_toy_run: Path) -> Iterator[tuple[dict, list]]:
    """Every opening, side by side (each is mostly an interpreter starting), while one watched port listens."""
    with watched_port() as (port, accepted), ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        runs = {}
        for case in OPENINGS:
            case_dir = tmp_path_factory.mktemp(case.id)
            runs[case.id] = case_dir, pool.submit(open_as_a_user, case, case_dir, finished_toy_run, port)
        yield runs, accepted


@pytest.mark.slow
@pytest.mark.parametrize(
    "case", [pytest.param(case, id=case.id, marks=[pytest.mark.fresh] if case.fresh else []) for case in OPENINGS]
)
def test_opening_a_hostile_file_ends_in_one_line_changing_nothing_outside_the_run_and_connecting_nowhere(
    case: Opening, openings: tuple[dict, list]
):
    runs, accepted = openings
    case_dir, future = runs[case.id]
    result, before, after = future.result()
    names = [name.format(dir=case_dir) for name in case.names]
    assert_ends_in_error_line(result.returncode, result.stdout, result.stderr, USER_ERROR, *names)
    assert "\x1b" not in result.stderr + result.stdout
    assert before == after, f"changed outside the run: {sorted(set(before.items()) ^ set(after.items()))[:5]}"
    Bait(case_dir / "bait").assert_untouched()
    assert accepted == [], f"connections made: {accepted}"


def test_a_relative_path_is_judged_from_the_dir_it_is_relative_to(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A plain relative path from the working dir (the run's here), one given with a `dir_fd` from that dir."""
    run, outside = tmp_path / "run", tmp_path / "outside"
    for folder in (run, outside):
        folder.mkdir()
        (folder / "file").write_text("")
    monkeypatch.chdir(run)
    outside_fd = os.open(outside, os.O_RDONLY)
    try:
        with pytest.raises(ActedOutsideTheRun) as raised, Confinement("ckpt_path=x", (run,), False, "fix"):
            os.mkdir("made")
            os.chmod("file", 0o600)
            with contextlib.suppress(ActedOutsideTheRun):
                os.chmod("file", 0o600, dir_fd=outside_fd)
    finally:
        os.close(outside_fd)
    assert (run / "made").is_dir() and (run / "file").stat().st_mode & 0o777 == 0o600
    assert f"tried to write file (outside the dirs this run may write: {run})" in str(raised.value)


# Each operation Python audits as changing a path (`CHANGES_PATHS`), done by the real call with the paths its audit
# event lists at `at(position)`: the positions of the paths it changes, as this test states them, and the calls.
PATH_CHANGES: dict[str, tuple[tuple[int, ...], Callable[[Callable[[int], Path]], object]]] = {
    "os.mkdir": ((0,), lambda at: os.mkdir(at(0) / "made")),
    "os.rmdir": ((0,), lambda at: os.rmdir(at(0) / "empty")),
    "os.remove": ((0,), lambda at: os.remove(at(0) / "file")),
    "os.rename": ((0, 1), lambda at: os.rename(at(0) / "file", at(1) / "renamed")),
    "os.link": ((1,), lambda at: os.link(at(0) / "file", at(1) / "linked")),
    "os.symlink": ((1,), lambda at: os.symlink(at(0) / "file", at(1) / "symlinked")),
    "os.truncate": ((0,), lambda at: os.truncate(at(0) / "file", 0)),
    "os.chmod": ((0,), lambda at: os.chmod(at(0) / "file", 0o600)),
    "os.chown": ((0,), lambda at: os.chown(at(0) / "file", os.getuid(), os.getgid())),
    "os.utime": ((0,), lambda at: os.utime(at(0) / "file", (0, 0))),
    "os.mkfifo": ((0,), lambda at: os.mkfifo(at(0) / "fifo")),
    "os.mknod": ((0,), lambda at: os.mknod(at(0) / "node", stat.S_IFREG | 0o600)),
    "os.setxattr": ((0,), lambda at: os.setxattr(at(0) / "file", "user.mark", b"1")),
    "os.removexattr": ((0,), lambda at: os.removexattr(at(0) / "file", "user.mark")),
    "shutil.rmtree": ((0,), lambda at: shutil.rmtree(at(0) / "tree")),
    "shutil.copyfile": ((1,), lambda at: shutil.copyfile(at(0) / "file", at(1) / "copied")),
    "shutil.copytree": ((1,), lambda at: shutil.copytree(at(0) / "tree", at(1) / "copied_tree")),
    "shutil.move": ((0, 1), lambda at: shutil.move(at(0) / "file", at(1) / "moved")),
    "shutil.unpack_archive": ((1,), lambda at: shutil.unpack_archive(at(0) / "tree.zip", at(1) / "unpacked")),
    "shutil.make_archive": ((0,), lambda at: shutil.make_archive(str(at(0) / "made"), "zip", at(2) / "tree")),
    "sqlite3.connect": ((0,), lambda at: sqlite3.connect(at(0) / "made.db").close()),
}
# Those whose audit event also says which directory a relative path is taken from, through `dir_fd`.
RELATIVE_PATH_CHANGES = {
    "os.mkdir": lambda fd: os.mkdir("made", dir_fd=fd),
    "os.rmdir": lambda fd: os.rmdir("empty", dir_fd=fd),
    "os.remove": lambda fd: os.remove("file", dir_fd=fd),
    "os.symlink": lambda fd: os.symlink("file", "symlinked", dir_fd=fd),
    "os.chmod": lambda fd: os.chmod("file", 0o600, dir_fd=fd),
    "os.chown": lambda fd: os.chown("file", os.getuid(), os.getgid(), dir_fd=fd),
    "os.mkfifo": lambda fd: os.mkfifo("fifo", dir_fd=fd),
    "os.mknod": lambda fd: os.mknod("node", stat.S_IFREG | 0o600, dir_fd=fd),
}


def run_and_outside(tmp_path: Path) -> tuple[Path, Path]:
    """Two dirs of the same files: the run's, which it may write, and one outside it."""
    run, outside = tmp_path / "run", tmp_path / "outside"
    for folder in (run, outside):
        (folder / "empty").mkdir(parents=True)
        (folder / "tree").mkdir()
        (folder / "tree" / "leaf").write_text("leaf")
        (folder / "file").write_text("the user's own file")
        shutil.make_archive(str(folder / "tree"), "zip", folder / "tree")
    return run, outside


def contents(folder: Path) -> dict[str, tuple]:
    return {str(path): (path.lstat().st_mode, path.lstat().st_mtime_ns) for path in sorted(folder.rglob("*"))}


def test_every_audited_operation_that_changes_a_path_is_named_here():
    assert set(PATH_CHANGES) == set(CHANGES_PATHS)
    assert set(RELATIVE_PATH_CHANGES) == set(DIR_FD_ARGUMENT)


@pytest.mark.parametrize(
    ("event", "position"), [(event, position) for event, (changed, _) in PATH_CHANGES.items() for position in changed]
)
def test_an_operation_that_would_change_a_path_outside_the_run_is_refused_before_it_does(
    event: str, position: int, tmp_path: Path
):
    run, outside = run_and_outside(tmp_path)
    before = contents(outside)
    _, operation = PATH_CHANGES[event]
    refused = pytest.raises(ActedOutsideTheRun, match=rf"tried to write .*{outside}")
    with refused, Confinement("ckpt_path=x", (run,), False, "fix"):
        operation(lambda at: outside if at == position else run)
    assert contents(outside) == before


@pytest.mark.parametrize("event", list(PATH_CHANGES))
def test_an_operation_that_changes_paths_in_the_run_goes_on_whatever_it_reads_outside(event: str, tmp_path: Path):
    """Copying, linking or unpacking from outside into the run is the run's own business."""
    run, outside = run_and_outside(tmp_path)
    changed, operation = PATH_CHANGES[event]
    # Whether a filesystem keeps extended attributes is its own affair, not the confinement's.
    unsupported = contextlib.suppress(OSError) if "xattr" in event else contextlib.nullcontext()
    with Confinement("ckpt_path=x", (run,), False, "fix") as confinement, unsupported:
        operation(lambda at: run if at in changed else outside)
    assert confinement.refusal is None


@pytest.mark.parametrize("event", list(RELATIVE_PATH_CHANGES))
def test_a_relative_path_is_judged_from_its_dir_fd_for_every_operation_that_takes_one(
    event: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """From the run's working dir, a relative path in a dir outside is refused; from outside, one in the run's dir
    goes on."""
    run, outside = run_and_outside(tmp_path)
    before = contents(outside)
    descriptors = {folder: os.open(folder, os.O_RDONLY) for folder in (run, outside)}
    try:
        monkeypatch.chdir(run)
        with pytest.raises(ActedOutsideTheRun), Confinement("ckpt_path=x", (run,), False, "fix"):
            RELATIVE_PATH_CHANGES[event](descriptors[outside])
        monkeypatch.chdir(outside)
        with Confinement("ckpt_path=x", (run,), False, "fix"):
            RELATIVE_PATH_CHANGES[event](descriptors[run])
    finally:
        for descriptor in descriptors.values():
            os.close(descriptor)
    assert contents(outside) == before


@pytest.mark.parametrize(
    ("flags", "writes"),
    [
        (os.O_RDONLY, False),
        (os.O_RDONLY | os.O_APPEND, False),
        (os.O_WRONLY, True),
        (os.O_RDWR, True),
        (os.O_RDONLY | os.O_CREAT, True),
        (os.O_RDONLY | os.O_TRUNC, True),
    ],
    ids=["read", "read, append", "write", "read and write", "create", "truncate"],
)
def test_opening_a_file_outside_the_run_is_refused_where_its_flags_change_the_disk(
    flags: int, writes: bool, tmp_path: Path
):
    """`os.open` says by its flags alone whether it writes: to, creates or truncates the file (appending needs one
    of the write modes to write anything)."""
    run, outside = run_and_outside(tmp_path)
    with contextlib.ExitStack() as stack:
        if writes:
            stack.enter_context(pytest.raises(ActedOutsideTheRun, match="tried to write"))
        stack.enter_context(Confinement("ckpt_path=x", (run,), False, "fix"))
        os.close(os.open(outside / "file", flags))
    assert (outside / "file").read_text() == "the user's own file"


def test_hydra_1_4s_whitelist_of_a_job_is_its_configs_and_hydras_targets_then_the_patterns_it_trusts():
    """The whitelist `hydra.main` gives a job on Hydra 1.4 (`job_whitelist`), and that of a rebuilt run
    (`as_whitelist`): exact names sorted, then the user's `<package>.*` as typed."""
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE), as_a_run_holds_it() as hydra_node:
        both = "project.engine.run_dir.RunDirCheck"  # a callback of Hydra's, named by the job's config too
        overrides = ["+trusted_targets.mine=my_project.*", "hydra/launcher=basic", f"+callbacks.mine._target_={both}"]
        cfg = hydra_node(compose("train", overrides=overrides, return_hydra_config=True))
        listed = job_whitelist(cfg)
        trust = TrustedTargets.of(OmegaConf.to_container(cfg, resolve=True))
        rebuilt = trust.as_whitelist()  # with the config files' targets, the run's own among them
    patterns = trust.patterns
    assert "project.example.module.ClassifierModule" in listed, "the config's own target"
    assert "hydra._internal.core_plugins.basic_launcher.BasicLauncher" in listed, "Hydra's launcher"
    assert both in listed
    assert "project.example.module.ClassifierModule" in rebuilt and "project.example.data.ToyDataModule" in rebuilt
    assert listed[-1] == "my_project.*" and tuple(listed[-len(patterns) :]) == patterns
    assert listed[: -len(patterns)] == sorted(listed[: -len(patterns)])
    trust = TrustedTargets.of({"model": {"_target_": "my_project.Module"}, "trusted_targets": {"t": "torchvision.*"}})
    assert trust.as_whitelist() == ["my_project.Module", "torchvision.*"]


@pytest.mark.parametrize("database", ["", ":memory:"])
def test_an_in_memory_sqlite_database_is_no_write_wherever_the_run_works(
    database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """sqlite3's in-memory databases (Optuna's default storage among them) touch no file: they open even from a working
    dir outside the run, where a database file of that name would be refused."""
    run, outside = run_and_outside(tmp_path)
    monkeypatch.chdir(outside)
    with Confinement("ckpt_path=x", (run,), False, "fix"):
        sqlite3.connect(database).close()
    with pytest.raises(ActedOutsideTheRun), Confinement("ckpt_path=x", (run,), False, "fix"):
        sqlite3.connect("memory.db").close()
    with pytest.raises(ActedOutsideTheRun), Confinement("ckpt_path=x", (run,), False, "fix"):
        os.mkdir(":memory:")  # the name is sqlite's alone
    assert not (outside / "memory.db").exists() and not (outside / ":memory:").exists()


@pytest.mark.parametrize(
    "operation",
    [
        lambda folder: os.chmod(folder, 0o700),
        lambda folder: os.chown(folder, os.getuid(), os.getgid()),
        lambda folder: os.utime(folder, (0, 0)),
    ],
    ids=["chmod", "chown", "utime"],
)
def test_only_making_a_dir_that_exists_outside_the_run_goes_on_and_nothing_else_done_to_it(
    operation: Callable[[Path], object], tmp_path: Path
):
    """`os.mkdir` of a dir that is there changes nothing (the way to a run dir is made so); changing that dir is no
    such case."""
    run, outside = run_and_outside(tmp_path)
    before = contents(outside)
    with Confinement("ckpt_path=x", (run,), False, "fix"), contextlib.suppress(FileExistsError):
        os.mkdir(outside)
    with pytest.raises(ActedOutsideTheRun), Confinement("ckpt_path=x", (run,), False, "fix"):
        operation(outside)
    assert contents(outside) == before


def test_a_path_relative_to_a_dir_fd_that_names_no_dir_is_refused(tmp_path: Path):
    """Where the dir a relative path is taken from cannot be told (its descriptor is not open), the path could lie
    anywhere."""
    run, outside = run_and_outside(tmp_path)
    not_open = 10**6
    for operation in (lambda: os.mkdir("made", dir_fd=not_open), lambda: os.remove("file", dir_fd=not_open)):
        with pytest.raises(ActedOutsideTheRun, match="tried to write"), Confinement("x", (run,), False, "fix"):
            operation()


@pytest.mark.parametrize("event", [f"os.{name}" for name in UNAUDITED])
def test_an_operation_python_does_not_audit_judges_a_relative_path_from_the_working_dir(
    event: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """`os.mkfifo` and `os.mknod` raise their event with the `dir_fd` of none given: the working dir."""
    run, outside = run_and_outside(tmp_path)
    monkeypatch.chdir(run)
    with Confinement("ckpt_path=x", (run,), False, "fix") as confinement:
        RELATIVE_PATH_CHANGES[event](None)
    assert confinement.refusal is None
    monkeypatch.chdir(outside)
    with pytest.raises(ActedOutsideTheRun), Confinement("ckpt_path=x", (run,), False, "fix"):
        RELATIVE_PATH_CHANGES[event](None)
    assert not (outside / "fifo").exists() and not (outside / "node").exists()


def test_each_operation_is_judged_once_however_many_confinements_came_before(tmp_path: Path):
    """Python's audit hooks stay for the process's life: one is added, and the unaudited calls wrapped once (keeping
    their names), whichever confinement comes first."""
    judged = []

    class Counting(Confinement):
        def judge(self, event: str, arguments: tuple) -> None:
            judged.append(event)
            super().judge(event, arguments)

    for _ in range(3):
        with Confinement("ckpt_path=x", (tmp_path,), False, "fix"):
            pass
    with Counting("ckpt_path=x", (tmp_path,), False, "fix"):
        os.mkfifo(tmp_path / "fifo")
        os.remove(tmp_path / "fifo")
    assert judged.count("os.mkfifo") == 1 and judged.count("os.remove") == 1, judged
    assert os.mkfifo.__name__ == "mkfifo" and os.mknod.__name__ == "mknod"


def test_a_refused_operation_names_its_path_cut_to_200_characters(tmp_path: Path):
    """A line stays readable whatever a stored config names."""
    run, outside = run_and_outside(tmp_path)
    long = outside / ("x" * 250)
    with pytest.raises(ActedOutsideTheRun) as refused, Confinement("ckpt_path=x", (run,), False, "fix"):
        os.mkdir(long)
    assert f"tried to write {str(long)[:200]} (outside the dirs" in str(refused.value)
