"""The commands of docs/reference.md run as written (tests/docs_commands.py)."""

import subprocess
from pathlib import Path

from tests.docs_commands import DocsPage, docs_page_tests, printed_run_dirs
from tests.helpers import REPO

PAGE = DocsPage(REPO / "docs" / "reference.md")


def check(command: str, result: subprocess.CompletedProcess, cwd: Path) -> None:
    """compare leaves its comparison and its picture of both loss curves; a reference run, its results."""
    if "project.optional.reference.compare" in command:
        (run_dir,) = printed_run_dirs(result.stdout)
        assert (run_dir / "loss_curves.png").is_file() and (run_dir / "comparison.json").is_file()
    elif "project.optional.reference." in command:
        (run_dir,) = printed_run_dirs(result.stdout)
        assert (run_dir / "results.json").is_file()


docs_shell, test_the_page_names_the_lines_its_tests_depart_from, test_the_pages_command_runs_as_written = (
    docs_page_tests(PAGE, check)
)
