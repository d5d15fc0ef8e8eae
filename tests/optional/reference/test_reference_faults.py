"""The reference path's bad input, and the failure table of docs/reference.md (tests/faults.py,
tests/failure_table.py)."""

from pathlib import Path

from tests.failure_table import named_tests_test, rows_test
from tests.faults import BadInput, bad_input_test
from tests.helpers import REPO, run_module


def a_reference_run(case_dir: Path, ckpt: Path) -> None:
    """The reference path's own checkpoints/last.pt, as `project.optional.reference.single` writes it."""
    ran = run_module(
        "project.optional.reference.single", "logger=none", f"hydra.run.dir={case_dir / 'reference'}", cwd=case_dir
    )
    assert ran.returncode == 0, ran.stderr[-3000:]


BAD_INPUTS = [
    BadInput(
        "evaluate-the-reference-paths-checkpoint",
        ("ckpt_path={dir}/reference/checkpoints/last.pt",),
        ("{dir}/reference/checkpoints/last.pt is not a checkpoint of this project (it holds network", "project.train"),
        module="project.evaluate",
        prepare=a_reference_run,
    ),
    # The toy's steps 1 and 2 at lr 1e6 stay finite, step 3's gradients do not.
    BadInput(
        "diverging-reference",
        ("model.optimizer.lr=1e6",),
        ("training diverged at step 3", "learning rate (now 1e+06)"),
        module="project.optional.reference.single",
    ),
    BadInput(
        "diverging-compare",
        ("model.optimizer.lr=1e6",),
        ("the lightning run failed (exit 2): training diverged at step 3",),
        module="project.optional.reference.compare",
    ),
]
COMPARE = "tests/optional/reference/test_compare.py"
PAGE = REPO / "docs" / "reference.md"
ROWS = [
    (
        "`project.optional.reference.compare` with a Trainer setting",
        "2",
        [
            f"{COMPARE}::test_a_trainer_setting_the_reference_does_not_mirror_is_refused_before_training",
            "tests/optional/reference/test_compare_knobs.py::"
            "test_every_trainer_setting_agrees_on_both_paths_or_is_refused_in_one_line",
        ],
    ),
    (
        "`project.optional.reference.compare` or a `project.optional.reference` script on a module",
        "2",
        [
            "tests/optional/reference/test_reference_own_module.py::"
            "test_compare_refuses_a_module_of_your_own_before_training"
        ],
    ),
    (
        "`project.evaluate` or `project.predict` given the reference's `last.pt`",
        "2",
        ["bad_input:evaluate-the-reference-paths-checkpoint"],
    ),
    ("a reference run or `compare` diverges", "2", ["bad_input:diverging-reference", "bad_input:diverging-compare"]),
]

test_bad_input_exits_2_with_one_error_line_naming_it = bad_input_test(BAD_INPUTS)
test_every_row_of_the_table_has_its_tests_and_every_listed_row_is_in_the_table = rows_test(PAGE, ROWS)
test_the_tests_a_row_names_exist = named_tests_test(ROWS, BAD_INPUTS)
