"""Fixtures and the skips of what this machine cannot run; plain helpers live in tests/helpers.py."""

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from tests.faults import BAD_INPUT_TEST, ENV, run_bad_input
from tests.foreign_modules import FOREIGN_CONF
from tests.helpers import (
    CHROMEDRIVER,
    CHROMIUM,
    FASHION_MNIST_DEBIAN,
    IN_PROCESS_ONLY,
    check_ok,
    fresh_interpreters,
    part_present,
    run_module,
)
from tests.idx_files import write_idx_dataset

# Prints, at the end of every run, the CPU the suite used against its wall time and the tests that waited longest.
pytest_plugins = ("tests.suite_clock",)

# Set by coverage (`make coverage`) for the processes it measures, this one included.
UNDER_COVERAGE = "COVERAGE_PROCESS_CONFIG" in os.environ


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip, with the reason, what this machine cannot run; group and order the tests for the two workers."""
    skip_unrunnable(items)
    group_by_shared_fixtures(items)
    items.sort(key=run_order)


def skip_unrunnable(items: list[pytest.Item]) -> None:
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; none is visible here")
    skip_traced = pytest.mark.skip(
        reason="Hydra prints its whole traceback while a tracer runs (hydra._internal.utils.is_under_debugger), "
        "as coverage's does: `make test` checks this error's one-line report"
    )
    skip_real = pytest.mark.skip(
        reason=f"needs Debian's Fashion-MNIST in {FASHION_MNIST_DEBIAN} (`make system-deps` as root)"
    )
    skip_browser = pytest.mark.skip(
        reason=f"needs Debian's chromium and chromium-driver ({CHROMIUM}, {CHROMEDRIVER}): `make system-deps` as root"
    )
    browser_installed = CHROMIUM.is_file() and CHROMEDRIVER.is_file()
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_gpu)
        if "realdata" in item.keywords and not FASHION_MNIST_DEBIAN.is_dir():
            item.add_marker(skip_real)
        if "browser" in item.keywords and not browser_installed:
            item.add_marker(skip_browser)
        if item.get_closest_marker("hydra_report") and UNDER_COVERAGE:
            item.add_marker(skip_traced)


def group_by_shared_fixtures(items: list[pytest.Item]) -> None:
    """Tests that share a module-scoped fixture (a trained run, a cluster) run on one xdist worker, which builds it
    once; every other test goes to whichever worker is free (`--dist loadgroup`). The Slurm tests are one group:
    their jobs queue for the same two nodes.
    """
    parent: dict[str, str] = {}

    def root(name: str) -> str:
        while parent.setdefault(name, name) != name:
            name = parent[name]
        return name

    shared: dict[pytest.Item, list[str]] = {}
    for item in items:
        definitions = getattr(item, "_fixtureinfo", None)
        names = [
            f"{item.module.__name__}::{name}"
            for name, fixture_defs in (definitions.name2fixturedefs.items() if definitions else ())
            if fixture_defs and fixture_defs[-1].scope == "module"
        ]
        if item.get_closest_marker("slurm"):
            names.append("slurm")
        for name in names[1:]:
            parent[root(name)] = root(names[0])
        shared[item] = names
    for item, names in shared.items():
        if names:
            item.add_marker(pytest.mark.xdist_group(root(names[0])))


def run_order(item: pytest.Item) -> int:
    """The longest work first, so that neither worker is left with a long tail: the Slurm jobs, the other groups,
    then the slow tests, then the quick ones."""
    if item.get_closest_marker("slurm"):
        return 0
    if item.get_closest_marker("xdist_group"):
        return 1
    return 2 if item.get_closest_marker("slow") else 3


@pytest.fixture(autouse=True)
def interpreters(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test marked `fresh` starts its processes as a user does, in interpreters of their own, and so do they (their
    ranks, launchers, Slurm tasks); every other test's are forked from the preloaded Python (docs/testing.md)."""
    if request.node.get_closest_marker("fresh") is None:
        yield
        return
    with fresh_interpreters():
        yield


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """How many of the tests that ran started fresh interpreters, so that a report shows which way each one ran."""
    ran = {
        report.nodeid: "fresh" in report.keywords
        for reports in terminalreporter.stats.values()
        for report in reports
        if isinstance(report, pytest.TestReport) and report.when == "call"
    }
    if ran:
        fresh = sum(ran.values())
        terminalreporter.write_line(
            f"interpreters: {fresh} of {len(ran)} tests that ran started fresh ones (marked `fresh`), "
            f"the other {len(ran) - fresh} forked them from the preloaded Python (docs/testing.md)"
        )


@pytest.fixture(scope="session", autouse=True)
def no_processes_in_fast_runs() -> Iterator[None]:
    """Under `make test-fast`, a test that starts a subprocess (a training run, torchrun, a shell) skips right there.

    Session-wide and first, so that module fixtures which train in a process skip their tests too.
    """
    if not IN_PROCESS_ONLY:
        yield
        return
    original = subprocess.Popen.__init__
    subprocess.Popen.__init__ = skip_process
    yield
    subprocess.Popen.__init__ = original


def skip_process(*args: object, **kwargs: object) -> None:
    pytest.skip("starts a process: `make test` runs it")


# Where a developer's own W&B login lives: no run of the tests may use it.
WANDB_CREDENTIALS = ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL", "WANDB_PROJECT", "WANDB_ENTITY")


@pytest.fixture(scope="session", autouse=True)
def wandb_kept_local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Where the optional wandb part is here (logger=wandb, and logger=many, which includes it), every run the tests
    start logs offline into its run dir, logged in nowhere, its W&B files (cache, settings, staging) in a temporary
    directory rather than $HOME, through one wandb-core service for the session (named in WANDB_SERVICE).

    The shared service is what makes a shell's `python` work under W&B here: the tests' preloaded Python forks it
    and it answers `os.getpid()` with its client's pid (tests/preloaded_python.py), which wandb hands its own new
    service as the parent to watch; that service, whose real parent is another process, would take the parent for
    gone and quit, and the run would wait for it forever. The part's tests of the online decision lift WANDB_MODE.
    """
    if not part_present("wandb") or importlib.util.find_spec("wandb") is None:
        yield
        return
    home = tmp_path_factory.mktemp("wandb-home")
    with pytest.MonkeyPatch.context() as patch:
        for name in WANDB_CREDENTIALS:
            patch.delenv(name, raising=False)
        patch.setenv("WANDB_MODE", "offline")
        patch.setenv("NETRC", str(home / "netrc"))  # no such file: no login
        for name in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
            (home / name).mkdir()
            patch.setenv(name, str(home / name))
        if IN_PROCESS_ONLY:  # no run starts a process, so none needs the service
            yield
            return
        core = [sys.executable, "-m", "wandb", "beta", "core"]
        started = subprocess.run([*core, "start"], capture_output=True, text=True, timeout=120)
        assert started.returncode == 0, started.stderr
        patch.setenv("WANDB_SERVICE", started.stdout.strip())
        try:
            yield
        finally:
            subprocess.run([*core, "stop"], capture_output=True, timeout=120)


@pytest.fixture(scope="session")
def mnist_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data root holding small MNIST-format files (400 train, 100 test images)."""
    root = tmp_path_factory.mktemp("mnist-data")
    write_idx_dataset(root, "MNIST")
    return root


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


@pytest.fixture
def lightning_rank(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """Sets this process's rank as Lightning's DDP launcher announces it: RANK alone (no srun, no torchrun)."""
    for variable in ("SLURM_PROCID", "TORCHELASTIC_RUN_ID", "LOCAL_RANK"):
        monkeypatch.delenv(variable, raising=False)
    return lambda rank: monkeypatch.setenv("RANK", rank)


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's working directory, with the config files of their own modules in my_conf/ (`helpers.train_own`)."""
    cwd = tmp_path_factory.mktemp("own-modules")
    shutil.copytree(FOREIGN_CONF, cwd / "my_conf")
    return cwd


@pytest.fixture(scope="module")
def finished_toy_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The last.ckpt of a toy run that trained to its end (3 epochs)."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    check_ok(run_module("project.train", "logger=none", f"hydra.run.dir={run_dir}", cwd=run_dir.parent, env=ENV))
    return run_dir / "checkpoints" / "last.ckpt"


@pytest.fixture(scope="module")
def bad_input_runs(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    mnist_root: Path,
    finished_toy_run: Path,
) -> Iterator[dict[str, tuple[Path, Future]]]:
    """Every selected bad-input case of the module (tests.faults.bad_input_test), started side by side (one per
    core) when the first is needed: each is mostly Python and Lightning starting up, so in parallel they take a
    fraction of the time."""
    selected = [
        item
        for item in request.session.items
        if getattr(item, "originalname", None) == BAD_INPUT_TEST and item.module is request.module
    ]
    cases = [item.callspec.params["case"] for item in selected]
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        runs = {}
        for case in cases:
            case_dir = tmp_path_factory.mktemp(case.id)
            runs[case.id] = case_dir, pool.submit(run_bad_input, case, case_dir, mnist_root, finished_toy_run)
        yield runs
