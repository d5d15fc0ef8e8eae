"""A search's bad input, and the failure table of docs/optuna.md (tests/faults.py, tests/failure_table.py)."""

import contextlib
import random
import sqlite3
from pathlib import Path

import optuna

from tests.failure_table import named_tests_test, rows_test
from tests.faults import BadInput, bad_input_test
from tests.helpers import REPO


def a_damaged_optuna_db(case_dir: Path, ckpt: Path) -> None:
    (case_dir / "sweep").mkdir()
    (case_dir / "sweep" / "optuna.db").write_bytes(random.Random(0).randbytes(4096))


def an_optuna_2_db(case_dir: Path, ckpt: Path) -> None:
    """A study file as Optuna 2.10 left it, to the check that refuses it: its schema's version (alembic's) and the
    Optuna that wrote it (the tables themselves are today's: opening stops at the version check)."""
    (case_dir / "sweep").mkdir()
    database = case_dir / "sweep" / "optuna.db"
    optuna.create_study(study_name="mnist_optuna", storage=f"sqlite:///{database}")
    with contextlib.closing(sqlite3.connect(database)) as connection, connection:
        connection.execute("UPDATE alembic_version SET version_num = 'v2.6.0.a'")
        connection.execute("UPDATE version_info SET library_version = '2.10.1'")


def a_file_where_the_journals_directory_would_be(case_dir: Path, ckpt: Path) -> None:
    (case_dir / "searches").write_text("a file, not a directory\n")


def a_search_over_a_misspelt_interval(case_dir: Path, ckpt: Path) -> None:
    (case_dir / "conf" / "hparams_search").mkdir(parents=True)
    (case_dir / "conf" / "hparams_search" / "bad_space.yaml").write_text(
        "# @package _global_\ndefaults:\n  - mnist_optuna\nhydra:\n  sweeper:\n    params:\n"
        "      model.optimizer.lr: interval(1, a)\n"
    )


BAD_INPUTS = [
    BadInput(
        "search-without-m",
        ("hparams_search=mnist_optuna",),
        ("hydra/sweeper=optuna (chosen by hparams_search=mnist_optuna)", "add -m"),
        mnist=True,
    ),
    BadInput(
        "search-with-a-damaged-optuna-db",
        ("hydra.mode=MULTIRUN", "hparams_search=mnist_optuna", "hydra.sweep.dir={dir}/sweep"),
        ("{dir}/sweep/optuna.db", "is not a database"),
        mnist=True,
        prepare=a_damaged_optuna_db,
    ),
    BadInput(
        "search-with-an-optuna-2-db",
        ("hydra.mode=MULTIRUN", "hparams_search=mnist_optuna", "hydra.sweep.dir={dir}/sweep"),
        ("optuna storage upgrade --storage sqlite:///{dir}/sweep/optuna.db", "hydra.sweep.dir"),
        mnist=True,
        prepare=an_optuna_2_db,
    ),
    BadInput(
        "search-storage-journal-cannot-be-made",
        (
            "hydra.mode=MULTIRUN",
            "hparams_search=mnist_optuna",
            "hydra.sweeper.storage=journal://{dir}/searches/study.log",
        ),
        ("hydra.sweeper.storage=journal://{dir}/searches/study.log", "a journal file in a directory you can write"),
        mnist=True,
        prepare=a_file_where_the_journals_directory_would_be,
    ),
    BadInput(
        "search-storage-of-no-known-kind",
        ("hydra.mode=MULTIRUN", "hparams_search=mnist_optuna", "hydra.sweeper.storage=jounral://{dir}/study.log"),
        ("hydra.sweeper.storage=jounral://{dir}/study.log", "journal://<file>"),
        mnist=True,
    ),
    BadInput(
        "search-grace-period-not-longer-than-the-heartbeat",
        (
            "hydra.mode=MULTIRUN",
            "hparams_search=mnist_optuna",
            "hydra.sweeper.heartbeat_interval=10",
            "hydra.sweeper.grace_period=5",
        ),
        ("hydra.sweeper.heartbeat_interval=10 and grace_period=5", "a grace period longer than it"),
        mnist=True,
    ),
    BadInput(
        "search-space-interval-not-a-number",
        (
            "hydra.searchpath=[file://{dir}/conf]",
            "hydra.mode=MULTIRUN",
            "hparams_search=bad_space",
            "hydra.sweep.dir={dir}/sweep",
        ),
        ("model.optimizer.lr=interval(1, a)", "interval(low, high)"),
        mnist=True,
        prepare=a_search_over_a_misspelt_interval,
    ),
]
PAGE = REPO / "docs" / "optuna.md"
ROWS = [
    ("a search started without `-m`", "2", ["bad_input:search-without-m"]),
    (
        "an Optuna search whose `optuna.db`",
        "2",
        ["bad_input:search-with-a-damaged-optuna-db", "bad_input:search-with-an-optuna-2-db"],
    ),
    (
        "`hydra.sweeper.storage` cannot be opened",
        "2",
        ["bad_input:search-storage-journal-cannot-be-made", "bad_input:search-storage-of-no-known-kind"],
    ),
    (
        "`hydra.sweeper.grace_period` not longer than `heartbeat_interval`",
        "2",
        ["bad_input:search-grace-period-not-longer-than-the-heartbeat"],
    ),
    ("a search space value is not what the sweeper takes", "2", ["bad_input:search-space-interval-not-a-number"]),
    (
        "the module does not log `optimized_metric`",
        "2",
        [
            "tests/optional/optuna/test_own_search.py::"
            "test_an_optuna_search_of_a_module_that_logs_no_metric_ends_at_its_first_trial"
        ],
    ),
    (
        "one trial fails",
        "1",
        [
            "tests/optional/optuna/test_search_resume.py::"
            "test_a_search_whose_trial_fails_records_it_failed_and_runs_the_others"
        ],
    ),
]

test_bad_input_exits_2_with_one_error_line_naming_it = bad_input_test(BAD_INPUTS)
test_every_row_of_the_table_has_its_tests_and_every_listed_row_is_in_the_table = rows_test(PAGE, ROWS)
test_the_tests_a_row_names_exist = named_tests_test(ROWS, BAD_INPUTS)
