"""The README's commands run as written (tests/docs_commands.py)."""

from tests.docs_commands import DocsPage, docs_page_tests, page_commands
from tests.helpers import REPO


def run_on_its_page(command: str, page: str) -> dict[str, str]:
    """A README line that the page explaining it has too, and that no later README line builds on: it runs there,
    once. (Where that page is gone, or no longer has the line, it runs here.)"""
    path = REPO / page
    if not path.is_file() or command not in page_commands(path.read_text()):
        return {}
    return {command: f"the same line of {page}, whose test runs it as written"}


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
        **run_on_its_page("python -m project.train trainer=dp", "docs/dp.md"),
        **run_on_its_page(
            "python -m project.train -m model.optimizer.lr=0.1,0.5 trainer=ddp trainer.devices=2", "docs/sweeps.md"
        ),
        **run_on_its_page("python -m project.train -m model.optimizer.lr=0.01,0.1,0.5 seed=1,2", "docs/sweeps.md"),
        **run_on_its_page(
            "python -m project.train -m model.optimizer.lr=0.01,0.1 seed=1,2,3 trainer.max_epochs=2", "docs/sweeps.md"
        ),
        **run_on_its_page(
            "python -m project.train -m data.folds=2 'data.fold=range(2)' trainer.max_epochs=2", "docs/sweeps.md"
        ),
        **run_on_its_page("python -m project.train -m seed=1,2,3,4 hydra/launcher=parallel", "docs/parallel.md"),
        **run_on_its_page("python -m project.train -m experiment=mnist hparams_search=mnist_optuna", "docs/optuna.md"),
        **run_on_its_page(
            "python -m project.optional.reference.compare trainer=ddp trainer.devices=2", "docs/reference.md"
        ),
    },
    needs_gpu=frozenset({"python -m project.train trainer=gpu"}),
    placeholders={"/path/to/datasets": "datasets"},
)

docs_shell, test_the_page_names_the_lines_its_tests_depart_from, test_the_pages_command_runs_as_written = (
    docs_page_tests(PAGE)
)
