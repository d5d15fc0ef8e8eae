"""The mid-epoch checkpoint's bad input, and the failure table of docs/mid-epoch.md (tests/faults.py,
tests/failure_table.py)."""

from tests.failure_table import named_tests_test, rows_test
from tests.faults import BadInput, bad_input_test
from tests.helpers import MID_EPOCH_ON, REPO

BAD_INPUTS = [
    BadInput(
        "checkpoint-every-0-steps", (MID_EPOCH_ON, "callbacks.mid_epoch_checkpoint.every_n_steps=0"), ("every_n_steps",)
    ),
    BadInput(
        "checkpoint-every-true-steps",
        (MID_EPOCH_ON, "callbacks.mid_epoch_checkpoint.every_n_steps=true"),
        ("every_n_steps",),
    ),
    BadInput(
        "checkpoint-every-negative-minutes",
        (MID_EPOCH_ON, "callbacks.mid_epoch_checkpoint.every_n_minutes=-1"),
        ("every_n_minutes",),
    ),
]
PAGE = REPO / "docs" / "mid-epoch.md"
ROWS = [
    (
        "`callbacks.mid_epoch_checkpoint.every_n_steps` or `every_n_minutes` is not a positive number",
        "2",
        [f"bad_input:{case.id}" for case in BAD_INPUTS],
    ),
    (
        "a mid-epoch checkpoint resumed with another",
        "2",
        [
            "tests/optional/mid_epoch/test_mid_epoch_resume.py::"
            "test_a_mid_epoch_checkpoint_resumed_in_another_order_is_refused_in_one_line"
        ],
    ),
    (
        "SIGTERM at the first step",
        "143",
        ["tests/test_faults.py::test_sigterm_at_the_first_step_names_what_to_resume_from"],
    ),
]

test_bad_input_exits_2_with_one_error_line_naming_it = bad_input_test(BAD_INPUTS)
test_every_row_of_the_table_has_its_tests_and_every_listed_row_is_in_the_table = rows_test(PAGE, ROWS)
test_the_tests_a_row_names_exist = named_tests_test(ROWS, BAD_INPUTS)
