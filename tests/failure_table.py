"""A docs page's "When things go wrong" table stays true: every row has the tests that inject its fault, with the
exit status the page says, and every test it names still exists.

docs/failures.md holds the core's table (tests/test_failure_table.py walks it); an optional part's page holds its
own rows, walked by that part's tests. A row's tests are "<file>::<function>", or "bad_input:<id>" for a `BadInput`
(tests/faults.py) of the cases the page's test passes in, which end with exit 2. A row added to a page without a
test, or a test renamed away, fails here.
"""

import ast
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.faults import BadInput
from tests.helpers import REPO

# (a fragment the row's first column starts with, its exit column, the tests that inject that fault).
Row = tuple[str, str, list[str]]


def table_rows(page: Path) -> list[tuple[str, str]]:
    """(what happened, exit) of each row of the page's table (an escaped `\\|` stays in its cell)."""
    section = page.read_text().split("## When things go wrong\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if line.startswith("| ") and not line.startswith("| what happened"):
            cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
            rows.append((cells[0], cells[1]))
    return rows


def defined_tests(path: str) -> set[str]:
    return {node.name for node in ast.walk(ast.parse((REPO / path).read_text())) if isinstance(node, ast.FunctionDef)}


def check_rows_match_the_page(page: Path, rows: list[Row]) -> None:
    """Each row of the page has its one entry in `rows`, with the page's exit status, and each entry its row."""
    on_page = table_rows(page)
    assert on_page, f"{page} has no table under '## When things go wrong'"
    for what, exit_status in on_page:
        listed = [(fragment, status) for fragment, status, _ in rows if what.startswith(fragment)]
        assert len(listed) == 1, f"a row of {page.name} without its one entry in the tests' rows: {what}"
        assert listed[0][1] == exit_status, f"{page.name} says exit {exit_status} for: {what}"
    for fragment, _, _ in rows:
        assert any(what.startswith(fragment) for what, _ in on_page), f"no row of {page.name} starts {fragment!r}"


def check_named_tests_exist(exit_status: str, tests: list[str], cases: list[BadInput]) -> None:
    """The tests a row names are defined where it says; a bad input among them is one of `cases` (exit 2)."""
    assert tests, "a row without a test"
    for test in tests:
        if test.startswith("bad_input:"):
            assert test.removeprefix("bad_input:") in {case.id for case in cases}, test
            assert exit_status.startswith("2"), f"a bad input ends with exit 2, not {exit_status}"
        else:
            path, name = test.split("::")
            assert name in defined_tests(path), f"{test} is not a test any more"


def rows_test(page: Path, rows: list[Row]) -> Callable:
    """The test that the page's table and `rows` match, for its module to name."""

    def test() -> None:
        check_rows_match_the_page(page, rows)

    return test


def named_tests_test(rows: list[Row], cases: list[BadInput]) -> Callable:
    """The test that the tests each row names exist, one per row, for its module to name."""

    @pytest.mark.parametrize(("fragment", "exit_status", "tests"), rows, ids=[row[0] for row in rows])
    def test(fragment: str, exit_status: str, tests: list[str]) -> None:
        check_named_tests_exist(exit_status, tests, cases)

    return test
