"""The commands of docs/optuna.md run as written (tests/docs_commands.py)."""

from tests.docs_commands import DocsPage, docs_page_tests
from tests.helpers import REPO

PRUNED = (
    "python -m project.train -m experiment=mnist hparams_search=mnist_optuna 'hydra.sweeper.pruner={_target_:optuna."
    "pruners.MedianPruner,n_startup_trials:5,n_warmup_steps:1}'"
)
SHARED = "hydra.sweeper.storage=journal://outputs/mnist_search.log"
ARRAY = (
    "sbatch --array=0-3 --nodes=1 scripts/slurm/train.sbatch hydra.mode=MULTIRUN experiment=mnist "
    f"hparams_search=mnist_optuna {SHARED}"
)
PAGE = DocsPage(
    REPO / "docs" / "optuna.md",
    not_run_here={
        ARRAY: (
            "a Slurm cluster's (the slurm part): run there on the local cluster, two tasks on small MNIST, by "
            "tests/optional/slurm/test_slurm.py::test_a_search_spread_over_a_slurm_array_shares_one_study; workers "
            "sharing a study, one killed: tests/optional/optuna/test_search_workers.py"
        )
    },
    smaller={
        f"python -m project.train -m experiment=mnist hparams_search=mnist_optuna {SHARED}": "hydra.sweeper.n_trials=2",
        "python -m project.train -m experiment=mnist hparams_search=mnist_optuna": "hydra.sweeper.n_trials=2",
        PRUNED: "hydra.sweeper.n_trials=2 trainer.max_epochs=1",
    },
)

docs_shell, test_the_page_names_the_lines_its_tests_depart_from, test_the_pages_command_runs_as_written = (
    docs_page_tests(PAGE)
)
