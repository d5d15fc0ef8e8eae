"""Every optional part can be deleted: nothing outside it imports it, and what is left without it still works.

project/optional/parts.yaml lists each part's paths. The quick tests read the tree: no Python file outside a part
imports it or names its modules, no conf file outside it names its classes, the packages only it needs are imported
only there, and the README's table lists every part. The slow one copies the repository for each part, removes the
part as `make remove-part` does, and shows that the rest composes and runs as a user would: `trainer=ddp` over two
processes, a resume on one device, `evaluate`, `predict`, a `-m` sweep and ruff. (That the tests left load without
the part is the quick tests' finding: no file outside it imports it as it loads.)
"""

import ast
import functools
import re
import shutil
import subprocess
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

import pytest

from scripts.remove_part import without_entry_points
from tests.helpers import PARTS, REPO, check_ok, part_present, read_json, run_module

# Where code lives that a part's removal must leave working, and the import names of the packages in parts.yaml.
CODE_ROOTS = ("project", "tests", "bench", "hydra_plugins", "scripts")
IMPORT_NAMES = {"hydra-submitit-launcher": "hydra_plugins.hydra_submitit_launcher"}
# The parts still here (a removed part keeps its entry in parts.yaml, its files gone).
PRESENT = [name for name in PARTS if part_present(name)]
# A docs page's command lines, which its test skips where a part they need is gone (tests/docs_commands.py).
DOCS_COMMANDS = ("python -m ", "torchrun ")


@functools.cache  # read once per test process: every part's tests go through the same files
def repository_files() -> tuple[str, ...]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return tuple(name for name in listed.stdout.splitlines() if (REPO / name).is_file())


def belongs_to(path: str, paths: list[str]) -> bool:
    return any(path == own or path.startswith(own.rstrip("/") + "/") for own in paths)


def module_names(paths: list[str]) -> list[str]:
    """The dotted names of the Python code among `paths` (project/optional/dp -> project.optional.dp)."""
    names = []
    for path in paths:
        if path.endswith(".py") or (REPO / path).is_dir() and path.startswith(CODE_ROOTS):
            names.append(path.removesuffix(".py").replace("/", "."))
    return names


def imported_at_load(source: str) -> set[str]:
    """The modules a Python file imports as it is loaded (its top-level imports): without them it fails to load."""
    found = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update([node.module, *(f"{node.module}.{alias.name}" for alias in node.names)])
    return found


def named_modules(source: str) -> set[str]:
    """The modules a Python file imports anywhere, and the dotted names its strings hold (`run_module("project.x")`),
    its docstrings and comments aside: what would fail, or run nothing, without them."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update([node.module, *(f"{node.module}.{alias.name}" for alias in node.names)])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            command = node.value.startswith(DOCS_COMMANDS)
            found.update(() if command else re.findall(r"[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)+", node.value))
    return found


@functools.cache
def names_in(name: str) -> tuple[str, frozenset[str], frozenset[str]]:
    """A repository file's text, the modules it imports as it loads, and those it names anywhere: parsed once per
    test process, not once per part."""
    source = (REPO / name).read_text()
    return source, frozenset(imported_at_load(source)), frozenset(named_modules(source))


@functools.cache
def imported_anywhere(name: str) -> frozenset[str]:
    """The modules a repository file imports, at load or inside a function."""
    tree = ast.parse((REPO / name).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    return frozenset(imported)


def names_any(found: set[str] | frozenset[str], modules: list[str]) -> list[str]:
    return sorted(name for name in found for module in modules if name == module or name.startswith(module + "."))


@pytest.mark.parametrize("part", PRESENT)
def test_nothing_outside_a_part_imports_it_or_names_its_modules(part: str):
    """Only a test marked `requires("<part>")` (which skips where the part is gone) may name its modules, and then
    only inside its tests, never as its file loads."""
    paths, files = PARTS[part]["paths"], repository_files()
    modules = module_names(paths)
    assert modules, f"{part} lists no code"
    users = {}
    for name in files:
        if name.endswith(".py") and name.startswith(CODE_ROOTS) and not belongs_to(name, paths):
            source, at_load, anywhere = names_in(name)
            guarded = name.startswith("tests/") and re.search(rf"requires\([^)]*\"{part}\"", source)
            named = names_any(at_load if guarded else anywhere, modules)
            if named:
                users[name] = named
    assert users == {}, f"outside {part}, these name its modules: {users}"


@pytest.mark.parametrize("part", PRESENT)
def test_pyproject_names_a_parts_code_only_in_the_entry_points_its_removal_deletes(part: str):
    """The optuna part's sweeper is found by Hydra 1.4 through an entry point: removing the part removes it, and
    pyproject.toml is still valid TOML."""
    modules = module_names(PARTS[part]["paths"])
    left = without_entry_points((REPO / "pyproject.toml").read_text(), modules)
    assert names_any(set(re.findall(r"[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)+", left)), modules) == []
    tomllib.loads(left)


@pytest.mark.parametrize("part", PRESENT)
def test_no_conf_file_outside_a_part_names_its_classes(part: str):
    paths = PARTS[part]["paths"]
    modules = module_names(paths)
    users = [
        name
        for name in repository_files()
        if name.startswith("conf/")
        and not belongs_to(name, paths)
        and any(m in (REPO / name).read_text() for m in modules)
    ]
    assert users == [], f"outside {part}, these conf files name its classes: {users}"


@pytest.mark.parametrize("part", [name for name in PRESENT if PARTS[name]["packages"]])
def test_the_packages_only_a_part_needs_are_imported_only_there(part: str):
    paths = PARTS[part]["paths"]
    packages = [IMPORT_NAMES.get(package, package) for package in PARTS[part]["packages"]]
    users = {}
    for name in repository_files():
        if name.endswith(".py") and not belongs_to(name, paths) and name != "tests/preloaded_python.py":
            named = names_any(imported_anywhere(name), packages)
            if named:
                users[name] = named
    assert users == {}, f"outside {part}, these import what only it needs: {users}"


def test_the_readme_lists_every_part_with_its_page():
    """(A part removed leaves its row behind, a mention its user may delete.)"""
    readme = (REPO / "README.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| .*\[(docs/[\w-]+\.md)\]", readme, flags=re.MULTILINE))
    for name in PRESENT:
        assert rows.get(name) == next(path for path in PARTS[name]["paths"] if path.startswith("docs/")), name


def test_every_path_of_a_part_here_is_in_the_repository():
    files = repository_files()
    for name in PRESENT:
        for path in PARTS[name]["paths"]:
            assert any(belongs_to(file, [path]) for file in files), f"{name}: {path} is not in the repository"


# What is left without a part, run as a user would.


def copy_without(part: str, destination: Path) -> Path:
    """The repository's files (as git lists them) in `destination`, the part removed by scripts/remove_part.py."""
    for name in repository_files():
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target)
    removed = subprocess.run(
        [sys.executable, "scripts/remove_part.py", part], cwd=destination, capture_output=True, text=True
    )
    assert removed.returncode == 0, removed.stderr
    assert not any((destination / path).exists() for path in PARTS[part]["paths"])
    return destination


@pytest.mark.slow
@pytest.mark.parametrize("part", PRESENT)
def test_what_is_left_without_a_part_composes_and_runs(part: str, tmp_path: Path):
    tree = copy_without(part, tmp_path / "repo")
    runs = tree / "outputs"

    def train(*args: str) -> subprocess.CompletedProcess:
        flags = [arg for arg in args if arg.startswith("-")]
        overrides = [arg for arg in args if not arg.startswith("-")]
        return check_ok(run_module("project.train", *flags, "logger=none", *overrides, cwd=tree))

    train("trainer=ddp", "trainer.devices=2", "trainer.max_epochs=2", f"hydra.run.dir={runs}/ddp")
    train("ckpt_path=last", "trainer.max_epochs=3", f"hydra.run.dir={runs}/resumed")
    assert read_json(runs / "resumed" / "results.json")["epochs"] == 3
    last = runs / "resumed" / "checkpoints" / "last.ckpt"
    evaluated = check_ok(run_module("project.evaluate", f"ckpt_path={last}", cwd=tree))
    assert re.search(r"^test/acc\s+1\.0", evaluated.stdout, flags=re.MULTILINE)
    predicted = check_ok(
        run_module("project.predict", f"ckpt_path={last}", f"hydra.run.dir={runs}/predicted", cwd=tree)
    )
    assert (runs / "predicted" / "predictions.csv").is_file(), predicted.stdout
    swept = train("-m", "seed=1,2", f"hydra.sweep.dir={runs}/sweep")
    assert "\nSweep: 2 job(s)" in swept.stdout
    check_ok(subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=tree, capture_output=True, text=True))
