"""docs/slurm.md: its commands need root and a Slurm cluster; tests/optional/slurm/test_slurm.py runs their jobs on the
local cluster. Here, that the page's commands are the ones named (tests/docs_commands.py)."""

from tests.docs_commands import DocsPage, docs_page_tests
from tests.helpers import REPO

ON_THE_CLUSTER = (
    "root and a Slurm cluster: tests/optional/slurm/test_slurm.py submits the same jobs (the 2 x 3 job on both "
    "launchers, a submitit sweep, a requeue) to the local cluster, which .ci/run starts"
)
PAGE = DocsPage.run_elsewhere(REPO / "docs" / "slurm.md", ON_THE_CLUSTER)

docs_shell, test_the_page_names_the_lines_its_tests_depart_from, test_the_pages_command_runs_as_written = (
    docs_page_tests(PAGE)
)
