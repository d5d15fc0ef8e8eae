"""The commands of docs/mid-epoch.md run as written (tests/docs_commands.py)."""

from tests.docs_commands import DocsPage, docs_page_tests
from tests.helpers import REPO

ON = "callbacks.mid_epoch_checkpoint.enabled=true"
EVERY_100_STEPS = f"{ON} callbacks.mid_epoch_checkpoint.every_n_steps=100"
PAGE = DocsPage(
    REPO / "docs" / "mid-epoch.md",
    not_run_here={
        f"timeout 30 python -m project.train experiment=mnist {ON}": "a run stopped by SIGTERM, whose exit status is "
        "timeout's 124: tests/optional/mid_epoch/test_mid_epoch_resume.py stops runs so (at a chosen step) and "
        "resumes them to the weights of a run never stopped"
    },
    smaller={
        f"python -m project.train experiment=mnist {EVERY_100_STEPS}": "trainer.max_epochs=2",
        f"python -m project.train experiment=mnist {ON} callbacks.mid_epoch_checkpoint.every_n_minutes=10": (
            "trainer.max_epochs=2"
        ),
        "python -m project.train experiment=mnist ckpt_path=last": "trainer.max_epochs=2",
        f"python -m project.optional.reference.single experiment=mnist {EVERY_100_STEPS}": "trainer.max_epochs=2",
    },
)

docs_shell, test_the_page_names_the_lines_its_tests_depart_from, test_the_pages_command_runs_as_written = (
    docs_page_tests(PAGE)
)
