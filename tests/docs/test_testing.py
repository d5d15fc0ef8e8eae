"""docs/testing.md names the suite's own commands (tests/docs_commands.py)."""

from tests.docs_commands import DocsPage, docs_page_tests
from tests.helpers import REPO

THIS_SUITE = "this suite itself, which CI runs from a fresh clone"
MUTANTS = (
    "a maintainer's measure of hours, not CI's: tests/docs/test_engine_page.py checks the route table it reads, "
    "and its sampled run is recorded on the page"
)
PAGE = DocsPage(
    REPO / "docs" / "testing.md",
    not_run_here={
        "make test-fast": THIS_SUITE + " (its in-process part)",
        "make test": THIS_SUITE,
        "make coverage": THIS_SUITE + " (under coverage)",
        "make test-hydra1.4": THIS_SUITE + " (its in-process part on Hydra 1.4: .ci/run runs it after make test)",
        "make mutants SAMPLE=2 SEED=1": MUTANTS,
        "make mutants ARGS=checkpoints": MUTANTS,
        'make mutants ARGS="optional --every-guard-test" SAMPLE=2 SEED=1': MUTANTS,
        "make golden": "it rewrites tests/golden/: tests/test_golden.py trains the same recipes and checks their "
        "curves, and its report line by line",
    },
)

docs_shell, test_the_page_names_the_lines_its_tests_depart_from, test_the_pages_command_runs_as_written = (
    docs_page_tests(PAGE)
)
