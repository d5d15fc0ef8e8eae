"""The bad input that must end a run at once, in one `error:` line (exit status 2), and a callback that faults a run.

Each `BadInput` is run by `tests/test_faults.py` as `python -m <module> <args>` in a directory of its own. Its args
and the names its error line must contain may hold `{dir}` (that directory), `{data}` (small MNIST files) and
`{ckpt}` (the last.ckpt of a finished toy run), a literal brace doubled (`${{key}}`); `prepare` makes the files a
case needs in `{dir}` first.

Damaged MNIST files have cases of their own in tests/test_bad_data_files.py, and `project.evaluate` given a
corrupt or foreign checkpoint is in tests/test_workflow.py; they are not repeated here.
"""

import contextlib
import random
import shutil
import signal
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import optuna
import torch

from tests.helpers import run_module


@dataclass(frozen=True)
class BadInput:
    """One way to start a run wrongly, and what its error line must name."""

    id: str
    args: tuple[str, ...]
    names: tuple[str, ...]
    module: str = "project.train"
    mnist: bool = False  # run the MNIST recipe on the small test files (tests.helpers.mnist_overrides)
    prepare: Callable[[Path, Path], None] | None = None  # (case dir, a finished toy run's last.ckpt)


def a_directory(case_dir: Path, ckpt: Path) -> None:
    (case_dir / "folder.ckpt").mkdir()


def random_bytes(case_dir: Path, ckpt: Path) -> None:
    (case_dir / "random.ckpt").write_bytes(random.Random(0).randbytes(4096))


def truncated_checkpoint(case_dir: Path, ckpt: Path) -> None:
    whole = ckpt.read_bytes()
    (case_dir / "truncated.ckpt").write_bytes(whole[: len(whole) // 2])


def truncated_last_of_an_earlier_run(case_dir: Path, ckpt: Path) -> None:
    """`ckpt_path=last` picks the newest `outputs/**/checkpoints/last.ckpt`: here half of one."""
    checkpoints = case_dir / "outputs" / "earlier" / "checkpoints"
    checkpoints.mkdir(parents=True)
    truncated_checkpoint(checkpoints, ckpt)
    (checkpoints / "truncated.ckpt").rename(checkpoints / "last.ckpt")


def checkpoint_without_data(case_dir: Path, ckpt: Path) -> None:
    checkpoint = torch.load(ckpt, weights_only=True)
    del checkpoint["config"]["data"]
    torch.save(checkpoint, case_dir / "no-data.ckpt")


def a_run_dir(case_dir: Path, ckpt: Path) -> None:
    (case_dir / "earlier" / "checkpoints").mkdir(parents=True)
    shutil.copy(ckpt, case_dir / "earlier" / "checkpoints" / "last.ckpt")


def a_reference_run(case_dir: Path, ckpt: Path) -> None:
    """The reference path's own checkpoints/last.pt, as `project.optional.reference.single` writes it."""
    ran = run_module(
        "project.optional.reference.single", "logger=none", f"hydra.run.dir={case_dir / 'reference'}", cwd=case_dir
    )
    assert ran.returncode == 0, ran.stderr[-3000:]


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


def a_search_over_a_misspelt_interval(case_dir: Path, ckpt: Path) -> None:
    (case_dir / "conf" / "hparams_search").mkdir(parents=True)
    (case_dir / "conf" / "hparams_search" / "bad_space.yaml").write_text(
        "# @package _global_\ndefaults:\n  - mnist_optuna\nhydra:\n  sweeper:\n    params:\n"
        "      model.optimizer.lr: interval(1, a)\n"
    )


def a_config_dir_with_broken_yaml(case_dir: Path, ckpt: Path) -> None:
    (case_dir / "conf" / "model").mkdir(parents=True)
    (case_dir / "conf" / "model" / "broken.yaml").write_text(
        "_target_: project.example.module.ClassifierModule\nlayers: [1, 2\n"
    )


def a_file(case_dir: Path, ckpt: Path) -> None:
    (case_dir / "a-file").write_text("not a directory\n")


BAD_INPUTS = [
    # Config values.
    BadInput("max-epochs-0", ("trainer.max_epochs=0",), ("trainer.max_epochs",)),
    BadInput("seed-negative", ("seed=-1",), ("seed",)),
    BadInput("lr-negative", ("model.optimizer.lr=-1",), ("model.optimizer.lr",)),
    BadInput("lr-not-a-number", ("model.optimizer.lr=abc",), ("model.optimizer.lr",)),
    BadInput("val-size-not-a-number", ("data.val_size=abc",), ("data.val_size",), mnist=True),
    BadInput("mnist-network-on-toy-data", ("model=mnist_mlp",), ("model",)),
    BadInput("batch-larger-than-the-data", ("data.batch_size=100",), ("data.batch_size",)),
    BadInput("slurm-outside-slurm", ("trainer=slurm",), ("trainer=slurm",)),
    BadInput("two-nodes-without-a-launcher", ("trainer=ddp", "trainer.num_nodes=2"), ("trainer.num_nodes",)),
    BadInput("added-unknown-key", ("+foo=1",), ("foo",)),
    BadInput(
        "config-file-not-valid-yaml",
        ("hydra.searchpath=[file://{dir}/conf]", "model=broken"),
        ("{dir}/conf/model/broken.yaml, line 3", "is not valid YAML"),
        prepare=a_config_dir_with_broken_yaml,
    ),
    BadInput("value-refers-to-a-missing-key", ("data.batch_size=${{oops.size}}",), ("data.batch_size", "'oops.size'")),
    BadInput("unknown-precision", ("trainer.precision=banana",), ("trainer.precision",)),
    BadInput("devices-not-a-number", ("trainer.devices=abc",), ("trainer.devices",)),
    BadInput("evaluate-without-a-checkpoint", (), ("ckpt_path",), module="project.evaluate"),
    BadInput("predict-without-a-checkpoint", (), ("ckpt_path",), module="project.predict"),
    BadInput("best-results-without-checkpoints", ("results_from=best", "callbacks=none"), ("results_from",)),
    BadInput("unknown-optimized-mode", ("optimized_mode=up",), ("optimized_mode",)),
    BadInput("checkpoint-every-0-steps", ("callbacks.mid_epoch_checkpoint.every_n_steps=0",), ("every_n_steps",)),
    BadInput("checkpoint-every-true-steps", ("callbacks.mid_epoch_checkpoint.every_n_steps=true",), ("every_n_steps",)),
    BadInput(
        "checkpoint-every-negative-minutes",
        ("callbacks.mid_epoch_checkpoint.every_n_minutes=-1",),
        ("every_n_minutes",),
    ),
    # Checkpoints to resume training from.
    BadInput("resume-from-a-missing-file", ("ckpt_path={dir}/no-such.ckpt",), ("{dir}/no-such.ckpt",)),
    BadInput("resume-from-a-directory", ("ckpt_path={dir}/folder.ckpt",), ("{dir}/folder.ckpt",), prepare=a_directory),
    BadInput(
        "resume-from-random-bytes", ("ckpt_path={dir}/random.ckpt",), ("{dir}/random.ckpt",), prepare=random_bytes
    ),
    BadInput(
        "resume-from-a-truncated-checkpoint",
        ("ckpt_path={dir}/truncated.ckpt",),
        ("{dir}/truncated.ckpt",),
        prepare=truncated_checkpoint,
    ),
    BadInput(
        "resume-last-when-it-is-truncated",
        ("ckpt_path=last",),
        ("{dir}/outputs/earlier/checkpoints/last.ckpt",),
        prepare=truncated_last_of_an_earlier_run,
    ),
    BadInput("resume-another-network", ("ckpt_path={ckpt}",), ("{ckpt}",), mnist=True),
    # Checkpoints to evaluate or predict with.
    BadInput(
        "evaluate-a-run-dir",
        ("ckpt_path={dir}/earlier",),
        ("ckpt_path={dir}/earlier is a directory", "{dir}/earlier/checkpoints/last.ckpt"),
        module="project.evaluate",
        prepare=a_run_dir,
    ),
    BadInput(
        "evaluate-a-checkpoint-without-data",
        ("ckpt_path={dir}/no-data.ckpt",),
        ("{dir}/no-data.ckpt", "no data"),
        module="project.evaluate",
        prepare=checkpoint_without_data,
    ),
    BadInput(
        "predict-with-a-checkpoint-without-data",
        ("ckpt_path={dir}/no-data.ckpt",),
        ("{dir}/no-data.ckpt", "no data"),
        module="project.predict",
        prepare=checkpoint_without_data,
    ),
    BadInput(
        "evaluate-the-reference-paths-checkpoint",
        ("ckpt_path={dir}/reference/checkpoints/last.pt",),
        ("{dir}/reference/checkpoints/last.pt is not a checkpoint of this project (it holds network", "project.train"),
        module="project.evaluate",
        prepare=a_reference_run,
    ),
    # Data and directories.
    BadInput("data-root-missing", ("data.root={dir}/nowhere",), ("{dir}/nowhere",), mnist=True),
    BadInput("data-root-is-a-file", ("data.root={dir}/a-file",), ("{dir}/a-file",), mnist=True, prepare=a_file),
    BadInput(
        "search-with-a-damaged-optuna-db",
        ("hparams_search=mnist_optuna", "hydra.sweep.dir={dir}/sweep"),
        ("{dir}/sweep/optuna.db", "is not a database"),
        mnist=True,
        prepare=a_damaged_optuna_db,
    ),
    BadInput(
        "search-with-an-optuna-2-db",
        ("hparams_search=mnist_optuna", "hydra.sweep.dir={dir}/sweep"),
        ("optuna storage upgrade --storage sqlite:///{dir}/sweep/optuna.db", "hydra.sweep.dir"),
        mnist=True,
        prepare=an_optuna_2_db,
    ),
    BadInput(
        "search-space-interval-not-a-number",
        ("hydra.searchpath=[file://{dir}/conf]", "hparams_search=bad_space", "hydra.sweep.dir={dir}/sweep"),
        ("model.optimizer.lr=interval(1, a)", "interval(low, high)"),
        mnist=True,
        prepare=a_search_over_a_misspelt_interval,
    ),
    BadInput("run-dir-below-a-file", ("hydra.run.dir={dir}/a-file/run",), ("{dir}/a-file",), prepare=a_file),
    # Training that diverges: the toy's steps 1 and 2 at lr 1e6 stay finite, step 3's gradients do not.
    BadInput("diverging", ("model.optimizer.lr=1e6",), ("training diverged at step 3", "learning rate (now 1e+06)")),
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


class SigtermAtFirstBatch(L.Callback):
    """Sends SIGTERM to its own process as the first training batch starts: before any epoch-end checkpoint."""

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        if trainer.current_epoch == 0 and batch_idx == 0:
            signal.raise_signal(signal.SIGTERM)
