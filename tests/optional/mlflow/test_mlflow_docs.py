"""The commands of docs/mlflow.md run as written (tests/docs_commands.py)."""

from tests.docs_commands import DocsPage, docs_page_tests
from tests.helpers import REPO

SERVER = "tests/optional/mlflow/test_mlflow.py starts one on a free port and logs runs, a DDP run and a sweep to it"
PAGE = DocsPage(
    REPO / "docs" / "mlflow.md",
    not_run_here={
        "mlflow server --backend-store-uri sqlite:///outputs/mlflow.db --host 127.0.0.1 --port 5000": (
            "a server that runs until stopped: " + SERVER
        ),
        "python -m project.train logger=mlflow logger.mlflow.tracking_uri=http://127.0.0.1:5000": (
            "needs the server of the line above: " + SERVER
        ),
    },
)

docs_shell, test_the_page_names_the_lines_its_tests_depart_from, test_the_pages_command_runs_as_written = (
    docs_page_tests(PAGE)
)
