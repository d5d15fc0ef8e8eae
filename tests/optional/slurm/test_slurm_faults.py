"""`trainer=slurm` where no srun started the run, and the failure table of docs/slurm.md (tests/faults.py,
tests/failure_table.py)."""

from tests.failure_table import named_tests_test, rows_test
from tests.faults import BadInput, bad_input_test
from tests.helpers import REPO

BAD_INPUTS = [BadInput("slurm-outside-slurm", ("trainer=slurm",), ("trainer=slurm",))]
PAGE = REPO / "docs" / "slurm.md"
ROWS = [("`trainer=slurm` outside a Slurm allocation", "2", ["bad_input:slurm-outside-slurm"])]

test_bad_input_exits_2_with_one_error_line_naming_it = bad_input_test(BAD_INPUTS)
test_every_row_of_the_table_has_its_tests_and_every_listed_row_is_in_the_table = rows_test(PAGE, ROWS)
test_the_tests_a_row_names_exist = named_tests_test(ROWS, BAD_INPUTS)
