"""What a plain `python -m project.train` imports: no optional part it was not asked for, and a small part of project/.

Hydra imports every plugin as it starts: the Optuna sweeper and the parallel launcher register their configs there and
import their work (and Optuna, SQLAlchemy) only when a sweep uses them. The mid-epoch checkpoint, part of
callbacks=default, is built (and its part imported) only when switched on (`callbacks.mid_epoch_checkpoint.enabled`).
"""

import json
from pathlib import Path

import pytest

from project.engine.build import configured_callbacks
from project.engine.trusted_targets import job_whitelist
from tests.helpers import MID_EPOCH_ON, REPO, check_ok, requires, run_module
from tests.test_config import compose_train

# A module that runs project.train as `python -m project.train <overrides>` does (project/__init__.py reads
# sys.orig_argv to know a training run), then writes the file of every module the process holds at its end, by name,
# to the JSON file its first argument names.
RUN_AND_LIST_MODULES = """
import json, runpy, sys
listing, *overrides = sys.argv[1:]
sys.argv[1:] = overrides
sys.orig_argv = [sys.executable, "-m", "project.train", *overrides]
try:
    runpy.run_module("project.train", run_name="__main__", alter_sys=True)
finally:
    modules = {name: getattr(module, "__file__", None) for name, module in dict(sys.modules).items()}
    with open(listing, "w") as file:
        json.dump(modules, file)
"""
# A newcomer reads what a plain run runs: the files of project/ it imports stay few.
MOST_FILES_OF_PROJECT = 30


@pytest.mark.slow
@pytest.mark.fresh  # a process forked from the preloaded Python holds the modules that one imported
def test_a_plain_run_imports_no_optional_part_and_at_most_30_files_of_project(tmp_path: Path):
    (tmp_path / "run_and_list_modules.py").write_text(RUN_AND_LIST_MODULES)
    listing = tmp_path / "modules.json"
    overrides = ["trainer.max_epochs=1", "logger=none", f"hydra.run.dir={tmp_path / 'run'}"]
    check_ok(run_module("run_and_list_modules", str(listing), *overrides, cwd=tmp_path))
    modules = json.loads(listing.read_text())

    optional = sorted(name for name in modules if name == "project.optional" or name.startswith("project.optional."))
    assert optional == [], "a plain run imports no optional part"
    assert not {"optuna", "sqlalchemy"} & set(modules), "Hydra's plugin scan leaves the Optuna search unimported"
    project_dir = REPO / "project"
    imported = {Path(file).resolve() for file in modules.values() if file}
    # project/train.py itself ran as __main__, which the listing holds as the module that ran it.
    files = sorted({file for file in imported if file.is_relative_to(project_dir)} | {project_dir / "train.py"})
    assert project_dir / "engine" / "build.py" in files, "the listing holds the run's modules"
    assert len(files) <= MOST_FILES_OF_PROJECT, files


@requires("mid_epoch")
def test_the_mid_epoch_checkpoint_is_built_only_when_switched_on(tmp_path: Path):
    """Off (the default), its config is skipped before it is built, so its part is not imported."""

    def built(*overrides: str) -> list[str]:
        callbacks = configured_callbacks(compose_train(tmp_path, *overrides).callbacks)
        return [type(callback).__name__ for callback in callbacks]

    assert "MidEpochCheckpoint" not in built()
    assert built(MID_EPOCH_ON).count("MidEpochCheckpoint") == 1


@requires("mid_epoch")
def test_hydra_1_4s_whitelist_of_a_plain_run_leaves_out_the_callback_switched_off(tmp_path: Path):
    """Hydra 1.4 imports each target on a job's whitelist: one of a callback switched off is not listed."""
    target = "project.optional.mid_epoch.checkpoint.MidEpochCheckpoint"
    assert target not in job_whitelist(compose_train(tmp_path))
    assert target in job_whitelist(compose_train(tmp_path, MID_EPOCH_ON))
