"""The commands of docs/optuna.md run as written (tests/docs_commands.py)."""

from tests.docs_commands import DocsPage, docs_page_tests
from tests.helpers import REPO

PRUNED = (
    "python -m project.train experiment=mnist hparams_search=mnist_optuna 'hydra.sweeper.pruner={_target_:optuna."
    "pruners.MedianPruner,n_startup_trials:5,n_warmup_steps:1}'"
)
PAGE = DocsPage(
    REPO / "docs" / "optuna.md",
    smaller={
        "python -m project.train experiment=mnist hparams_search=mnist_optuna": "hydra.sweeper.n_trials=2",
        PRUNED: "hydra.sweeper.n_trials=2 trainer.max_epochs=1",
    },
)

docs_shell, test_the_page_names_the_lines_its_tests_depart_from, test_the_pages_command_runs_as_written = (
    docs_page_tests(PAGE)
)
