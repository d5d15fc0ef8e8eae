"""docs/torchrun.md: its commands start torchrun on several machines; tests/optional/torchrun/test_torchrun.py runs
two agents on one host as two machines, and tests/optional/slurm/test_slurm.py the page's lines on the local
cluster's two nodes. Here, that the page's commands are the ones named (tests/docs_commands.py)."""

from tests.docs_commands import DocsPage, docs_page_tests
from tests.helpers import REPO

ON_SEVERAL_MACHINES = (
    "torchrun on several machines: tests/optional/torchrun/test_torchrun.py launches two agents as two machines "
    "(restarts, failures, weights), tests/optional/slurm/test_slurm.py these lines on the local cluster's nodes"
)
PAGE = DocsPage.run_elsewhere(REPO / "docs" / "torchrun.md", ON_SEVERAL_MACHINES)

docs_shell, test_the_page_names_the_lines_its_tests_depart_from, test_the_pages_command_runs_as_written = (
    docs_page_tests(PAGE)
)
