"""The engine's mutation score: how many small bug-like edits of `project/engine/` its guard tests catch.

Each engine module's mutants (cosmic-ray's operators: a flipped comparison, `and` for `or`, a dropped `not`, a
changed number, a loop that never runs, ...) are run against the test files `docs/engine.md`'s route table names for
that module, and only those: a mutant another module's tests catch still counts as a survivor here, as that module's
maintainer would not see the failure. A mutant is killed when its guard files fail (or hang past the timeout).

Mutants are applied to a scratch copy of the repository (the files git lists), never to the work tree, so a stopped
run leaves nothing edited. A killing test is run once more on the unmutated copy: a test that fails anyway kills
nothing, and the run says so. Mutants inside type annotations are left out (a `|` made `+` there tests nothing).

`make mutants` installs cosmic-ray into .venv and runs this; `SAMPLE=N` runs N mutants per module, drawn with `SEED`
(docs/testing.md, "Mutation score").
"""

import argparse
import ast
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ENGINE_PAGE = REPO / "docs" / "engine.md"
PYTHON = sys.executable
# pytest's options for one mutant: one process (the two cores are the machine's, not this run's), the quick tests
# first (this module as a plugin), stop at the first failure, and name it.
PYTEST_OPTIONS = ["-x", "-q", "-n", "0", "-p", "no:cacheprovider", "-p", "scripts.mutants", "-rfE", "--tb=no"]
FAILED_LINE = re.compile(r"^(?:FAILED|ERROR) (\S+)", flags=re.MULTILINE)


def route_table_guards(page: str | None = None) -> dict[str, list[str]]:
    """Each engine module's guard test files, as docs/engine.md's route table names them (paths under tests/)."""
    text = ENGINE_PAGE.read_text() if page is None else page
    table = text.split("## The route of a run", 1)[1].split("\n## ", 1)[0]
    guards = {}
    for row in re.findall(r"^\| `(\w+)` \|[^|]*\|(.*)\|$", table, flags=re.MULTILINE):
        module, files = row
        guards[module] = re.findall(r"`([^`]+)`", files)
    return guards


def guards_lines(page: str | None = None) -> dict[str, list[str]]:
    """The test files each module's section names on its `Guards` lines (`Guards (...)`, `Guards of X (...)`)."""
    text = ENGINE_PAGE.read_text() if page is None else page
    named: dict[str, list[str]] = {}
    for section in re.split(r"^## ", text, flags=re.MULTILINE)[1:]:
        heading = re.match(r"`(\w+)\.py`", section)
        if not heading:
            continue
        files = named.setdefault(heading.group(1), [])
        for listed in re.findall(r"^Guards[^(\n]*\(((?:[^()]|\n)*?)\)\s*$", section, flags=re.MULTILINE):
            files.extend(name for name in re.findall(r"`([^`]+)`", listed) if name not in files)
    return named


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """As a plugin of a mutant's pytest: the in-process tests before those that train or start processes (`slow`),
    where tests/conftest.py puts the longest first, so that a killed mutant costs its quickest failing test."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is not None)


@dataclass
class Outcome:
    module: str
    line: int
    edit: str
    killed: bool
    by: str  # the killing test, "timeout", or what the guard files printed last where they survived


def annotation_lines(source: str) -> set[tuple[int, int]]:
    """(line, column) spans inside type annotations, where a mutant changes no behaviour a test could see."""
    spans = set()
    for node in ast.walk(ast.parse(source)):
        annotations = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            arguments += [node.args.vararg, node.args.kwarg]
            annotations = [argument.annotation for argument in arguments if argument is not None] + [node.returns]
        elif isinstance(node, ast.AnnAssign):
            annotations = [node.annotation]
        for annotation in filter(None, annotations):
            spans.add((annotation.lineno, annotation.col_offset, annotation.end_lineno, annotation.end_col_offset))
    return spans


def inside(position: tuple[int, int], spans: set) -> bool:
    line, column = position
    return any((first, start) <= (line, column) <= (last, end) for first, start, last, end in spans)


def mutants_of(module_path: Path) -> list:
    """cosmic-ray's mutation specs for one module, those inside annotations left out."""
    from cosmic_ray.commands.init import _all_work_items

    spans = annotation_lines(module_path.read_text())
    specs = [item.mutations[0] for item in _all_work_items([module_path], {})]
    return [spec for spec in specs if not inside(tuple(spec.start_pos), spans)]


@contextmanager
def scratch_copy() -> Iterator[Path]:
    """The repository's files as git lists them (tracked and new, not ignored), in a temporary dir, .venv linked."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True, check=True, text=True
    ).stdout.split("\0")
    with tempfile.TemporaryDirectory(prefix="mutants-") as scratch:
        copy = Path(scratch) / REPO.name
        for name in filter(None, listed):
            source = REPO / name
            if source.is_file() and not source.is_symlink():
                (copy / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, copy / name)
        (copy / ".venv").symlink_to((REPO / ".venv").resolve())
        yield copy


def mutant_test_command(tests: list[str]) -> str:
    """The command cosmic-ray runs (split as a shell would, run in the copy, which is the current dir)."""
    return " ".join([PYTHON, "-m", "pytest", *PYTEST_OPTIONS, *(f"tests/{name}" for name in tests)])


def edit_of(diff: str) -> str:
    """The changed line, before → after, from a mutant's unified diff."""
    removed = [line[1:].strip() for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")]
    added = [line[1:].strip() for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    return f"{' / '.join(removed)}  →  {' / '.join(added)}"


class FailsUnmutated:
    """Whether a test fails on the unmutated copy too, asked once per test: such a test kills no mutant."""

    def __init__(self) -> None:
        self.known: dict[str, bool] = {}

    def __call__(self, test: str) -> bool:
        if test not in self.known:
            command = [PYTHON, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", test]
            self.known[test] = subprocess.run(command, capture_output=True).returncode != 0
        return self.known[test]


def run_mutant(spec, tests: list[str], timeout: float, fails_unmutated: FailsUnmutated) -> Outcome:
    """One mutant against its module's guard files. Killed: a test failed (on the mutant only) or they hung."""
    from cosmic_ray.mutating import mutate_and_test
    from cosmic_ray.work_item import TestOutcome

    result = mutate_and_test([spec], mutant_test_command(tests), timeout)
    module = spec.module_path.stem
    if result.diff is None:
        return Outcome(module, spec.start_pos[0], spec.operator_name, False, "not applied")
    output = result.output or ""
    failed = FAILED_LINE.search(output)
    edit = edit_of(result.diff)
    if result.test_outcome == TestOutcome.SURVIVED:
        return Outcome(module, spec.start_pos[0], edit, False, "")
    if output == "timeout":
        return Outcome(module, spec.start_pos[0], edit, True, "timeout")
    if failed is None:  # no test failed, yet pytest did: a usage error, no tests collected
        last = output.strip().splitlines()[-1] if output.strip() else "no output"
        return Outcome(module, spec.start_pos[0], edit, False, f"pytest failed without a failing test: {last}")
    if "::" in failed.group(1) and fails_unmutated(failed.group(1)):  # else a test file the mutant cannot import
        return Outcome(module, spec.start_pos[0], edit, False, f"{failed.group(1)} fails unmutated too")
    return Outcome(module, spec.start_pos[0], edit, True, failed.group(1))


def chosen_mutants(module_path: Path, sample: int, seed: int) -> list:
    specs = mutants_of(module_path)
    if sample:
        specs = random.Random(f"{seed}:{module_path.stem}").sample(specs, min(sample, len(specs)))
    return specs


def report(module: str, outcomes: list[Outcome], seconds: float, total: int) -> None:
    killed = sum(outcome.killed for outcome in outcomes)
    rate = f"{100 * killed / len(outcomes):.0f} %" if outcomes else "-"
    print(f"{module}: {killed} of {len(outcomes)} killed ({rate}; {total} mutants in all), {seconds:.0f} s", flush=True)
    for outcome in sorted(outcomes, key=lambda outcome: (outcome.killed, outcome.line)):
        verdict = "killed" if outcome.killed else "survived"
        by = f"  [{outcome.by}]" if outcome.by else ""
        print(f"  {verdict} project/engine/{module}.py:{outcome.line}: {outcome.edit}{by}", flush=True)


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python scripts/mutants.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", help="engine modules to mutate (default: every one the route names)")
    parser.add_argument("--sample", type=int, default=0, help="mutants per module, drawn at random (0: all)")
    parser.add_argument("--seed", type=int, default=0, help="the draw's seed")
    parser.add_argument("--timeout", type=float, default=600, help="seconds a mutant's guard files may run")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    guards = route_table_guards()
    modules = arguments.modules or list(guards)
    unknown = sorted(set(modules) - set(guards))
    if unknown:
        print(f"error: no route-table row in docs/engine.md for {unknown}: name one of {sorted(guards)}")
        return 2
    started = time.monotonic()
    totals = [0, 0]
    with scratch_copy() as copy:
        os.chdir(copy)
        os.environ["PYTHONPATH"] = str(copy)
        fails_unmutated = FailsUnmutated()
        for module in modules:
            module_started = time.monotonic()
            module_path = copy / "project" / "engine" / f"{module}.py"
            specs = chosen_mutants(module_path, arguments.sample, arguments.seed)
            total = len(mutants_of(module_path))
            outcomes = [run_mutant(spec, guards[module], arguments.timeout, fails_unmutated) for spec in specs]
            outcomes = [outcome for outcome in outcomes if outcome.by != "not applied"]
            report(module, outcomes, time.monotonic() - module_started, total)
            totals[0] += sum(outcome.killed for outcome in outcomes)
            totals[1] += len(outcomes)
    if totals[1]:
        print(f"engine: {totals[0]} of {totals[1]} killed ({100 * totals[0] / totals[1]:.0f} %)", end="")
    print(f", {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    sys.exit(main())
