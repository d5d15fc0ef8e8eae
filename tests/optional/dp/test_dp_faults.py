"""The failure table of docs/dp.md (tests/failure_table.py): its refusals are run by test_dp.py."""

from tests.failure_table import named_tests_test, rows_test
from tests.helpers import REPO

DP = "tests/optional/dp/test_dp.py"
PAGE = REPO / "docs" / "dp.md"
ROWS = [
    ("`trainer=dp` with `trainer.num_nodes` > 1", "2", [f"{DP}::test_dp_on_several_nodes_is_refused_in_one_line"]),
    (
        "`trainer=dp` under a launcher that started several processes",
        "2",
        [f"{DP}::test_dataparallel_under_slurm_takes_one_task_per_node"],
    ),
    ("`trainer=dp` with `compile=true`", "2", [f"{DP}::test_dp_refuses_compile_before_training"]),
    (
        "`trainer=dp` on a module with no network",
        "2",
        ["tests/optional/dp/test_dp_own_module.py::test_dataparallel_replicates_the_network_attribute_it_is_told"],
    ),
]

test_every_row_of_the_table_has_its_tests_and_every_listed_row_is_in_the_table = rows_test(PAGE, ROWS)
test_the_tests_a_row_names_exist = named_tests_test(ROWS, [])
