"""The commands of docs/sweeps.md run as written (tests/docs_commands.py), and its sweeps over seeds or folds end
with their summary."""

import re
import subprocess
from pathlib import Path

from tests.docs_commands import DocsPage, docs_page_tests
from tests.helpers import REPO

PAGE = DocsPage(REPO / "docs" / "sweeps.md")


def summarised(command: str, result: subprocess.CompletedProcess, cwd: Path) -> None:
    """A sweep whose seed or fold takes several values ends with the summary, whose n add up to its jobs."""
    if re.search(r" seed=\d+,|data\.fold=range", command):
        assert "\nOver " in result.stdout, result.stdout[-3000:]
        jobs = int(re.search(r"\nSweep: (\d+) job", result.stdout)[1])
        summary = result.stdout.split("\nOver ", 1)[1].split("\n---", 2)[1].splitlines()[2:]
        assert sum(int(re.split(r"\s{2,}", line)[1]) for line in summary) == jobs, summary


docs_shell, test_the_page_names_the_lines_its_tests_depart_from, test_the_pages_command_runs_as_written = (
    docs_page_tests(PAGE, summarised)
)
