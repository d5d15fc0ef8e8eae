"""The commands of docs/reproducibility.md run as written (tests/docs_commands.py)."""

from tests.docs_commands import DocsPage, docs_page_tests
from tests.helpers import REPO

PAGE = DocsPage(REPO / "docs" / "reproducibility.md")

docs_shell, test_the_page_names_the_lines_its_tests_depart_from, test_the_pages_command_runs_as_written = (
    docs_page_tests(PAGE)
)
