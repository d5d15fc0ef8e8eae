"""The failure table of docs/wandb.md (tests/failure_table.py): its faults are injected in test_wandb.py."""

from tests.failure_table import named_tests_test, rows_test
from tests.helpers import REPO

WANDB = "tests/optional/wandb/test_wandb.py"
PAGE = REPO / "docs" / "wandb.md"
ROWS = [
    (
        "a login (`wandb login`, `WANDB_API_KEY`) for a W&B server that does not answer",
        "0",
        [f"{WANDB}::test_a_server_that_does_not_answer_costs_one_warning_line_and_the_run_logs_offline"],
    ),
    ("a malformed `WANDB_API_KEY`", "2", [f"{WANDB}::test_a_malformed_api_key_is_one_error_line_before_training"]),
]

test_every_row_of_the_table_has_its_tests_and_every_listed_row_is_in_the_table = rows_test(PAGE, ROWS)
test_the_tests_a_row_names_exist = named_tests_test(ROWS, [])
