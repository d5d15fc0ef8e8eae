"""Every run's receipt (`receipt.json`, docs/reproducibility.md): the code, environment, machine and launch it ran
with, no secret among them; a tree without git still hashed; a run carried on keeps its earlier starts."""

import hashlib
import json
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from project.engine import run_dir as run_dirs
from project.engine.run_dir import RECEIPT_FILE, read_receipt, write_receipt
from tests.helpers import REPO, check_ok, git, run_module, scratch_repository

# Values a user's shell may hold that no file of a run may ever show.
SECRETS = {
    "WANDB_API_KEY": "wandb-secret-4f9c2e1d7a",
    "AWS_SECRET_ACCESS_KEY": "aws-secret-8b3e0c6f51",
    "HF_TOKEN": "hf_tokenZq7Xw3Rk9Lm2Np5",
}
# What a user's own project keeps outside the repository: a module, and config files naming it.
USER_MODULE = "their_modules"
# The scratch repository's one uncommitted change, and an untracked source file.
CHANGED_LINE = "# a line not yet committed\n"
UNTRACKED = "notes_of_mine.py"


def user_project(destination: Path) -> Path:
    """tests/foreign_modules.py as a user's module outside the repository, with its config files."""
    shutil.copy(REPO / "tests" / "foreign_modules.py", destination / f"{USER_MODULE}.py")
    for group in ("model", "data"):
        text = (REPO / "tests" / "foreign_conf" / group / "regression.yaml").read_text()
        (destination / "my_conf" / group).mkdir(parents=True)
        (destination / "my_conf" / group / "theirs.yaml").write_text(text.replace("tests.foreign_modules", USER_MODULE))
    return destination


@pytest.fixture(scope="module")
def dirty_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, Path]]:
    """(run dir, scratch repository, user's dir) of one epoch of a user's own module, trained from a scratch
    repository with an uncommitted change and an untracked file, secrets in its environment."""
    repository = scratch_repository(tmp_path_factory.mktemp("repository"))
    with (repository / "project" / "example" / "metrics.py").open("a") as file:
        file.write(CHANGED_LINE)
    (repository / UNTRACKED).write_text("SETTING = 1\n")
    user = user_project(tmp_path_factory.mktemp("user"))
    run_dir = user / "run"
    overrides = ["model=theirs", "data=theirs", "optimized_metric=val/mse", "optimized_mode=min", "logger=none"]
    environment = {"PYTHONPATH": str(user), "CUBLAS_WORKSPACE_CONFIG": ":4096:8", **SECRETS}
    check_ok(
        run_module(
            "project.train",
            f"hydra.searchpath=[file://{user / 'my_conf'}]",
            *overrides,
            "trainer.max_epochs=1",
            f"hydra.run.dir={run_dir}",
            cwd=repository,
            env=environment,
        )
    )
    yield run_dir, repository, user


def segment_of(run_dir: Path) -> dict:
    (segment,) = read_receipt(run_dir / RECEIPT_FILE)["segments"]
    return segment


@pytest.mark.slow
def test_the_receipt_names_the_commit_and_keeps_the_uncommitted_change_and_untracked_sources(dirty_run):
    run_dir, repository, _ = dirty_run
    code = segment_of(run_dir)["code"]
    assert code["commit"] == git(repository, "rev-parse", "HEAD").strip()
    assert (code["branch"], code["dirty"], code["toplevel"]) == ("main", True, str(repository))
    patch = (run_dir / code["uncommitted_diff"]).read_text()
    assert "+++ b/project/example/metrics.py" in patch and f"+{CHANGED_LINE}" in patch
    assert (run_dir / code["untracked"][UNTRACKED]).read_text() == "SETTING = 1\n"


@pytest.mark.slow
def test_a_users_module_outside_the_tree_is_hashed_and_copied_and_the_trees_are_named_by_path(dirty_run):
    run_dir, repository, user = dirty_run
    files = segment_of(run_dir)["code"]["target_files"]
    theirs = user / f"{USER_MODULE}.py"
    entry = files[str(theirs.resolve())]
    assert entry["targets"] == [f"{USER_MODULE}.RegressionData", f"{USER_MODULE}.RegressionModule"]
    assert entry["sha256"] == hashlib.sha256(theirs.read_bytes()).hexdigest()
    assert (run_dir / entry["copy"]).read_bytes() == theirs.read_bytes()
    history = files["project/engine/history.py"]  # in the tree: named there, not copied
    assert history["sha256"] == hashlib.sha256((repository / "project/engine/history.py").read_bytes()).hexdigest()
    assert "copy" not in history


@pytest.mark.slow
def test_the_receipt_records_versions_machine_and_launch(dirty_run):
    run_dir, repository, _ = dirty_run
    segment = segment_of(run_dir)
    environment, machine, launch = segment["environment"], segment["machine"], segment["launch"]
    assert environment["torch"]["version"] == torch.__version__
    assert environment["distributions"]["torch"] == torch.__version__.split("+")[0]
    assert environment["python"] == sys.version.split()[0]
    assert environment["variables"]["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    lock = next(repository.glob("constraints-py*.txt"), None)
    if lock is not None:
        assert environment["lock_file"]["sha256"] == hashlib.sha256(lock.read_bytes()).hexdigest()
    assert machine["cpu"]["cores_given"] >= 1 and machine["memory_bytes"] > 0
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file() and "cpu family" in cpuinfo.read_text():  # an x86 Linux: the generation a model name hides
        assert re.fullmatch(r"\S+ \d+/\d+/\d+", machine["cpu"]["cpuid"]), machine["cpu"]
        assert re.fullmatch(r"[0-9a-f]{12}", machine["cpu"]["features_sha256"])
    assert (launch["world_size"], launch["nodes"], launch["checkpoint"]) == (1, 1, None)
    assert launch["command"][1:4] == ["-m", "project.train", f"hydra.searchpath=[file://{run_dir.parent / 'my_conf'}]"]
    assert "model=theirs" in launch["overrides"]


@pytest.mark.slow
def test_no_secret_of_the_environment_is_in_any_file_of_the_run(dirty_run):
    run_dir, _, _ = dirty_run
    files = [path for path in run_dir.rglob("*") if path.is_file()]
    assert len(files) > 5
    for path in files:
        content = path.read_bytes()
        assert not [name for name, value in SECRETS.items() if value.encode() in content], path


@pytest.mark.parametrize(
    "no_git", [{"PATH": "/nonexistent"}, {"GIT_DIR": "/nonexistent/.git"}], ids=["none", "no-repo"]
)
def test_without_git_the_receipt_says_why_and_still_hashes_and_copies_the_targets_files(
    no_git: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    for name, value in no_git.items():
        monkeypatch.setenv(name, value)
    write_receipt(tmp_path, ["project.engine.run_dir.RunDirCheck"], {"world_size": 1})
    code = segment_of(tmp_path)["code"]
    assert code["git"].startswith("git rev-parse: ") and "commit" not in code
    source = Path(run_dirs.__file__)
    entry = code["target_files"][str(source)]
    assert entry["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    assert (tmp_path / entry["copy"]).read_bytes() == source.read_bytes()


def test_a_run_carried_on_in_its_directory_adds_a_segment_and_keeps_the_first(tmp_path: Path):
    write_receipt(tmp_path, [], {"checkpoint": None})
    write_receipt(tmp_path, [], {"checkpoint": str(tmp_path / "checkpoints" / "last.ckpt")})
    first, second = read_receipt(tmp_path / RECEIPT_FILE)["segments"]
    assert first["launch"]["checkpoint"] is None
    assert second["launch"]["checkpoint"] == str(tmp_path / "checkpoints" / "last.ckpt")
    assert first["launch"]["started"] <= second["launch"]["started"]
    assert first["code"].get("commit") == second["code"].get("commit")


def test_copies_stop_at_the_cap_with_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys):
    monkeypatch.setattr(run_dirs, "COPY_CAP_BYTES", 10)
    folder = run_dirs.ReceiptFolder(tmp_path / "receipt" / "0")
    assert folder.keep("a.py", b"12345") == "receipt/0/a.py"
    assert folder.keep("b.py", b"123456") is None and folder.keep("c.py", b"1") is None
    assert folder.cap_reached == "b.py and later files not kept: over 9.53674e-06 MB"
    assert sorted(path.name for path in folder.root.iterdir()) == ["a.py"]
    assert capsys.readouterr().out.count("warning: the run's receipt keeps no copy") == 1


def test_a_rank_other_than_zero_writes_its_own_machine_beside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RANK", "1")
    path = write_receipt(tmp_path, ["project.engine.run_dir.RunDirCheck"], {"world_size": 2})
    assert path.name == "receipt.rank1.json" and not (tmp_path / RECEIPT_FILE).exists()
    (segment,) = json.loads(path.read_text())["segments"]
    assert segment["machine"]["rank"] == 1 and set(segment) == {"machine", "started"}
