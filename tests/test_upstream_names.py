"""The private names of Lightning, torch, Hydra and OmegaConf that the engine and the entry points use sit in one
module, project/engine/upstream.py, each with the upstream issue that would remove it (docs/engine.md lists them)."""

import ast
import json.decoder
import logging
import re
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.pytorch.callbacks import ModelCheckpoint, TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.connectors.logger_connector.result import _Metadata, _ResultMetric, _Sync
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationKeyError

from project.engine import upstream
from project.engine.checkpoints import check_shards

PROJECT = Path(__file__).resolve().parents[1] / "project"
UPSTREAM = PROJECT / "engine" / "upstream.py"
# Names with a leading underscore that are public: Hydra's config keys, and `os._exit`.
PUBLIC = {"_target_", "_partial_", "_recursive_", "_convert_", "_args_", "_exit"}
# What only Hydra 1.4 has (`make test-hydra1.4`, which CI runs after `make test`, runs these).
HYDRA_1_4_ONLY = pytest.mark.skipif(not upstream.HAS_EXECUTION_WHITELIST, reason="Hydra 1.3 has no execution whitelist")


def private_names(source: str) -> set[str]:
    """The single-underscore names a module's code uses (not dunders): identifiers, imported names, and the strings
    that are one (a frame's or a class's name matched as text), or a dotted path through one."""
    tree = ast.parse(source)
    in_fstrings = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.alias):
            names.update(node.name.split("."))
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.update(node.module.split("."))
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in in_fstrings:
            names.update(part for part in node.value.split(".") if part.isidentifier())
    private = {name for name in names if name.startswith("_") and not name.startswith("__") and len(name) > 1}
    return private - PUBLIC


def checked_files() -> list[Path]:
    return [path for path in [*PROJECT.glob("*.py"), *PROJECT.glob("engine/*.py")] if path != UPSTREAM]


@pytest.mark.parametrize("path", checked_files(), ids=lambda path: str(path.relative_to(PROJECT.parent)))
def test_private_upstream_names_are_used_only_in_upstream_py(path: Path) -> None:
    assert private_names(path.read_text()) == set(), (
        f"{path.name} uses private names: move each into project/engine/upstream.py with its upstream issue"
    )


def test_the_check_finds_a_private_name_in_each_form_it_takes() -> None:
    source = (
        "from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher\n"
        "import torch\n"
        "norms = torch._foreach_norm(grads)\n"
        "STAGES = {'_fit_impl': 'while training'}\n"
        "SWEEPER = 'hydra._internal.core_plugins.basic_sweeper.BasicSweeper'\n"
        "class Bar:\n"
        "    def _save_topk_checkpoint(self): ...\n"
        "hook = f'{stage}_dataloader'\n"
        "config = {'_target_': 'x.Y'}\n"
        "os._exit(1)\n"
    )
    expected = {"_SubprocessScriptLauncher", "_foreach_norm", "_fit_impl", "_internal", "_save_topk_checkpoint"}
    assert private_names(source) == expected


def test_upstream_py_names_an_issue_or_a_version_for_each_private_name_it_holds() -> None:
    """Each top-level definition of upstream.py that touches a private name says in its docstring or the comment
    above it which upstream issue or version removes it."""
    source = UPSTREAM.read_text()
    lines = source.splitlines()
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)) or not private_names(ast.get_source_segment(source, node)):
            continue
        above = "\n".join(lines[max(0, node.lineno - 4) : node.lineno - 1])
        said = (ast.get_docstring(node) if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else None) or ""
        assert any(mark in said + above for mark in ("#", "Lightning 2", "Hydra 1", "torch 2", "OmegaConf 2")), (
            f"upstream.py line {node.lineno}: say which upstream issue or version removes it"
        )


def test_a_dotted_name_is_located_as_hydra_finds_a_target_and_one_naming_nothing_is_none():
    """Hydra 1.4's whitelist adds each target's defined name: a name whose module does not import names nothing."""
    assert upstream.located("json.decoder.JSONDecoder") is json.decoder.JSONDecoder
    assert upstream.located("json.no_such_module.Decoder") is None
    assert upstream.located("no_such_package.Decoder") is None


def test_a_submodule_not_yet_imported_is_located_by_importing_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A package need not import its submodules: the name is found as Hydra finds it, importing each in turn."""
    package = tmp_path / "package_of_the_user"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "networks.py").write_text("class Net:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "package_of_the_user", raising=False)
    monkeypatch.delitem(sys.modules, "package_of_the_user.networks", raising=False)
    found = upstream.located("package_of_the_user.networks.Net")
    assert found is sys.modules["package_of_the_user.networks"].Net
    assert upstream.located("package_of_the_user.networks") is sys.modules["package_of_the_user.networks"]


def logged_metric(reduce_fx: str, *values: tuple[float, int]) -> _ResultMetric:
    """A metric of one process logged as `(value, batch size)` pairs, reduced by `reduce_fx`."""
    meta = _Metadata(fx="validation_step", name="val/metric", reduce_fx=reduce_fx)
    meta.sync = _Sync()  # one process: the identity
    metric = _ResultMetric(meta, is_tensor=True)
    for value, batch_size in values:
        metric.update(torch.tensor(value), batch_size=batch_size)
    return metric


def test_a_logged_metrics_mean_weighs_each_batch_by_its_samples():
    """`mean_of_samples` (Lightning-AI/pytorch-lightning#21859): 1.0 over 2 samples and 0.0 over 1 is 2/3, in floats."""
    assert torch.isclose(upstream.mean_of_samples(logged_metric("mean", (1.0, 2), (0.0, 1))), torch.tensor(2 / 3))
    summed = logged_metric("sum", (1.0, 2), (3.0, 1))
    assert upstream.mean_of_samples(summed) == 4.0, "a sum is Lightning's to reduce"


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # DCP saving in one process, as asked
def test_the_classes_dcp_writes_in_its_index_of_shards_are_those_the_index_reader_takes(tmp_path: Path):
    """`SHARDS_INDEX_CLASSES`: a sharded checkpoint of a tensor and plain values, as DCP writes it here, opens."""
    dcp.save({"weight": torch.zeros(2, 3), "step": 7, "name": "run"}, checkpoint_id=tmp_path)
    check_shards(tmp_path)


def test_each_upstream_log_message_is_dropped_from_the_logger_that_emits_it_and_nothing_else_is():
    """`LOG_MESSAGES`: a logger's filter drops its own listed noise; the project's own lines through the same logger
    (`rank_zero_info`), and another logger's listed text, pass."""
    upstream.silence_upstream_noise()
    texts = {emitter: re.sub(r"\\(.)", r"\1", pattern) + " ..." for emitter, pattern, _, _ in upstream.LOG_MESSAGES}
    for emitter in texts:
        [dropping] = [found for found in logging.getLogger(emitter).filters if isinstance(found, upstream.DropMessages)]
        for other, text in texts.items():
            assert dropping.filter(logging.makeLogRecord({"msg": text})) is (other != emitter), (emitter, text)
        assert dropping.filter(logging.makeLogRecord({"msg": "model.network: names no dropout: left out"}))


def test_a_resolver_is_registered_through_the_api_of_the_omegaconf_installed_without_a_warning():
    """`register_resolver`: OmegaConf 2.4 deprecates 2.3's `register_new_resolver` (the Hydra 1.4 pass runs this)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        upstream.register_resolver("tests_upstream_names_one", lambda: 1, replace=True)
    assert OmegaConf.create({"value": "${tests_upstream_names_one:}"}).value == 1


def test_a_checkpoint_callback_saves_as_lightnings_unless_the_metric_it_monitors_was_not_logged(
    monkeypatch: pytest.MonkeyPatch,
):
    """`TopKCheckpoint`: without a metric to monitor, or with it logged, Lightning's own top-k saving; with it missing,
    `monitor_not_logged` (where Lightning 2.6 raises)."""
    saved, not_logged = [], []
    monkeypatch.setattr(ModelCheckpoint, "_save_topk_checkpoint", lambda self, trainer, _: saved.append(self.monitor))

    class Watched(upstream.TopKCheckpoint):
        def monitor_not_logged(self, trainer, monitor_candidates) -> None:
            not_logged.append(self.monitor)

    logged = {"val/loss": torch.tensor(0.5)}
    for monitor in (None, "val/loss", "val/acc"):
        Watched(monitor=monitor)._save_topk_checkpoint(None, logged)
    assert saved == [None, "val/loss"] and not_logged == ["val/acc"]


def test_the_open_bars_of_a_progress_bar_are_the_ones_it_holds():
    """`open_tqdm_bars`, which the engine closes on an exception: a stage that has no bar (yet) adds none."""
    progress = TQDMProgressBar()
    assert upstream.open_tqdm_bars(progress) == []
    progress.train_progress_bar = Tqdm(disable=True)
    assert upstream.open_tqdm_bars(progress) == [progress.train_progress_bar]


@pytest.mark.parametrize("start_method", ["popen", "spawn"])
def test_a_strategy_with_its_own_script_launcher_uses_it_where_lightning_would_rerun_the_script(start_method: str):
    """`OwnScriptLauncher` (Lightning-AI/pytorch-lightning#18175): where Lightning would re-run the script for ranks
    1..N-1 (`ddp`), the strategy's own launcher does; `ddp_spawn`'s launcher stays Lightning's."""

    class Own(upstream.ScriptLauncher):
        pass

    class Strategy(upstream.OwnScriptLauncher, DDPStrategy):
        def script_launcher(self) -> Own:
            return Own(self.cluster_environment, self.num_processes, self.num_nodes)

    devices = [torch.device("cpu")] * 2
    strategy = Strategy(parallel_devices=devices, cluster_environment=LightningEnvironment(), start_method=start_method)
    strategy._configure_launcher()
    assert (
        isinstance(strategy.launcher, Own) if start_method == "popen" else upstream.is_spawn_launcher(strategy.launcher)
    )


def test_a_class_or_function_is_named_where_it_is_defined_and_nothing_else_is_named():
    """`defined_name`: what Hydra 1.4's whitelist and a trusted package's check compare (`json.JSONDecoder` is
    defined in `json.decoder`)."""
    assert upstream.defined_name(json.JSONDecoder) == "json.decoder.JSONDecoder"
    assert upstream.defined_name(json.dumps) == "json.dumps"
    assert upstream.defined_name(json) is None and upstream.defined_name(json.JSONDecoder().decode) is None


def test_a_resolver_is_asked_again_at_each_resolution_unless_told_to_cache():
    """`${subfolders:<dir>}` counts a dir's folders as they are now, not as they were the first time."""
    calls = iter(range(10))
    upstream.register_resolver("tests_upstream_names_counted", lambda: next(calls), replace=True)
    config = OmegaConf.create({"value": "${tests_upstream_names_counted:}"})
    assert (config.value, config.value) == (0, 1)


def test_a_resolver_registered_again_under_its_name_is_refused_unless_it_replaces_the_first():
    upstream.register_resolver("tests_upstream_names_twice", lambda: 1, replace=True)
    with pytest.raises(ValueError, match="tests_upstream_names_twice"):
        upstream.register_resolver("tests_upstream_names_twice", lambda: 2)
    assert OmegaConf.create({"value": "${tests_upstream_names_twice:}"}).value == 1


@HYDRA_1_4_ONLY
def test_a_whitelist_inside_another_replaces_it():
    """`execution_whitelist`: what a checkpoint's config may build is its own trust, not the job's whitelist around
    it as well."""
    with upstream.execution_whitelist(lambda: ["json.dumps"]), upstream.execution_whitelist(lambda: ["json.loads"]):
        assert instantiate({"_target_": "json.loads", "s": "1"}) == 1
        with pytest.raises(InstantiationException, match="'json.dumps' is not in the Hydra execution whitelist"):
            instantiate({"_target_": "json.dumps", "obj": 1})


@HYDRA_1_4_ONLY
def test_a_job_whose_config_cannot_be_read_for_its_whitelist_runs_to_say_so_in_its_own_line():
    """`hydra_main` on Hydra 1.4: a `${...}` naming nothing breaks the whitelist's reading of the config; the job,
    whose config check names the key in one line, runs rather than a traceback from the whitelist."""
    ran = []

    def unreadable(cfg: DictConfig) -> list[str]:
        raise InterpolationKeyError("Interpolation key 'oops' not found")

    job = upstream.hydra_main("conf", "train", unreadable)(ran.append).__wrapped__
    job(OmegaConf.create({"x": 1}))
    assert ran == [{"x": 1}]


@HYDRA_1_4_ONLY
def test_the_job_hydra_main_runs_on_hydra_1_4_stands_as_the_entry_points_function():
    """Hydra takes the config path as relative to the task function's module: the job wrapping it must carry the
    entry point's module and name, not upstream.py's."""

    def train(cfg: DictConfig) -> None:
        """An entry point's task."""

    job = upstream.hydra_main("conf", "train", lambda cfg: [])(train).__wrapped__
    assert (job.__module__, job.__qualname__, job.__doc__) == (train.__module__, train.__qualname__, train.__doc__)
