"""The failure table of docs/mlflow.md (tests/failure_table.py): the lost servers are in test_mlflow.py."""

from tests.failure_table import named_tests_test, rows_test
from tests.helpers import REPO

MLFLOW = "tests/optional/mlflow/test_mlflow.py"
PAGE = REPO / "docs" / "mlflow.md"
ROWS = [
    ("the tracking server goes away mid-run", "0", [f"{MLFLOW}::test_a_server_lost_mid_run_costs_one_warning_line"]),
    (
        "no tracking server answers as the run starts",
        "2",
        [f"{MLFLOW}::test_a_server_not_there_as_the_run_starts_is_one_error_line_before_training"],
    ),
]

test_every_row_of_the_table_has_its_tests_and_every_listed_row_is_in_the_table = rows_test(PAGE, ROWS)
test_the_tests_a_row_names_exist = named_tests_test(ROWS, [])
