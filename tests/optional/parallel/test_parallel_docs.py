"""The commands of docs/parallel.md run as written (tests/docs_commands.py)."""

from tests.docs_commands import DocsPage, docs_page_tests
from tests.helpers import REPO

SEARCH = (
    "python -m project.train -m experiment=mnist hparams_search=mnist_optuna hydra/launcher=parallel "
    "hydra.sweeper.n_jobs=2"
)
PAGE = DocsPage(REPO / "docs" / "parallel.md", smaller={SEARCH: "hydra.sweeper.n_trials=2 trainer.max_epochs=1"})

docs_shell, test_the_page_names_the_lines_its_tests_depart_from, test_the_pages_command_runs_as_written = (
    docs_page_tests(PAGE)
)
