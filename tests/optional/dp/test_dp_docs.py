"""The commands of docs/dp.md run as written (tests/docs_commands.py)."""

from tests.docs_commands import DocsPage, docs_page_tests
from tests.helpers import REPO

PAGE = DocsPage(
    REPO / "docs" / "dp.md",
    needs_gpu=frozenset({"python -m project.train trainer=dp trainer.devices=2 trainer.precision=bf16-mixed"}),
)

docs_shell, test_the_page_names_the_lines_its_tests_depart_from, test_the_pages_command_runs_as_written = (
    docs_page_tests(PAGE)
)
