"""The commands of docs/image-folder.md run as written (tests/docs_commands.py)."""

import subprocess
from pathlib import Path

from tests.docs_commands import DocsPage, docs_page_tests
from tests.helpers import REPO

PAGE = DocsPage(
    REPO / "docs" / "image-folder.md",
    not_run_here={
        "python -m project.train data=image_folder model=tiny_cnn trainer=ddp trainer.devices=2 "
        "'hydra.searchpath=[file://my_conf]'": "followed as written, with its files, by tests/optional/image_folder/"
        "test_image_folder.py::test_the_docs_steps_add_a_network_and_train_it_under_ddp"
    },
)


def check(command: str, result: subprocess.CompletedProcess, cwd: Path) -> None:
    """The example writes the three splits it names."""
    if "project.optional.image_folder.example" in command:
        root = cwd / command.split()[-1]
        assert result.stdout.startswith("wrote ") and {path.name for path in root.iterdir()} == {"train", "val", "test"}


docs_shell, test_the_page_names_the_lines_its_tests_depart_from, test_the_pages_command_runs_as_written = (
    docs_page_tests(PAGE, check)
)
