"""The README's commands run as written (tests/docs_commands.py)."""

from tests.docs_commands import DocsPage, docs_page_tests
from tests.helpers import REPO

PAGE = DocsPage(
    REPO / "README.md",
    not_run_here={
        "make train": "the set-up and `python -m project.train`: CI runs `make test` from a fresh clone, and the "
        "first switch below is that run",
        "make test": "this suite itself",
        "python -m project.train trainer=slurm trainer.num_nodes=2 trainer.devices=1": "runs under srun in a Slurm "
        "allocation: tests/optional/slurm/test_slurm.py on the local cluster, tests/test_strategies.py on simulated "
        "nodes",
        "make tensorboard": "a server that runs until stopped: "
        "tests/test_workflow.py::test_tensorboard_server_serves_scalars_and_hparams_of_a_run starts and queries it",
    },
    needs_gpu=frozenset({"python -m project.train trainer=gpu"}),
    smaller={"python -m project.train experiment=mnist hparams_search=mnist_optuna": "hydra.sweeper.n_trials=2"},
    placeholders={"/path/to/datasets": "datasets"},
)

docs_shell, test_the_page_names_the_lines_its_tests_depart_from, test_the_pages_command_runs_as_written = (
    docs_page_tests(PAGE)
)
