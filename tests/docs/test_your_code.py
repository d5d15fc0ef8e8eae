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
SEARCHPATH = "'hydra.searchpath=[file://tests/foreign_conf]' model=backbone_classifier data=csv_images"
FINE_TUNING = (
    'python -c "from pathlib import Path; from tests.csv_project import write_png_dataset as w; '
    "w(Path('three_shapes'), 48); w(Path('two_shapes'), 48, ('circle', 'stripe'))\"",
    f"python -m project.train {SEARCHPATH} data.root=three_shapes trainer.max_epochs=1",
    "BEST=$(ls -t outputs/20*/*/checkpoints/best-*.ckpt | head -1)",
    f"python -m project.train {SEARCHPATH} data.root=two_shapes model.num_classes=2 init_from=$BEST "
    "'freeze=[backbone.*]'",
)
PAGE = DocsPage(
    REPO / "docs" / "your-code.md",
    not_run_here={
        MODULE_STEPS: FOLLOWED + "test_the_docs_steps_train_a_module_of_your_own_under_ddp",
        DATA_STEPS: FOLLOWED + "test_the_docs_steps_add_data_and_train_on_it_under_ddp",
        **dict.fromkeys(
            FINE_TUNING,
            "followed, in the test's own dirs, by tests/test_init_from.py::"
            "test_a_two_class_run_starts_from_a_three_class_runs_best_weights_with_its_backbone_frozen",
        ),
    },
)

docs_shell, test_the_page_names_the_lines_its_tests_depart_from, test_the_pages_command_runs_as_written = (
    docs_page_tests(PAGE)
)
