"""`make mutants` runs a mutant against only the guard tests that ran its statement (scripts/mutants.py's TestMap):
the choice must never leave out a test that could see the mutant."""

from types import SimpleNamespace

from scripts import mutants

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


def test_a_statement_no_guard_test_ran_runs_only_the_tests_whose_outcome_is_unknown():
    assert chosen(50) == ["t.py::skipped_under_coverage"]
