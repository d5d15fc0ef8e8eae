"""`make mutants` runs a mutant against only the guard tests that ran its statement (scripts/mutants.py's TestMap),
and names the test that killed it: the choice must never leave out a test that could see the mutant, nor the name
misread a kill as a survivor."""

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from scripts import mutants

MUTANTS_ONLY = "cosmic-ray is installed into .venv by `make mutants`, not by `make test`"

TESTS = ["t.py::quick", "t.py::trained_first", "t.py::trained_second", "t.py::skipped_under_coverage", "t.py::other"]
MAP = mutants.TestMap(
    tests=TESTS,
    groups={"t.py::trained_first": "t.py::run", "t.py::trained_second": "t.py::run"},
    unmeasured=["t.py::skipped_under_coverage"],
    statements={10: ["t.py::quick"], 20: ["t.py::trained_first"], 30: [""], 40: ["t.py::gone"]},
)


def chosen(first: int, last: int | None = None) -> list[str]:
    spec = SimpleNamespace(start_pos=(first, 4), end_pos=(last or first, 8))
    return MAP.tests_running(spec, lambda line: 10 if line in (11, 12) else line)


def test_a_mutant_runs_the_tests_that_ran_its_statement_and_those_whose_outcome_is_unknown():
    assert chosen(10) == ["t.py::quick", "t.py::skipped_under_coverage"]
    assert chosen(12) == chosen(10)  # a later line of a multi-line statement is recorded at its first


def test_a_mutant_in_a_shared_fixtures_lines_runs_every_test_of_that_fixture():
    assert chosen(20) == ["t.py::trained_first", "t.py::trained_second", "t.py::skipped_under_coverage"]


def test_a_statement_run_outside_any_test_or_by_an_unknown_one_runs_every_guard_test():
    assert chosen(30) == TESTS
    assert chosen(40) == TESTS
    assert len(chosen(10, 30)) == 5


def test_a_statement_coverage_saw_no_guard_test_run_runs_every_guard_test():
    """Coverage does not see every line that runs (an audit hook runs untraced): no record is no proof."""
    assert chosen(50) == TESTS


CONSTANTS = """LIMIT = 3
SHARED = 5
UNREAD = 9
NAMED = 4
MADE = int("3")
EARLY = 7


def limit():
    return LIMIT + NAMED + MADE + SHARED


def early(value=EARLY):
    return value
"""


def test_a_mutant_of_a_module_constant_runs_the_tests_that_read_it_or_whose_file_names_it(tmp_path):
    """A constant's statement runs at import, outside every test: alone, that ran all of `run_dir`'s guard tests (a
    Slurm cluster's among them) against each of its 30 constants' mutants. Its value changes only what reads it."""
    (tmp_path / "m.py").write_text(CONSTANTS)
    (tmp_path / "t.py").write_text("def test_quick(): ...\ndef test_other(): ...\n")
    (tmp_path / "u.py").write_text("from m import NAMED\n\ndef test_names_it(): assert NAMED\n")
    (tmp_path / "elsewhere.py").write_text("from m import SHARED\n")
    reads = mutants.constants_read(tmp_path, Path("m.py"), [Path("t.py"), Path("u.py")])
    tests = ["t.py::quick", "t.py::other", "u.py::names_it"]
    test_map = mutants.TestMap(tests, {}, [], {10: ["t.py::quick"], 13: [""]})

    def chosen_for(line: int) -> list[str]:
        return test_map.tests_running(SimpleNamespace(start_pos=(line, 8), end_pos=(line, 9)), lambda at: at, reads)

    assert chosen_for(1) == ["t.py::quick"], "LIMIT: the test that ran the line reading it"
    assert chosen_for(4) == ["t.py::quick", "u.py::names_it"], "NAMED: and a guard file's tests that name it"
    assert chosen_for(2) == tests, "SHARED: another file imports it, whose reads coverage cannot place"
    assert chosen_for(3) == tests, "UNREAD: no read to place"
    assert chosen_for(5) == tests, "MADE: a call in its value, which may do anything at import"
    assert chosen_for(6) == tests, "EARLY: read at import, as a default"
    assert chosen_for(10) == ["t.py::quick"], "any other statement as before"


def test_the_killing_test_is_named_whole_even_where_its_parameters_hold_spaces():
    """A node id cut at its first space names no test: checked against the unmutated code it "fails" too, and the
    mutant it killed would be counted a survivor."""
    output = (
        "..F\nFAILED tests/test_schedules.py::test_one_line[factory2-10-2-interval: step] - AssertionError: x - y\n"
        "1 failed in 3.2s\n"
    )
    assert mutants.FAILED_LINE.search(output).group(1) == (
        "tests/test_schedules.py::test_one_line[factory2-10-2-interval: step]"
    )
    assert mutants.FAILED_LINE.search("ERROR tests/test_x.py::test_y - fixture failed").group(1) == (
        "tests/test_x.py::test_y"
    )


def test_the_tests_that_killed_mutants_of_the_same_line_run_first_then_the_modules_other_killers():
    done = [
        mutants.Outcome("m", 7, "a → b", True, "t.py::other"),
        mutants.Outcome("m", 9, "c → d", True, "t.py::trained_second"),
        mutants.Outcome("m", 9, "c → e", True, "t.py::trained_second"),
        mutants.Outcome("m", 3, "f → g", True, "t.py::quick"),
        mutants.Outcome("m", 7, "a → h", False, "t.py::trained_first"),  # survived: named nothing it killed
        mutants.Outcome("m", 4, "i → j", True, "timeout"),
    ]
    assert mutants.likeliest_killers_first(TESTS, 7, done) == [
        "t.py::other",
        "t.py::trained_second",
        "t.py::quick",
        "t.py::trained_first",
        "t.py::skipped_under_coverage",
    ]
    assert mutants.likeliest_killers_first(TESTS, 1, []) == TESTS
    assert mutants.likeliest_killers_first(TESTS, 7, done, killer="t.py::trained_first")[:2] == [
        "t.py::trained_first",
        "t.py::other",
    ]


def test_a_pytest_that_stops_without_a_failing_test_kills_the_mutant_only_where_it_passes_unmutated():
    """A mutant that breaks what every test goes through (an audit hook raising at each event) stops pytest before any
    test fails: the mutant's doing where the same tests pass on the unmutated code, a fault of the run where not."""
    stopped = "INTERNALERROR> AttributeError: 'NoneType' object has no attribute 'judge'\n"
    asked = []

    def unmutated(fails: bool):
        def check(tests: list[str]) -> bool:
            asked.append(tests)
            return fails

        return check

    killed = mutants.judged("m", 3, "a → b", False, stopped, ["t.py::x", "t.py::y"], unmutated(fails=False))
    assert killed.killed and "unlike unmutated: INTERNALERROR>" in killed.by
    assert asked == [["t.py::x", "t.py::y"]], "the same tests, unmutated"
    assert not mutants.judged("m", 3, "a → b", False, stopped, ["t.py::x"], unmutated(fails=True)).killed
    failing = "F\nFAILED t.py::x - AssertionError\n1 failed\n"
    assert mutants.judged("m", 3, "a → b", False, failing, ["t.py::x"], unmutated(fails=False)).by == "t.py::x"
    assert asked[-1] == ["t.py::x"]
    assert not mutants.judged("m", 3, "a → b", True, "", ["t.py::x"], unmutated(fails=False)).killed


def test_tests_fail_unmutated_where_they_fail_twice_and_a_chance_failure_is_not_kept(monkeypatch):
    """One failure of the unmutated tests by chance (a loaded machine) spares this mutant at most: the next mutant that
    selects the same tests asks again. A failure counts where a second run fails too; a pass is asked once."""
    runs = iter([True, True, False, True, False])  # each run of the unmutated tests: failed?
    asked = []

    def run(tests: list[str]) -> bool:
        asked.append(tests)
        return next(runs)

    monkeypatch.setattr(mutants.FailsUnmutated, "run", staticmethod(run))
    fails_unmutated = mutants.FailsUnmutated()
    assert fails_unmutated(["t.py::x"]), "failed twice"
    assert not fails_unmutated(["t.py::x"]), "asked again for the next mutant: passed"
    assert not fails_unmutated(["t.py::x"]), "a pass is kept"
    assert not fails_unmutated(["t.py::y"]), "failed, then passed: a chance failure"
    assert len(asked) == 5


def test_a_mutant_cosmic_ray_cannot_make_is_left_out_not_the_end_of_the_run(tmp_path):
    """cosmic-ray 8.7's exception replacer fails on a dotted name (`json.JSONDecodeError`): that mutant is left out,
    saying why, rather than ending the run (as it ended a run of `sweeps` at its 324th mutant)."""
    pytest.importorskip("cosmic_ray", reason=MUTANTS_ONLY)
    module = tmp_path / "module.py"
    module.write_text("import json\n\ntry:\n    json.loads('')\nexcept (ValueError, json.JSONDecodeError):\n    pass\n")
    replaced = [spec for spec in mutants.mutants_of(module) if spec.operator_name == "core/ExceptionReplacer"]
    assert [mutants.left_out(spec) for spec in replaced] == ["", mutants.NOT_MADE]


def confined_python(code: str) -> subprocess.CompletedProcess:
    """`code` run by this Python, from the repository, as the first process of a PID namespace of its own (the run's
    `confinement`); the test skips where none can be made, as `make mutants` refuses to run there."""
    command = [*mutants.confinement(), sys.executable, "-c", code]
    ran = subprocess.run(command, capture_output=True, text=True, cwd=mutants.REPO, timeout=120)
    if ran.returncode and "unshare" in ran.stderr:
        pytest.skip(f"no PID namespace can be made here ({ran.stderr.strip()}): `make mutants` refuses to run")
    return ran


@pytest.mark.skipif(sys.platform != "linux", reason="PID namespaces are Linux's: elsewhere the run is not confined")
def test_a_mutant_sees_and_can_signal_only_the_processes_of_its_own_run():
    """`startup.end_children` made to kill every process but its children would end, unconfined, every process of
    the user who runs `make mutants` (of the machine, as root): confined, the run is its namespace's first process,
    which its own processes cannot kill, and the only other one it sees."""
    listing = "import os; print(os.getpid(), sorted(int(name) for name in os.listdir('/proc') if name.isdigit()))"
    ran = confined_python(f"import subprocess, sys; subprocess.run([sys.executable, '-c', {listing!r}])")
    assert ran.stdout.split(maxsplit=1) == ["2", "[1, 2]\n"], ran.stderr


@pytest.mark.skipif(sys.platform != "linux", reason="PID namespaces are Linux's: elsewhere the run is not confined")
def test_a_mutants_pytest_that_outlives_its_timeout_ends_and_is_judged_a_timeout():
    """cosmic-ray kills the command's process group at the timeout; a process outside it that holds the command's
    stdout (the preloaded Python's fork that runs the tests, hung as it exits) would keep the run reading for ever."""
    pytest.importorskip("cosmic_ray", reason=MUTANTS_ONLY)
    hung = "setsid sleep 300 & sleep 300"  # the setsid'd sleep: outside the group, holding stdout
    judged = (
        "import sys; sys.path.insert(0, '.'); from scripts import mutants; from cosmic_ray.testing import run_tests\n"
        f"with mutants.strays_ended(1.0, keep=set()): print(run_tests({shlex.join(['sh', '-c', hung])!r}, 0.5))"
    )
    ran = confined_python(judged)
    assert ran.stdout.strip() == "(<TestOutcome.KILLED: 'killed'>, 'timeout')", ran.stderr


@pytest.mark.skipif(sys.platform != "linux", reason="PID namespaces are Linux's: elsewhere the run is not confined")
def test_what_a_mutants_tests_started_ends_with_them():
    """A test failed as hung leaves the processes it started where they hung: they end with the mutant's tests, not
    after the next mutant's tests ran beside them."""
    left = (
        "import subprocess, sys; sys.path.insert(0, '.'); from scripts import mutants\n"
        "with mutants.strays_ended(60.0, keep=set()): stray = subprocess.Popen(['sleep', '300'])\n"
        "print(stray.wait(timeout=5))"
    )
    ran = confined_python(left)
    assert ran.stdout.strip() == str(-signal.SIGKILL), ran.stderr


def guard_pytest_of(test_file: Path, source: str) -> subprocess.CompletedProcess:
    """A mutant's pytest (its options, this script its plugin) of `test_file` holding `source`, with a test timeout of
    1 s: it must end within 30 s, however its tests wait."""
    test_file.write_text(source)
    command = [sys.executable, "-m", "pytest", *mutants.PYTEST_OPTIONS, test_file.name]
    environment = os.environ | {"PYTHONPATH": str(mutants.REPO), mutants.TEST_TIMEOUT: "1"}
    started = time.monotonic()
    ran = subprocess.run(command, cwd=test_file.parent, env=environment, capture_output=True, text=True, timeout=50)
    assert time.monotonic() - started < 30
    return ran


def test_a_guard_test_that_hangs_fails_at_the_test_timeout_and_its_mutant_is_judged_a_timeout(tmp_path):
    """A mutant that makes one test wait for ever costs that test's timeout, not the whole run's, and its verdict
    says it hung rather than naming the test as one that saw a wrong value."""
    ran = guard_pytest_of(
        tmp_path / "test_waits.py",
        "import time\n\ndef test_quick():\n    pass\n\ndef test_hangs():\n    time.sleep(60)\n\n"
        "def test_after():\n    pass\n",
    )
    assert "FAILED test_waits.py::test_hangs - Failed: hung past the test timeout (1 s)" in ran.stdout, ran.stdout
    assert "1 failed, 1 passed" in ran.stdout, "-x: the guard files end at the hung test"

    verdict = mutants.judged("m", 3, "a  →  b", False, ran.stdout, ["test_waits.py::test_hangs"], lambda _: False)
    assert (verdict.killed, verdict.by) == (True, "timeout")
    failed = "FAILED test_waits.py::test_hangs - AssertionError: assert 1 == 2\n1 failed\n"
    verdict = mutants.judged("m", 3, "a  →  b", False, failed, ["test_waits.py::test_hangs"], lambda _: False)
    assert (verdict.killed, verdict.by) == (True, "test_waits.py::test_hangs")


def test_a_guard_pytest_that_hangs_at_its_exit_is_ended_and_its_mutant_judged_a_timeout(tmp_path):
    """A mutant that leaves a thread the interpreter waits for at its exit, after every test passed: ended at the
    exit wait, not the whole run's timeout, and judged a timeout rather than a survivor."""
    ran = guard_pytest_of(
        tmp_path / "test_left.py",
        "import threading, time\n\ndef test_leaves_a_thread():\n"
        "    threading.Thread(target=time.sleep, args=(60,)).start()\n",
    )
    assert ran.returncode != 0 and "1 passed" in ran.stdout, ran.stdout
    verdict = mutants.judged("m", 3, "a  →  b", False, ran.stdout, ["test_left.py::test_leaves_a_thread"], None)
    assert (verdict.killed, verdict.by) == (True, "timeout")


def test_where_no_namespace_can_be_made_the_run_is_refused_in_one_line_naming_why(monkeypatch, capsys):
    refusal = "unshare: unshare failed: Operation not permitted"
    monkeypatch.setattr(mutants, "confinement", lambda: [sys.executable, "-c", f"import sys; sys.exit({refusal!r})"])
    assert mutants.run_confined(["startup"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: the mutants run in a PID namespace of their own, as a mutant may kill every process it can see, and "
        f"none could be made here ({refusal}): run as root, or where unprivileged user namespaces are allowed"
    ]


def test_finished_mutants_are_kept_where_git_keeps_them_and_read_back_only_for_the_same_module_and_tests(
    tmp_path, monkeypatch
):
    """A whole run of a large module takes longer than one sitting, on more than one clone: its finished mutants are
    committed with the code (not under git-ignored outputs/), and a run goes on from them while neither the module
    nor its guard files changed."""
    path = mutants.Results("checkpoints", "a").path
    ignored = subprocess.run(["git", "check-ignore", "-q", str(path)], cwd=mutants.REPO)
    assert ignored.returncode == 1, f"{path} is not ignored by git"
    monkeypatch.setattr(mutants, "REPO", tmp_path)
    kept = mutants.Results("history", "fingerprint-a")
    kept.add(mutants.Outcome("history", 118, "+  →  -", True, "t.py::samples", key="op:3"))
    assert list(mutants.Results("history", "fingerprint-a").done) == ["op:3"]
    changed = mutants.Results("history", "fingerprint-b")
    assert changed.done == {} and changed.earlier["op:3"].by == "t.py::samples"


def judged_after_a_timeout(monkeypatch, unmutated_seconds: float | None, rerun_output: str) -> list:
    """The verdict on a mutant whose tests outran the whole run's 600 s (no test failed as hung), their unmutated run
    taking `unmutated_seconds` (None: outran 4 x 600 s too), a run given more time printing `rerun_output`; and the
    timeouts each run of it was given."""
    from cosmic_ray.work_item import TestOutcome

    given = []

    def tested(spec, selected, paths, timeout):
        given.append(timeout)
        output = "timeout" if len(given) == 1 else rerun_output
        outcome = TestOutcome.KILLED if output else TestOutcome.SURVIVED
        return SimpleNamespace(diff="-a\n+b\n", output=output, test_outcome=outcome)

    monkeypatch.setattr(mutants, "mutated_and_tested", tested)
    monkeypatch.setattr(mutants, "left_out", lambda spec: "")
    monkeypatch.setattr(mutants.UnmutatedSeconds, "run", staticmethod(lambda tests, limit: unmutated_seconds))
    spec = SimpleNamespace(module_path=Path("project/engine/ddp.py"), start_pos=(3, 0), operator_name="op")
    unmutated = mutants.Unmutated(mutants.FailsUnmutated(), mutants.UnmutatedSeconds())
    outcome = mutants.run_selected(spec, ["t.py::x"], ["t.py"], 600, unmutated)
    return [outcome, given, unmutated]


def test_a_whole_runs_timeout_kills_only_where_the_same_tests_end_well_within_it_unmutated(monkeypatch):
    """145 guard tests that take 20 minutes unmutated outrun a 600 s timeout whatever the mutant: a timeout there is
    no evidence. The mutant runs again with twice their unmutated time (and a minute), as does at once the next
    mutant that selects them; where even 4 x 600 s does not see them end unmutated, it is undecided, a survivor."""
    pytest.importorskip("cosmic_ray", reason=MUTANTS_ONLY)
    outcome, given, _ = judged_after_a_timeout(monkeypatch, 100.0, "")
    assert outcome.killed and outcome.by == "timeout" and given == [600], "quick unmutated: the timeout is the mutant's"
    outcome, given, unmutated = judged_after_a_timeout(monkeypatch, 1200.0, "")
    assert not outcome.killed and given == [600, 2460], "slow unmutated: judged again with room, it survives"
    assert (
        unmutated.seconds.timeout_for(["t.py::x"], 600) == 2460
        and unmutated.seconds.timeout_for(["t.py::y"], 600) == 600
    )
    outcome, given, _ = judged_after_a_timeout(monkeypatch, 1200.0, "timeout")
    assert outcome.killed and given == [600, 2460], "past twice its unmutated time: the mutant's slowness"
    outcome, given, _ = judged_after_a_timeout(monkeypatch, None, "")
    assert not outcome.killed and outcome.by == mutants.UNDECIDED and given == [600]


def test_a_changed_guard_file_keeps_the_verdicts_it_cannot_alter_and_runs_survivors_against_its_tests_alone(
    tmp_path, monkeypatch
):
    """A module's run takes hours; a test added for one survivor must not start it over. With the module the same, a
    kill stays while its test's file is the same, and a survivor, which every unchanged test let through, runs
    again against the changed files' tests alone; a changed module, a timeout and an undecided mutant run again."""
    monkeypatch.setattr(mutants, "REPO", tmp_path)
    then = {"m.py": "m1", "a.py": "a1", "b.py": "b1"}
    before = mutants.Results("m", "one", then)
    outcomes = {
        "by-a": mutants.Outcome("m", 1, "x", True, "a.py::kills"),
        "by-b": mutants.Outcome("m", 2, "x", True, "b.py::kills"),
        "survivor": mutants.Outcome("m", 3, "x", False, ""),
        "timeout": mutants.Outcome("m", 4, "x", True, "timeout"),
        "undecided": mutants.Outcome("m", 5, "x", False, mutants.UNDECIDED),
        "left-out": mutants.Outcome("m", 6, "x", False, mutants.NOT_PYTHON),
    }
    for key, outcome in outcomes.items():
        outcome.key = key
        before.add(outcome)
    now = mutants.Results("m", "two", {"m.py": "m1", "a.py": "a1", "b.py": "b2", "c.py": "c1"})
    assert now.done == {}
    assert now.carried("by-a", "m.py") == (outcomes["by-a"], [])
    assert now.carried("by-b", "m.py") is None
    assert now.carried("survivor", "m.py") == (outcomes["survivor"], ["b.py", "c.py"])
    assert now.carried("timeout", "m.py") is None and now.carried("undecided", "m.py") is None
    assert now.carried("left-out", "m.py") == (outcomes["left-out"], [])
    changed_module = mutants.Results("m", "three", {"m.py": "m2", "a.py": "a1", "b.py": "b1"})
    assert all(changed_module.carried(key, "m.py") is None for key in outcomes)


def test_a_changed_guard_files_tests_alone_are_mapped_again():
    """The map of 145 tests takes half an hour: a changed file's tests are mapped again, the others' kept; the tests
    of a file no longer a guard file are dropped, and a line run outside any test stays so."""
    kept = mutants.TestMap(
        tests=["a.py::one", "b.py::two", "gone.py::three"],
        groups={"b.py::two": "b.py::run", "gone.py::three": "gone.py::run"},
        unmeasured=["b.py::two"],
        statements={1: ["a.py::one", "b.py::two"], 2: ["b.py::two", "gone.py::three"], 3: [""]},
    )
    fresh = mutants.TestMap(["b.py::two", "b.py::new"], {}, [], {2: ["b.py::new"], 4: ["b.py::two"]})
    merged = kept.merged(fresh, ["b.py"], ["m.py", "a.py", "b.py"])
    assert merged.tests == ["a.py::one", "b.py::two", "b.py::new"]
    assert merged.groups == {} and merged.unmeasured == []
    assert merged.statements == {1: ["a.py::one"], 2: ["b.py::new"], 3: [""], 4: ["b.py::two"]}


def test_a_run_after_a_guard_files_change_runs_only_the_survivors_against_the_changed_files_tests(
    tmp_path, monkeypatch
):
    """What `Results.carried` keeps is not run; a survivor runs against the selected tests of the changed files (none
    selected there: it stays a survivor, unrun)."""
    monkeypatch.setattr(mutants, "REPO", tmp_path)
    monkeypatch.chdir(tmp_path)  # the copy, where the run reads the module
    (tmp_path / "m.py").write_text("")
    specs = [
        SimpleNamespace(start_pos=(line, 0), end_pos=(line, 1), key=key) for line, key in [(1, "k"), (2, "s"), (3, "t")]
    ]
    before = mutants.Results("m", "one", {"m.py": "m1", "a.py": "a1", "b.py": "b1"})
    before.add(mutants.Outcome("m", 1, "x", True, "a.py::one", key="k"))
    before.add(mutants.Outcome("m", 2, "x", False, "", key="s"))
    before.add(mutants.Outcome("m", 3, "x", False, "", key="t"))
    test_map = mutants.TestMap(
        ["a.py::one", "b.py::two"], {}, [], {1: ["a.py::one"], 2: ["a.py::one", "b.py::two"], 3: ["a.py::one"]}
    )
    ran = []

    def run_mutant(spec, selected, files, timeout, unmutated):
        ran.append((spec.key, selected, files))
        return mutants.Outcome("m", spec.start_pos[0], "x", True, "b.py::two", key=spec.key)

    monkeypatch.setattr(mutants, "chosen_mutants", lambda path, sample, seed: specs)
    monkeypatch.setattr(mutants, "mutant_key", lambda spec: spec.key)
    monkeypatch.setattr(mutants, "fingerprint", lambda path, files: "two")
    monkeypatch.setattr(mutants, "file_hashes", lambda path, files: {"m.py": "m1", "a.py": "a1", "b.py": "b2"})
    monkeypatch.setattr(mutants, "test_map_of", lambda *args: test_map)
    monkeypatch.setattr(mutants, "first_lines", lambda path: lambda line: line)
    monkeypatch.setattr(mutants, "run_mutant", run_mutant)
    arguments = SimpleNamespace(every_guard_test=False, sample=0, seed=0, timeout=600, map_timeout=7200)
    outcomes = mutants.run_module_mutants("m", Path("m.py"), ["a.py", "b.py"], arguments, None)
    assert ran == [("s", ["b.py::two"], ["b.py"])]
    assert [(outcome.key, outcome.killed) for outcome in outcomes] == [("k", True), ("s", True), ("t", False)]
    assert set(mutants.Results("m", "two").done) == {"k", "s", "t"}, "all three recorded under the new fingerprint"


def test_a_run_gives_a_constants_mutant_the_tests_that_read_it(tmp_path, monkeypatch):
    """The run itself reads the module's constants from the copy (its current dir) and chooses by them."""
    monkeypatch.setattr(mutants, "REPO", tmp_path)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.py").write_text("LIMIT = 3\n\n\ndef limit():\n    return LIMIT\n")
    (tmp_path / "a.py").write_text("")
    spec = SimpleNamespace(start_pos=(1, 8), end_pos=(1, 9), key="c")
    test_map = mutants.TestMap(["a.py::reads", "a.py::other"], {}, [], {1: [""], 5: ["a.py::reads"]})
    ran = []

    def run_mutant(spec, selected, files, timeout, unmutated):
        ran.append(selected)
        return mutants.Outcome("m", 1, "x", True, "a.py::reads", key=spec.key)

    monkeypatch.setattr(mutants, "chosen_mutants", lambda path, sample, seed: [spec])
    monkeypatch.setattr(mutants, "mutant_key", lambda spec: spec.key)
    monkeypatch.setattr(mutants, "test_map_of", lambda *args: test_map)
    monkeypatch.setattr(mutants, "first_lines", lambda path: lambda line: line)
    monkeypatch.setattr(mutants, "run_mutant", run_mutant)
    arguments = SimpleNamespace(every_guard_test=False, sample=0, seed=0, timeout=600, map_timeout=7200)
    mutants.run_module_mutants("m", Path("m.py"), ["a.py"], arguments, None)
    assert ran == [["a.py::reads"]]


def test_the_kept_map_is_mapped_again_for_the_changed_guard_files_alone_and_whole_for_a_changed_module(
    tmp_path, monkeypatch
):
    """Which files the mapping pass is given: all at first, none for the same fingerprint, the changed test files
    where the module is the same (their files hashed as `Results` recorded them), all again for a changed module."""
    monkeypatch.setattr(mutants, "REPO", tmp_path)
    mapped = []

    def mapping_pass(module_path, guard_files, timeout):
        mapped.append(guard_files)
        return mutants.TestMap([f"{name}::new" for name in guard_files], {}, [], {1: [f"{guard_files[0]}::new"]})

    monkeypatch.setattr(mutants, "mapping_pass", mapping_pass)
    first = mutants.Results("m", "one", {"m.py": "m1", "a.py": "a1", "b.py": "b1"})
    mutants.test_map_of(Path("m.py"), ["a.py", "b.py"], first, 60)
    assert mapped == [["a.py", "b.py"]]
    assert mutants.test_map_of(Path("m.py"), ["a.py", "b.py"], first, 60).tests == ["a.py::new", "b.py::new"]
    assert len(mapped) == 1, "kept for the same fingerprint"
    tests_changed = mutants.Results("m", "two", {"m.py": "m1", "a.py": "a1", "b.py": "b2"})
    assert mutants.test_map_of(Path("m.py"), ["a.py", "b.py"], tests_changed, 60).tests == ["a.py::new", "b.py::new"]
    assert mapped[-1] == ["b.py"]
    module_changed = mutants.Results("m", "three", {"m.py": "m2", "a.py": "a1", "b.py": "b2"})
    mutants.test_map_of(Path("m.py"), ["a.py", "b.py"], module_changed, 60)
    assert mapped[-1] == ["a.py", "b.py"]


def test_a_mapping_pass_that_outruns_its_timeout_ends_the_run_in_one_line_naming_the_option(tmp_path, monkeypatch):
    """`ddp`'s guard tests under coverage beside another run outran the 40 min the pass once had, and the run ended
    in a traceback, the pass's half hour lost: the limit is an option of its own, and its end one line naming it."""
    pytest.importorskip("coverage")
    import tests.preloaded_python

    def outruns(command, **settings):
        raise subprocess.TimeoutExpired(command, settings["timeout"])

    monkeypatch.setattr(
        tests.preloaded_python.PreloadedPython, "get", lambda: SimpleNamespace(server=SimpleNamespace(pid=0))
    )
    monkeypatch.setattr(mutants.subprocess, "run", outruns)
    with pytest.raises(mutants.MappingTooSlow) as stopped:
        mutants.mapping_pass(Path("project/engine/ddp.py"), ["tests/test_waits.py"], 60)
    assert str(stopped.value) == (
        "error: project/engine/ddp.py's guard tests did not end within 60 s under coverage (the mapping pass, all of "
        "them at once): give it longer with --map-timeout"
    )
    assert mutants.parse_arguments([]).map_timeout == 7200


def test_the_run_ends_with_the_mapping_passs_line_last_and_status_2(tmp_path, monkeypatch, capsys):
    """The line is the run's last word, on stderr, and `make mutants` fails."""

    def too_slow(*args):
        raise mutants.MappingTooSlow("error: the pass's line")

    monkeypatch.chdir(tmp_path)  # the run works in its copy
    monkeypatch.setattr(mutants, "scratch_copy", lambda: contextlib.nullcontext(tmp_path))
    monkeypatch.setattr(mutants, "preloaded_pytest", lambda copy: contextlib.nullcontext())
    monkeypatch.setattr(mutants, "run_module_mutants", too_slow)
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv(mutants.TEST_TIMEOUT, "")
    assert mutants.main(["ddp"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == "error: the pass's line"
