"""The commands of docs/wandb.md run as written (tests/docs_commands.py), offline (tests/conftest.py sets that up)."""

from tests.docs_commands import DocsPage, docs_page_tests
from tests.helpers import REPO

PAGE = DocsPage(
    REPO / "docs" / "wandb.md",
    not_run_here={
        "wandb sync $RUN": (
            "needs a W&B server and a login; no test reaches the network: tests/optional/wandb/test_wandb.py reads the "
            "offline runs that sync would upload"
        ),
    },
)

docs_shell, test_the_page_names_the_lines_its_tests_depart_from, test_the_pages_command_runs_as_written = (
    docs_page_tests(PAGE)
)
