"""The commands of docs/fsdp.md run as written (tests/docs_commands.py)."""

import subprocess
from pathlib import Path

import torch

from tests.docs_commands import DocsPage, docs_page_tests
from tests.helpers import REPO

PAGE = DocsPage(REPO / "docs" / "fsdp.md")


def check(command: str, result: subprocess.CompletedProcess, cwd: Path) -> None:
    """The converter's plain file is one that torch.load reads, holding the run's weights and config."""
    if "project.optional.fsdp.checkpoints" in command:
        checkpoint = torch.load(cwd / "last-plain.ckpt", weights_only=True)
        assert {"state_dict", "config"} <= set(checkpoint)


docs_shell, test_the_page_names_the_lines_its_tests_depart_from, test_the_pages_command_runs_as_written = (
    docs_page_tests(PAGE, check)
)
