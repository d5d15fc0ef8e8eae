"""The failure table of docs/torchrun.md (tests/failure_table.py): the launches that fail are in test_torchrun.py."""

from tests.failure_table import named_tests_test, rows_test
from tests.helpers import REPO

TORCHRUN = "tests/optional/torchrun/test_torchrun.py"
PAGE = REPO / "docs" / "torchrun.md"
ROWS = [
    (
        "multi-node torchrun (`project.optional.torchrun.launcher`",
        "2",
        [
            f"{TORCHRUN}::test_a_node_that_never_joins_ends_the_launch_in_one_line_within_join_timeout",
            f"{TORCHRUN}::test_a_rendezvous_endpoint_nobody_serves_ends_the_launch_in_one_line",
            f"{TORCHRUN}::test_a_rendezvous_endpoint_another_program_holds_ends_the_launch_in_one_line_within_the_timeout",
            f"{TORCHRUN}::test_a_multi_node_launch_without_a_rendezvous_id_is_refused_in_one_line",
        ],
    ),
    (
        "a torchrun worker dies",
        "128+N",
        [
            f"{TORCHRUN}::test_a_killed_worker_is_restarted_and_the_run_resumes_to_the_uninterrupted_weights",
            f"{TORCHRUN}::test_a_worker_killed_with_no_restarts_left_ends_the_launch_naming_rank_and_signal",
        ],
    ),
    ("`--master-port` already in use", "2", [f"{TORCHRUN}::test_a_master_port_in_use_ends_the_launch_in_one_line"]),
]

test_every_row_of_the_table_has_its_tests_and_every_listed_row_is_in_the_table = rows_test(PAGE, ROWS)
test_the_tests_a_row_names_exist = named_tests_test(ROWS, [])
