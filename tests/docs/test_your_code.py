"""docs/your-code.md: its steps are followed as written by tests/test_own_modules.py, which asserts what they train;
here, that the page's commands are the ones that test runs (tests/docs_commands.py)."""

from tests.docs_commands import DocsPage, docs_page_tests
from tests.helpers import REPO

FOLLOWED = "followed as written, with its files, by tests/test_own_modules.py::"
MODULE_STEPS = (
    "python -m project.train model=line_fit data=line optimized_metric=val/mse optimized_mode=min trainer=ddp "
    "trainer.devices=2 'hydra.searchpath=[file://my_conf]'"
)
DATA_STEPS = (
    "python -m project.train data=circle model=toy trainer=ddp trainer.devices=2 'hydra.searchpath=[file://my_conf]'"
)
PAGE = DocsPage(
    REPO / "docs" / "your-code.md",
    not_run_here={
        MODULE_STEPS: FOLLOWED + "test_the_docs_steps_train_a_module_of_your_own_under_ddp",
        DATA_STEPS: FOLLOWED + "test_the_docs_steps_add_data_and_train_on_it_under_ddp",
    },
)

docs_shell, test_the_page_names_the_lines_its_tests_depart_from, test_the_pages_command_runs_as_written = (
    docs_page_tests(PAGE)
)
