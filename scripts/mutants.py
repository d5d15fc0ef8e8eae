"""The engine's mutation score: how many small bug-like edits of `project/engine/` its guard tests catch.

Each engine module's mutants (cosmic-ray's operators: a flipped comparison, `and` for `or`, a dropped `not`, a
changed number, a loop that never runs, ...) are run against the test files `docs/engine.md`'s route table names for
that module, and only those: a mutant another module's tests catch still counts as a survivor here, as that module's
maintainer would not see the failure. A mutant is killed when its guard files fail (or hang past the timeout).

Mutants are applied to a scratch copy of the repository (the files git lists), never to the work tree, so a stopped
run leaves nothing edited. On Linux the run is the first process of a PID namespace of its own (`confinement`): a
mutant that kills by pid (`startup.end_children` made to kill every process but its children) reaches only the run's
processes, not the user's or, as root, the machine's. A killing test is run once more on the unmutated copy: a test
that fails anyway (twice: `FailsUnmutated`) kills nothing, and the run says so. Mutants inside type annotations are
left out (a `|` made `+` there tests nothing).

`make mutants` installs cosmic-ray into .venv and runs this; `SAMPLE=N` runs N mutants per module, drawn with `SEED`
(docs/testing.md, "Mutation score").
"""

import argparse
import ast
import base64
import hashlib
import json
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ENGINE_PAGE = REPO / "docs" / "engine.md"
PYTHON = sys.executable
# pytest's options for one mutant: one process (the two cores are the machine's, not this run's), the quick tests
# first (this module as a plugin), stop at the first failure, and name it.
PYTEST_OPTIONS = ["-x", "-q", "-n", "0", "-p", "no:cacheprovider", "-p", "scripts.mutants", "-rfE", "--tb=no"]
# pytest's `-rfE` line of a failed test: its node id, whose parameters may hold spaces, then ` - ` and the message.
FAILED_LINE = re.compile(r"^(?:FAILED|ERROR) ([^\s\[]+(?:\[.*?\])?)(?= - |$)", flags=re.MULTILINE)
# Set in the run that `run_confined` started in a PID namespace of its own.
CONFINED = "PROJECT_MUTANTS_CONFINED"


def confinement() -> list[str]:
    """The command prefix that runs a command as the first process of a PID namespace, with a /proc of its own: it
    sees, and can signal, only its own descendants. A user other than root makes a user namespace for it too."""
    user = [] if os.geteuid() == 0 else ["--user", "--map-current-user"]
    # Ctrl-C, or the end of `unshare` however it ends, reaches the run as SIGINT: its scratch copy is removed.
    return ["unshare", *user, "--pid", "--fork", "--mount-proc", "--kill-child=SIGINT"]


def run_confined(argv: list[str]) -> int:
    """This script again, with `argv`, inside `confinement`; an error line where this machine cannot make one."""
    try:
        tried = subprocess.run([*confinement(), "true"], capture_output=True, text=True)
        said = tried.stderr.strip().splitlines() or [f"`unshare` exited with {tried.returncode}"]
        why = said[-1] if tried.returncode else ""
    except FileNotFoundError:
        why = "there is no `unshare` command (util-linux)"
    if why:
        print(
            f"error: the mutants run in a PID namespace of their own, as a mutant may kill every process it can see, "
            f"and none could be made here ({why}): run as root, or where unprivileged user namespaces are allowed",
            file=sys.stderr,
        )
        return 2
    command = [*confinement(), sys.executable, str(Path(__file__).resolve()), *argv]
    # A temp dir of its own: names there that carry a pid (the preloaded Python's socket dir) would otherwise meet
    # those of a run beside it, whose pids count from 1 too.
    own_tmp = tempfile.mkdtemp(prefix="mutants-run-")
    # A `kill` of this process ends the run as Ctrl-C does: `unshare` is killed, and its `--kill-child` signal stops
    # the run inside.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        return subprocess.run(command, env=os.environ | {CONFINED: "1", "TMPDIR": own_tmp}).returncode
    finally:
        shutil.rmtree(own_tmp, ignore_errors=True)


def restart_what_a_mutant_killed() -> None:
    """A mutant that kills processes may have ended the preloaded Python, which the next pytest needs (this mutant's
    check on the unmutated copy, the next mutant's): start it again. As its namespace's first process, this run is
    also the parent of every process whose own parent ended first: reap those, which would otherwise stay zombies."""
    from tests.preloaded_python import PreloadedPython

    server = PreloadedPython.get()  # a new one where the old one is gone
    if os.getpid() != 1:
        return
    for pid in run_processes(keep={server.server.pid}):
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # not this run's child
            continue


def run_processes(keep: set[int]) -> Iterator[int]:
    """The pids of the run's PID namespace (its own /proc, as its first process) but `keep` and the run's own."""
    left_alone = keep | {1}
    return (
        int(entry.name) for entry in os.scandir("/proc") if entry.name.isdigit() and int(entry.name) not in left_alone
    )


def end_processes(keep: set[int]) -> None:
    """Kill every process of the run's PID namespace but `keep` and the run (as its first process it sees them
    alone; elsewhere it does nothing)."""
    if os.getpid() != 1:
        return
    for pid in run_processes(keep):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:  # it ended meanwhile
            continue


@contextmanager
def strays_ended(seconds: float, keep: set[int]) -> Iterator[None]:
    """Kill every process of the run but `keep` when the block ends, and `seconds` from now should it still run.
    cosmic-ray ends a mutant's pytest at its timeout by killing the process group of the command it started: that is
    the preloaded Python's client, not the fork of the server that runs the tests, which holds the command's stdout
    (pytest keeps it while it captures): cosmic-ray would read it for ever (a mutant that keeps a thread from ending
    hangs that fork as it exits, 2026-12-07). A test failed as hung (`failed_when_hung`) may leave the processes it
    started waiting where they hung, using cores the next mutant's tests need."""
    done = threading.Event()

    def at_the_deadline() -> None:
        if not done.wait(seconds):
            end_processes(keep)

    threading.Thread(target=at_the_deadline, daemon=True, name="strays-ended").start()
    try:
        yield
    finally:
        done.set()
        end_processes(keep)


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


# What this module, as a plugin of pytest, is told by the environment: the node ids a mutant's pytest runs (a JSON
# list in a file), and where the mapping pass writes its tests' facts.
SELECTED_TESTS = "MUTANTS_SELECTED_TESTS"
MAPPING_FACTS = "MUTANTS_MAPPING_FACTS"
TEST_TIMEOUT = "MUTANTS_TEST_TIMEOUT"  # seconds one guard test may run, its fixtures' setup and teardown included
HUNG = "hung past the test timeout"  # the failure of a test that did (`failed_when_hung`), in its `-rfE` line
HUNG_AT_EXIT = f"{HUNG} at its pytest's exit"  # what a pytest ended after its tests (`pytest_unconfigure`) prints
EXIT_WAIT = 30.0  # seconds a mutant's pytest may take to exit after its tests (`pytest_unconfigure`)
COVERAGE_CONFIG = "COVERAGE_PROCESS_CONFIG"  # coverage's: the config a process it starts measures with


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests() -> None:
    """As a plugin of a mutant's pytest, forked by the preloaded Python (`preloaded_pytest`): leave nothing of that
    server to the tests, which start their own, so that every process they start is what it is in `make test`."""
    import multiprocessing

    from tests.preloaded_python import REAL_PYTHON_VARIABLE, SOCKET_VARIABLE

    if SOCKET_VARIABLE in os.environ:
        sys.executable = os.environ[REAL_PYTHON_VARIABLE]
        multiprocessing.set_executable(sys.executable)
        for name in (SOCKET_VARIABLE, REAL_PYTHON_VARIABLE, "PYTHON_EXEC"):
            os.environ.pop(name, None)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """As a plugin of a mutant's pytest: only the guard tests that ran the mutated statement (where a list is given),
    in its order (the likeliest to fail first: `likeliest_killers_first`), the in-process tests before those that
    train or start processes (`slow`), so that a killed mutant costs its quickest failing test. In the mapping pass:
    the tests' facts."""
    order: dict[str, int] = {}
    if SELECTED_TESTS in os.environ:
        order = {test: index for index, test in enumerate(json.loads(Path(os.environ[SELECTED_TESTS]).read_text()))}
        config.hook.pytest_deselected(items=[item for item in items if item.nodeid not in order])
        items[:] = [item for item in items if item.nodeid in order]
    items.sort(key=lambda item: (item.get_closest_marker("slow") is not None, order.get(item.nodeid, 0)))
    if MAPPING_FACTS in os.environ:
        facts = {"tests": [item.nodeid for item in items], "groups": {}, "unmeasured": []}
        for item in items:
            group = item.get_closest_marker("xdist_group")
            if group is not None:
                facts["groups"][item.nodeid] = group.args[0] if group.args else group.kwargs["name"]
        Path(os.environ[MAPPING_FACTS]).write_text(json.dumps(facts))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """In the mapping pass, every line a test makes run is recorded under its node id: in this process (coverage's
    dynamic context) and in every process it starts (their static context, read from the environment). Processes
    are started as fresh interpreters, which read it; a fork of the preloaded Python would keep the context of the
    test that started that server."""
    if MAPPING_FACTS not in os.environ:
        with failed_when_hung(float(os.environ.get(TEST_TIMEOUT, 0))):
            return (yield)
    measured_as(item.nodeid)
    try:
        return (yield)
    finally:
        measured_as("")


@contextmanager
def failed_when_hung(seconds: float) -> Iterator[None]:
    """A test still running `seconds` after it started fails: a mutant that makes one hang (a wait that never ends)
    is killed in that time, not the whole run's timeout, and pytest's `-x` ends its guard files there. SIGALRM
    reaches the main thread between Python's steps, and a wait in a system call on the way (EINTR): a wait inside a
    C++ library that does not return to Python is left to the run's timeout."""
    if not seconds:
        yield
        return

    def hung(signum: int, frame) -> None:
        pytest.fail(f"{HUNG} ({seconds:.0f} s)", pytrace=False)

    previous = signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """After its tests, a mutant's pytest that has not exited within `EXIT_WAIT` s (or its test timeout, if shorter)
    is ended as hung: a mutant that leaves a thread or a store the interpreter waits for at its exit would otherwise
    hold it until the whole run's timeout (600 s), no test running to fail."""
    seconds = min(EXIT_WAIT, float(os.environ.get(TEST_TIMEOUT, 0)))
    if not seconds or MAPPING_FACTS in os.environ:
        return

    def hung_at_exit() -> None:
        print(f"{HUNG_AT_EXIT} ({seconds:.0f} s)", flush=True)
        os._exit(3)

    timer = threading.Timer(seconds, hung_at_exit)
    timer.daemon = True  # it must not itself hold the exit it watches
    timer.start()


def measured_as(label: str) -> None:
    import coverage

    helpers = sys.modules.get("tests.helpers")
    if helpers is not None:
        helpers.FRESH = True  # a `fresh` test's own context manager sets it back at its end
    coverage.Coverage.current().switch_context(label)
    settings = json.loads(base64.b64decode(os.environ[COVERAGE_CONFIG]))
    settings["context"] = label
    os.environ[COVERAGE_CONFIG] = base64.b64encode(json.dumps(settings).encode()).decode()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """In the mapping pass, a test that failed or was skipped (under coverage, or for want of a GPU) ran less than
    it does unmeasured: its mapping is unknown, and it runs for every mutant."""
    if MAPPING_FACTS in os.environ and (report.failed or report.skipped):
        facts = json.loads(Path(os.environ[MAPPING_FACTS]).read_text())
        if report.nodeid not in facts["unmeasured"]:
            facts["unmeasured"].append(report.nodeid)
        Path(os.environ[MAPPING_FACTS]).write_text(json.dumps(facts))


# A mutant left out of the count: cosmic-ray found nothing to change, its operator fails on the node it names (8.7's
# exception replacer on a dotted name: `except (ValueError, json.JSONDecodeError)`), or what it made is no Python
# (`{+params}` of `{**params}`), which no test could run.
NOT_APPLIED, NOT_MADE, NOT_PYTHON = "not applied", "cosmic-ray cannot make it", "not Python"
LEFT_OUT = (NOT_APPLIED, NOT_MADE, NOT_PYTHON)
# How many `--timeout`s the unmutated tests may take before a mutant's timeout is taken for no evidence at all: such a
# mutant counts as a survivor, saying so (`UNDECIDED`), until a run with a larger `--timeout` judges it.
OUTRUN_LIMIT = 4
UNDECIDED = (
    f"undecided: its guard tests outrun {OUTRUN_LIMIT} x --timeout unmutated too; run it with a larger --timeout"
)


@dataclass
class Outcome:
    module: str
    line: int
    edit: str
    killed: bool
    by: str  # the killing test, "timeout", one of LEFT_OUT, or the guard files' last line where they survived
    key: str = ""  # the mutant within its module: cosmic-ray's operator and occurrence
    seconds: float = 0.0
    tests: int = 0  # guard tests selected for it (0: every guard file, as --every-guard-test runs them)


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


def guard_tests_command(paths: list[str]) -> list[str]:
    """A mutant's pytest, run in the copy (the current dir) by the tests' preloaded Python's shim, so that it is
    forked (`preloaded_pytest`)."""
    return [str(REPO / "tests" / "preloaded_bin" / "python"), "-m", "pytest", *PYTEST_OPTIONS, *paths]


def mutant_test_command(paths: list[str]) -> str:
    """The command cosmic-ray runs (split as a shell would): `guard_tests_command` with its stderr in the output
    cosmic-ray keeps, where pytest reports a conftest that does not import."""
    return shlex.join(["sh", "-c", shlex.join(guard_tests_command(paths)) + " 2>&1"])


@contextmanager
def preloaded_pytest(copy: Path) -> Iterator[None]:
    """Each mutant's pytest forked from one Python that has imported the libraries (tests/preloaded_python.py, the
    suite's own server, started here from the copy) rather than a fresh interpreter that spends seconds importing
    them. The project and its tests are imported afresh in every fork, from the copy's files, mutant and all; the
    fork then stands as a fresh pytest would (`pytest_load_initial_conftests`)."""
    sys.path.insert(0, str(copy))
    from tests.preloaded_python import PreloadedPython

    os.environ.update(PreloadedPython.get().environment())
    try:
        yield
    finally:
        # The one running now: a mutant's kills may have made `restart_what_a_mutant_killed` start another.
        server = PreloadedPython.get().server
        server.stdin.close()
        server.wait()


@dataclass
class TestMap:
    """Which of a module's guard tests ran each of its statements, read from one run of its guard files under
    coverage (`mapping_pass`). A mutant can change what a test sees only where that test runs the mutated statement,
    so the mutant runs only those tests: mutmut 3's way, made sound for tests that start processes."""

    tests: list[str]  # every guard test, in the order a mutant's pytest runs them
    groups: dict[str, str]  # a test's group of tests sharing a module-scoped fixture (a trained run)
    unmeasured: list[str]  # tests that failed or skipped under coverage: what they run is unknown
    statements: dict[int, list[str]]  # a statement's first line: the tests that ran it ("": outside any test)

    def tests_running(self, spec, first_line, reads: "dict[int, ConstantReads] | None" = None) -> list[str]:
        """The guard tests a mutant must run: those that ran its statement, with the tests sharing their fixtures
        (a fixture's lines count for the test that built it); all of them where the statement ran outside a test
        (an import, at collection), or where coverage saw no test run it: it does not see every line that runs
        (Python runs an audit hook, the engine's `Confinement`, untraced). A mutant of a module constant's value
        (`reads`) runs the tests that ran a line reading it, or whose file names it."""
        read = (reads or {}).get(first_line(spec.start_pos[0]))
        if read is None:
            return self.tests_of({first_line(line) for line in range(spec.start_pos[0], spec.end_pos[0] + 1)})
        named = {test for test in self.tests if test.split("::")[0] in read.test_files}
        readers = self.tests_of({first_line(line) for line in read.lines})  # all where one is read at import
        return [test for test in self.tests if test in named or test in readers]

    def tests_of(self, lines: set[int]) -> list[str]:
        """The guard tests that ran any of these statements (their first lines), as `tests_running` chooses them."""
        ran_it = set().union(*(self.statements.get(line, ()) for line in lines))
        if not ran_it or not ran_it <= set(self.tests):  # "" among them: outside any test
            return list(self.tests)
        shared = {self.groups[test] for test in ran_it if test in self.groups}
        chosen = ran_it | set(self.unmeasured) | {test for test, group in self.groups.items() if group in shared}
        return [test for test in self.tests if test in chosen]

    def merged(self, fresh: "TestMap", remapped: list[str], files: list[str]) -> "TestMap":
        """This map with the tests of the files `remapped` as `fresh` maps them now, and without the tests of files
        that are no longer guard files (`files`: the module's guard test files now)."""

        def kept(test: str) -> bool:
            return test == "" or (test.split("::")[0] in files and test.split("::")[0] not in remapped)

        statements = {}
        for line in self.statements.keys() | fresh.statements.keys():
            ran = {test for test in self.statements.get(line, ()) if kept(test)} | set(fresh.statements.get(line, ()))
            statements[line] = sorted(ran)
        return TestMap(
            [test for test in self.tests if kept(test)] + fresh.tests,
            {test: group for test, group in self.groups.items() if kept(test)} | fresh.groups,
            [test for test in self.unmeasured if kept(test)] + fresh.unmeasured,
            statements,
        )


@dataclass
class ConstantReads:
    """Where a module constant (`NAME = <value>` at the module's top, no call in the value) is read: the module's
    lines that load NAME, and the guard test files that name it. Its statement runs once, at import, outside every
    test, which alone would run all the guard tests against each mutant of its value; yet the value changes nothing
    but what those reads see."""

    lines: list[int]
    test_files: set[str]


def constants_read(root: Path, module_path: Path, guard_tests: list[Path]) -> dict[int, ConstantReads]:
    """The module's constants (`module_path`, in the copy `root`) by their statements' first lines, each with where
    it is read. Left out, and so run against every guard test: a constant whose name another Python file of the
    copy holds, but for a guard test file (another module's import of it, a helper's, a script's, whose reads
    coverage cannot place), and one the module never reads (it would select no test)."""
    tree = ast.parse((root / module_path).read_text())
    constants = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        target = node.target if isinstance(node, ast.AnnAssign) and node.value is not None else target
        if isinstance(target, ast.Name) and not any(isinstance(part, ast.Call) for part in ast.walk(node)):
            constants[target.id] = node.lineno
    loads: dict[str, list[int]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in constants:
            loads.setdefault(node.id, []).append(node.lineno)
    guards = {str(path) for path in guard_tests}
    named_in: dict[str, set[str]] = {name: set() for name in constants}
    for folder, folders, files in os.walk(root):
        folders[:] = [name for name in folders if not name.startswith(".")]
        for file in (Path(folder, name) for name in files if name.endswith(".py")):
            path = str(file.relative_to(root))
            if path == str(module_path):
                continue
            text = file.read_text(errors="replace")
            for name in constants:
                if re.search(rf"\b{re.escape(name)}\b", text):
                    named_in[name].add(path)
    return {
        line: ConstantReads(sorted(set(loads[name])), named_in[name])
        for name, line in constants.items()
        if name in loads and named_in[name] <= guards
    }


class MappingTooSlow(Exception):
    """A module's mapping pass outran `--map-timeout`: the run ends in this line, the tests it started ended."""


def mapping_pass(module_path: Path, guard_files: list[str], timeout: float) -> TestMap:
    """Run a module's guard files once under coverage, each line recorded under the test that made it run, in any
    process: this one through a dynamic context, the processes a test starts through the static context their
    coverage reads from the environment (this module's `measured_as`, as a plugin of that pytest)."""
    import coverage

    from tests.preloaded_python import PreloadedPython

    with tempfile.TemporaryDirectory(prefix="mutants-map-") as work:
        settings = Path(work) / "coveragerc"
        settings.write_text(
            f"[run]\ndata_file = {work}/.coverage\nparallel = true\nsource = {module_path.resolve().parent}\n"
            "patch = subprocess, fork\n"
        )
        facts = Path(work) / "facts.json"
        options = [option for option in PYTEST_OPTIONS if option != "-x"]
        command = [PYTHON, "-m", "coverage", "run", f"--rcfile={settings}", "-m", "pytest", *options, *guard_files]
        try:
            with strays_ended(timeout + 5, keep={PreloadedPython.get().server.pid}):
                environment = {**os.environ, MAPPING_FACTS: str(facts)}
                subprocess.run(command, env=environment, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise MappingTooSlow(
                f"error: {module_path}'s guard tests did not end within {timeout:.0f} s under coverage (the mapping "
                "pass, all of them at once): give it longer with --map-timeout"
            ) from None
        measured = coverage.Coverage(config_file=str(settings))
        measured.combine()
        by_line = measured.get_data().contexts_by_lineno(str(module_path.resolve()))
        known = json.loads(facts.read_text())
    first_line = first_lines(module_path)
    statements: dict[int, set[str]] = {}
    for line, tests in by_line.items():
        statements.setdefault(first_line(line), set()).update(tests)
    runs = {line: sorted(tests) for line, tests in statements.items()}
    return TestMap(known["tests"], known["groups"], known["unmeasured"], runs)


def left_out(spec) -> str:
    """Why `spec` is left out of the count (NOT_MADE, NOT_PYTHON), or "" where the module it mutates compiles."""
    import cosmic_ray.plugins
    from cosmic_ray.mutating import mutate_code

    operator = cosmic_ray.plugins.get_operator(spec.operator_name)(**(getattr(spec, "operator_args", None) or {}))
    try:
        mutated = mutate_code(Path(spec.module_path).read_text(), operator, spec.occurrence)
    except AttributeError:  # a node of another kind than the operator expects
        return NOT_MADE
    try:
        compile(mutated or "", str(spec.module_path), "exec")
    except SyntaxError:
        return NOT_PYTHON
    return ""


def first_lines(module_path: Path):
    """coverage's own map of a line to its statement's first line (where a multi-line statement is recorded)."""
    from coverage.parser import PythonParser

    parser = PythonParser(text=module_path.read_text())
    parser.parse_source()
    return parser.first_line


def edit_of(diff: str) -> str:
    """The changed line, before → after, from a mutant's unified diff."""
    removed = [line[1:].strip() for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")]
    added = [line[1:].strip() for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    return f"{' / '.join(removed)}  →  {' / '.join(added)}"


class FailsUnmutated:
    """Whether tests (a failing test, or a pytest that stopped) fail on the unmutated copy too: such a failure kills no
    mutant. A failure counts where a second run fails as well, and is asked again for the next mutant: kept, one
    failure by chance (a machine loaded by the run beside) would spare every later mutant that selects the same
    tests. A pass is kept: asked once per set of tests."""

    def __init__(self) -> None:
        self.passing: set[tuple[str, ...]] = set()

    def __call__(self, tests: list[str]) -> bool:
        key = tuple(tests)
        if key in self.passing:
            return False
        fails = all(self.run(tests) for _ in range(2))  # a second run only after a failure
        if not fails:
            self.passing.add(key)
        return fails

    @staticmethod
    def run(tests: list[str]) -> bool:
        return subprocess.run(guard_tests_command(tests), capture_output=True).returncode != 0


class UnmutatedSeconds:
    """How long tests take on the unmutated copy, asked where a mutant's tests outran the run's `--timeout` with no
    test failed as hung: that timeout kills only where the same tests end well within it unmutated (a module whose
    guard tests are many and slow, `ddp`'s 145, outruns 600 s unmutated: each such mutant was once a kill). Kept per
    set of tests, so the next mutant that selects them is given room at once (`timeout_for`); `None`: they outran
    `limit` unmutated too."""

    def __init__(self) -> None:
        self.known: dict[tuple[str, ...], float | None] = {}

    def __call__(self, tests: list[str], limit: float) -> float | None:
        key = tuple(tests)
        if key not in self.known:
            self.known[key] = self.run(tests, limit)
        return self.known[key]

    def timeout_for(self, tests: list[str], timeout: float) -> float:
        """`timeout`, or twice the tests' unmutated time (and a minute) where that is known and longer."""
        seconds = self.known.get(tuple(tests))
        return timeout if seconds is None else max(timeout, 2 * seconds + 60)

    @staticmethod
    def run(tests: list[str], limit: float) -> float | None:
        from tests.preloaded_python import PreloadedPython

        started = time.monotonic()
        try:
            with strays_ended(limit + 5, keep={PreloadedPython.get().server.pid}):
                subprocess.run(guard_tests_command(tests), capture_output=True, timeout=limit)
        except subprocess.TimeoutExpired:
            return None
        return time.monotonic() - started


@dataclass
class Unmutated:
    """What the unmutated copy answers about a mutant's tests: whether they fail there too, and how long they take."""

    fails: FailsUnmutated
    seconds: UnmutatedSeconds


def mutant_key(spec) -> str:
    return f"{spec.operator_name}:{spec.occurrence}"


def run_mutant(
    spec, selected: list[str] | None, guard_files: list[str], timeout: float, unmutated: Unmutated
) -> Outcome:
    """One mutant against the guard tests that run its statement (`selected`), or every guard file (None). Killed:
    a test failed (on the mutant only) or they hung."""
    started = time.monotonic()
    outcome = run_selected(spec, selected, guard_files, timeout, unmutated)
    outcome.key, outcome.seconds = mutant_key(spec), time.monotonic() - started
    outcome.tests = len(selected) if selected is not None else 0
    return outcome


def run_selected(
    spec, selected: list[str] | None, guard_files: list[str], timeout: float, unmutated: Unmutated
) -> Outcome:
    from cosmic_ray.work_item import TestOutcome

    module = spec.module_path.stem
    why = left_out(spec)
    if why:
        return Outcome(module, spec.start_pos[0], spec.operator_name, False, why)
    paths = guard_files if selected is None else sorted({test.split("::")[0] for test in selected})
    tests = selected if selected is not None else paths
    given = unmutated.seconds.timeout_for(tests, timeout)
    result = mutated_and_tested(spec, selected, paths, given)
    if result.output == "timeout":  # the whole run's, with no test failed as hung: evidence only where they are quick
        seconds = unmutated.seconds(tests, OUTRUN_LIMIT * timeout)
        if seconds is None:
            return Outcome(module, spec.start_pos[0], edit_of(result.diff or ""), False, UNDECIDED)
        room = unmutated.seconds.timeout_for(tests, timeout)
        if room > given:
            result = mutated_and_tested(spec, selected, paths, room)
    if result.diff is None:
        return Outcome(module, spec.start_pos[0], spec.operator_name, False, NOT_APPLIED)
    survived = result.test_outcome == TestOutcome.SURVIVED
    edit = edit_of(result.diff)
    return judged(module, spec.start_pos[0], edit, survived, result.output or "", tests, unmutated.fails)


def mutated_and_tested(spec, selected: list[str] | None, paths: list[str], timeout: float):
    """cosmic-ray's result of the mutant against `selected` (of the files `paths`), or `paths` whole (None)."""
    from cosmic_ray.mutating import mutate_and_test

    from tests.preloaded_python import PreloadedPython

    with tempfile.NamedTemporaryFile("w", suffix=".json") as chosen:
        if selected is not None:
            chosen.write(json.dumps(selected))
            chosen.flush()
            os.environ[SELECTED_TESTS] = chosen.name
        try:
            # cosmic-ray's own end of the command comes at `timeout`: the strays it leaves a moment later.
            with strays_ended(timeout + 5, keep={PreloadedPython.get().server.pid}):
                return mutate_and_test([spec], mutant_test_command(paths), timeout)
        finally:
            os.environ.pop(SELECTED_TESTS, None)
            restart_what_a_mutant_killed()


def judged(
    module: str, line: int, edit: str, survived: bool, output: str, tests: list[str], fails_unmutated
) -> Outcome:
    """The verdict on a mutant whose guard `tests` ran, printing `output`: killed where a test failed on the mutant
    only, where they hung, or where pytest stopped without a failing test (the mutant broke what every test goes
    through: an audit hook, the conftest) as it does not on the unmutated code."""
    failed = FAILED_LINE.search(output)
    if survived:
        return Outcome(module, line, edit, False, "")
    if output == "timeout":
        return Outcome(module, line, edit, True, "timeout")
    if failed is None and HUNG_AT_EXIT in output:
        return Outcome(module, line, edit, True, "timeout")
    if failed is None and "while loading conftest" in output:  # the mutant stops the project importing at all
        return Outcome(module, line, edit, True, "the guard files' conftest does not import")
    if failed is None:  # no test failed, yet pytest did: it crashed, or collected nothing
        last = output.strip().splitlines()[-1] if output.strip() else "no output"
        if fails_unmutated(tests):
            return Outcome(module, line, edit, False, f"pytest failed without a failing test, unmutated too: {last}")
        return Outcome(module, line, edit, True, f"pytest stopped without a failing test, unlike unmutated: {last}")
    if "::" in failed.group(1) and fails_unmutated([failed.group(1)]):  # else a test file the mutant cannot import
        return Outcome(module, line, edit, False, f"{failed.group(1)} fails unmutated too")
    hung = f"{failed.group(0)} - Failed: {HUNG}" in output
    return Outcome(module, line, edit, True, "timeout" if hung else failed.group(1))


def chosen_mutants(module_path: Path, sample: int, seed: int) -> list:
    specs = mutants_of(module_path)
    if sample:
        specs = random.Random(f"{seed}:{module_path.stem}").sample(specs, min(sample, len(specs)))
    return specs


class Results:
    """A module's finished mutants, one JSON line each, in docs/mutants/<module>.jsonl, so that a full run, hours
    long, goes on where a stopped one stopped, across sessions, commits and clones (committed, they are also the
    record behind docs/testing.md's scores). Each line carries the fingerprint of the module and its guard files
    (sha256), and <module>.files.json each fingerprint's files, hashed one by one: a commit that changes neither (the
    docs, another module) keeps the lines; one that changes a guard file but not the module keeps what that change
    cannot alter (`carried`); a changed module starts over."""

    def __init__(self, name: str, fingerprint: str, files: dict[str, str] | None = None) -> None:
        self.path = REPO / "docs" / "mutants" / f"{name}.jsonl"
        self.files_path = self.path.with_suffix(".files.json")
        self.fingerprint = fingerprint
        self.files = files or {}
        self.done: dict[str, Outcome] = {}
        self.earlier: dict[str, Outcome] = {}  # the latest outcome of each mutant under another fingerprint
        self.earlier_files: dict[str, dict[str, str]] = {}  # the files that outcome was judged with, hashed
        known = json.loads(self.files_path.read_text()) if self.files_path.is_file() else {}
        self.files_of: dict[str, dict[str, str]] = known  # each fingerprint's files, hashed
        lines = self.path.read_text().splitlines() if self.path.is_file() else []
        for line in map(json.loads, lines):
            judged_on = line.pop("fingerprint")
            outcome = Outcome(**line)
            if judged_on == fingerprint:
                self.done[outcome.key] = outcome
            else:
                self.earlier[outcome.key], self.earlier_files[outcome.key] = outcome, known.get(judged_on, {})
        if self.files and fingerprint not in known:
            self.files_path.parent.mkdir(parents=True, exist_ok=True)
            self.files_path.write_text(json.dumps({**known, fingerprint: self.files}, indent=1) + "\n")

    def add(self, outcome: Outcome) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as results:
            results.write(json.dumps({**asdict(outcome), "fingerprint": self.fingerprint}) + "\n")
        self.done[outcome.key] = outcome

    def changed_since(self, then: dict[str, str]) -> list[str]:
        """The files (module, guard test files) whose hash is not the one `then` gave, or that `then` did not have."""
        return [name for name, digest in self.files.items() if then.get(name) != digest]

    def carried(self, key: str, module_file: str) -> tuple[Outcome, list[str]] | None:
        """A mutant's earlier outcome that the guard files changed since cannot have altered, the module being the
        same, with the guard files changed since (a survivor runs again against their tests alone: the others passed
        it then); None where it must run again whole. A kill stays while its test's file is the same; a timeout, an
        undecided mutant or a test file gone run again."""
        earlier, then = self.earlier.get(key), self.earlier_files.get(key, {})
        if earlier is None or not then or then.get(module_file) != self.files.get(module_file):
            return None
        changed = self.changed_since(then)
        if earlier.by in LEFT_OUT:
            return earlier, []
        if earlier.killed:
            killer = earlier.by.split("::")[0]
            same = "::" in earlier.by and killer in self.files and then.get(killer) == self.files[killer]
            return (earlier, []) if same else None
        return None if earlier.by == UNDECIDED else (earlier, changed)


def fingerprint(module_path: Path, guard_files: list[str]) -> str:
    """sha256 of the module and its guard files (a folder's .py files), as the copy holds them."""
    digest = hashlib.sha256(module_path.read_bytes())
    for file in guard_test_files(guard_files):
        digest.update(file.read_bytes())
    return digest.hexdigest()


def guard_test_files(guard_files: list[str]) -> list[Path]:
    """The test files a module's guard files name (a folder: its .py files), in the order they are hashed."""
    files = []
    for name in guard_files:
        path = Path(name)
        files.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    return files


def file_hashes(module_path: Path, guard_files: list[str]) -> dict[str, str]:
    """sha256 of the module and of each guard test file, by their paths in the copy: what a verdict was judged on."""
    return {
        str(file): hashlib.sha256(file.read_bytes()).hexdigest()
        for file in [module_path, *guard_test_files(guard_files)]
    }


def test_map_of(module_path: Path, guard_files: list[str], results: Results, timeout: float) -> TestMap:
    """The module's test map, made once per fingerprint and kept in outputs/mutants/ (a cache: made again if lost).
    Where only guard files changed since the map kept, only theirs are mapped again (`TestMap.merged`)."""
    stored = REPO / "outputs" / "mutants" / results.path.with_suffix(".map.json").name
    kept_map, then = None, {}
    if stored.is_file():
        kept = json.loads(stored.read_text())
        mapped_on = kept.pop("fingerprint")
        kept["statements"] = {int(line): tests for line, tests in kept["statements"].items()}
        if mapped_on == results.fingerprint:
            return TestMap(**kept)
        kept_map, then = TestMap(**kept), results.files_of.get(mapped_on, {})
    started = time.monotonic()
    module = str(module_path)
    if kept_map is not None and then.get(module) == results.files.get(module):
        changed = results.changed_since(then)
        fresh = mapping_pass(module_path, changed, timeout) if changed else TestMap([], {}, [], {})
        test_map = kept_map.merged(fresh, changed, list(results.files))
        done = f"the tests of its {len(changed)} changed guard files mapped again"
    else:
        test_map = mapping_pass(module_path, guard_files, timeout)
        done = "guard tests mapped to its lines"
    print(f"{module_path.stem}: {done} in {time.monotonic() - started:.0f} s", flush=True)
    stored.parent.mkdir(parents=True, exist_ok=True)
    stored.write_text(json.dumps({**asdict(test_map), "fingerprint": results.fingerprint}))
    return test_map


def report(module: str, module_path: Path, outcomes: list[Outcome], seconds: float, total: int) -> None:
    killed = sum(outcome.killed for outcome in outcomes)
    rate = f"{100 * killed / len(outcomes):.0f} %" if outcomes else "-"
    mean = sum(outcome.seconds for outcome in outcomes) / len(outcomes) if outcomes else 0
    print(
        f"{module}: {killed} of {len(outcomes)} killed ({rate}; {total} mutants in all, those not Python left out), "
        f"{seconds:.0f} s this run, {mean:.1f} s a mutant",
        flush=True,
    )
    for outcome in sorted(outcomes, key=lambda outcome: (outcome.killed, outcome.line)):
        verdict = "killed" if outcome.killed else "survived"
        by = f"  [{outcome.by}]" if outcome.by else ""
        print(f"  {verdict} {module_path}:{outcome.line}: {outcome.edit}{by}", flush=True)


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python scripts/mutants.py", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "modules",
        nargs="*",
        help="engine modules to mutate (default: every one the route names), or `optional`: every module of the "
        "optional parts, each against its part's tests (tests/optional/<part>/), or `optional/<part>`",
    )
    parser.add_argument("--sample", type=int, default=0, help="mutants per module, drawn at random (0: all)")
    parser.add_argument("--seed", type=int, default=0, help="the draw's seed")
    parser.add_argument("--timeout", type=float, default=600, help="seconds a mutant's guard files may run")
    parser.add_argument(
        "--test-timeout",
        type=float,
        default=300,
        help="seconds one of its guard tests may run, its fixtures included (the suite's longest takes under 60)",
    )
    parser.add_argument(
        "--map-timeout",
        type=float,
        default=7200,
        help="seconds a module's guard tests may run once under coverage, all at once (`ddp`'s take about 30 min)",
    )
    parser.add_argument(
        "--every-guard-test",
        action="store_true",
        help="run each mutant against all its guard files, unmapped (slow: to check the mapped verdicts)",
    )
    return parser.parse_args(argv)


def run_module_mutants(
    module: str, module_path: Path, guard_files: list[str], arguments: argparse.Namespace, unmutated: Unmutated
) -> list:
    """A module's chosen mutants, those finished in an earlier run read from its results (or carried over a change
    of its guard files alone: `Results.carried`), the others run now."""
    name = module.replace("/", ".")
    name = f"{name}.every-guard-test" if arguments.every_guard_test else name
    results = Results(name, fingerprint(module_path, guard_files), file_hashes(module_path, guard_files))
    specs = chosen_mutants(module_path, arguments.sample, arguments.seed)
    waiting = [spec for spec in specs if mutant_key(spec) not in results.done]
    if len(waiting) < len(specs):
        print(f"{module}: {len(specs) - len(waiting)} mutants done before, read from {results.path}", flush=True)
    test_map = None
    if waiting and not arguments.every_guard_test:
        test_map = test_map_of(module_path, guard_files, results, arguments.map_timeout)
        first_line = first_lines(module_path)
        reads = constants_read(Path.cwd(), module_path, guard_test_files(guard_files))
    for spec in waiting:
        selected = None if test_map is None else test_map.tests_running(spec, first_line, reads)
        files = guard_files
        carried = results.carried(mutant_key(spec), str(module_path))
        if carried is not None:
            earlier, changed = carried
            selected = None if selected is None else [test for test in selected if test.split("::")[0] in changed]
            files = changed
            if not changed or selected == []:  # nothing that changed can see it: the earlier verdict stands
                results.add(earlier)
                continue
        if selected:
            earlier = results.earlier.get(mutant_key(spec))
            killer = earlier.by if earlier and earlier.killed and earlier.line == spec.start_pos[0] else None
            selected = likeliest_killers_first(selected, spec.start_pos[0], results.done.values(), killer)
        results.add(run_mutant(spec, selected, files, arguments.timeout, unmutated))
    outcomes = [results.done[mutant_key(spec)] for spec in specs]
    return [outcome for outcome in outcomes if outcome.by not in LEFT_OUT]


def likeliest_killers_first(selected: list[str], line: int, done, killer: str | None = None) -> list[str]:
    """`selected` with `killer` first (the test that killed this mutant before its module or guard files changed),
    then the tests that killed a mutant of the same line, then those that killed any of the module's, the most often
    first: mutants of one statement tend to fail the same test (mutmut's order too). The verdict is the same in any
    order, each mutant run again against every selected test that may be needed; only the time to it changes."""
    kills: dict[str, int] = {killer: 10**6} if killer else {}
    for outcome in done:
        if outcome.killed and "::" in outcome.by:
            kills[outcome.by] = kills.get(outcome.by, 0) + (1000 if outcome.line == line else 1)
    return sorted(selected, key=lambda test: -kills.get(test, 0))


def optional_modules(asked: str) -> dict[str, tuple[Path, list[str]]]:
    """The optional parts' modules `asked` names (`optional`, or `optional/<part>`), each with its part's tests: what
    a maintainer of the part runs (each part's tests are its own folder, deleted with it)."""
    found = {}
    for path in sorted((REPO / "project" / "optional").glob("*/*.py")):
        part = path.parent.name
        tests = REPO / "tests" / "optional" / part
        if path.name != "__init__.py" and tests.is_dir() and asked in ("optional", f"optional/{part}"):
            found[f"optional/{part}/{path.stem}"] = (path.relative_to(REPO), [f"tests/optional/{part}"])
    return found


def main(argv: list[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    guards = route_table_guards()
    targets = {}
    for asked in arguments.modules or list(guards):
        optional = optional_modules(asked) if asked.startswith("optional") else {}
        if asked in guards:
            targets[asked] = (Path("project") / "engine" / f"{asked}.py", [f"tests/{name}" for name in guards[asked]])
        elif optional:
            targets.update(optional)
        else:
            print(
                f"error: no route-table row in docs/engine.md for {asked}, nor an optional part of that name: name one "
                f"of {sorted(guards)}, `optional` or `optional/<part>`"
            )
            return 2
    started = time.monotonic()
    totals = [0, 0]
    with scratch_copy() as copy, preloaded_pytest(copy):
        os.chdir(copy)
        os.environ["PYTHONPATH"] = str(copy)
        os.environ[TEST_TIMEOUT] = str(arguments.test_timeout)
        unmutated = Unmutated(FailsUnmutated(), UnmutatedSeconds())
        for module, (module_path, guard_files) in targets.items():
            module_started = time.monotonic()
            try:
                outcomes = run_module_mutants(module, module_path, guard_files, arguments, unmutated)
            except MappingTooSlow as error:
                print(error, file=sys.stderr)
                return 2
            total = len(mutants_of(copy / module_path))
            report(module, module_path, outcomes, time.monotonic() - module_started, total)
            totals[0] += sum(outcome.killed for outcome in outcomes)
            totals[1] += len(outcomes)
    if totals[1]:
        print(f"in all: {totals[0]} of {totals[1]} killed ({100 * totals[0] / totals[1]:.0f} %)", end="")
    print(f", {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    if CONFINED in os.environ:
        # `unshare` ignores both while it waits for this run, which would inherit that (and its tests, whose Ctrl-C
        # and SIGTERM they send then do nothing); as the namespace's first process it would ignore SIGTERM anyway.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.default_int_handler)
    confined = sys.platform != "linux" or CONFINED in os.environ
    sys.exit(main() if confined else run_confined(sys.argv[1:]))
