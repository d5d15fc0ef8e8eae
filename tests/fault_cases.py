"""The bad input that must end a run at once, in one `error:` line (exit status 2), and callbacks that fault a run.

Each `BadInput` (tests/faults.py) is run by `tests/test_faults.py` as `python -m <module> <args>` in a directory of
its own; the optional parts' cases are in their own test folders. Its args and the names its error line must contain
may hold `{dir}` (that directory), `{data}` (small MNIST files) and `{ckpt}` (the last.ckpt of a finished toy run), a
literal brace doubled (`${{key}}`); `prepare` makes the files a case needs in `{dir}` first.

Damaged MNIST files have cases of their own in tests/test_bad_data_files.py, and `project.evaluate` given a
corrupt or foreign checkpoint is in tests/test_workflow.py; they are not repeated here.
"""

import os
import random
import shutil
import signal
import time
from pathlib import Path

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig

from project.engine.run_log import process_rank
from tests.faults import BadInput


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
    BadInput("two-nodes-without-a-launcher", ("trainer=ddp", "trainer.num_nodes=2"), ("trainer.num_nodes",)),
    BadInput("added-unknown-key", ("+foo=1",), ("foo",)),
    BadInput("key-misspelt", ("trainer.max_epoch=3",), ("trainer.max_epoch", "did you mean trainer.max_epochs?")),
    BadInput("nested-key-misspelt", ("model.optimizer.lrr=0.1",), ("did you mean model.optimizer.lr?",)),
    BadInput("deleted-key-misspelt", ("~trainer.max_epoch",), ("~trainer.max_epoch deletes", "check its spelling")),
    BadInput("option-misspelt", ("trainer=ddpp",), ("trainer=ddpp", "did you mean trainer=ddp?")),
    BadInput("model-option-misspelt", ("model=mnist_mpl",), ("did you mean model=mnist_mlp?",)),
    BadInput("evaluate-key-misspelt", ("ckpt_pth=x.ckpt",), ("did you mean ckpt_path?",), module="project.evaluate"),
    BadInput("predict-option-misspelt", ("trainer=ddpp",), ("did you mean trainer=ddp?",), module="project.predict"),
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
    # Data and directories.
    BadInput("data-root-missing", ("data.root={dir}/nowhere",), ("{dir}/nowhere",), mnist=True),
    BadInput("data-root-is-a-file", ("data.root={dir}/a-file",), ("{dir}/a-file",), mnist=True, prepare=a_file),
    BadInput("run-dir-below-a-file", ("hydra.run.dir={dir}/a-file/run",), ("{dir}/a-file",), prepare=a_file),
    # Training that diverges: the toy's steps 1 and 2 at lr 1e6 stay finite, step 3's gradients do not.
    BadInput("diverging", ("model.optimizer.lr=1e6",), ("training diverged at step 3", "learning rate (now 1e+06)")),
]


class SigtermAtFirstBatch(L.Callback):
    """Sends SIGTERM to its own process as the first training batch starts: before any epoch-end checkpoint."""

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        if trainer.current_epoch == 0 and batch_idx == 0:
            signal.raise_signal(signal.SIGTERM)


class SigtermAtSetup(L.Callback):
    """Sends SIGTERM to rank 0 as the run sets up: after DDP's ranks have met, before the first epoch (Lightning
    registers its own SIGTERM handler only then); in a sweep's job `job` alone, where given."""

    def __init__(self, job: int | None = None) -> None:
        self.job = job

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if trainer.global_rank == 0 and (self.job is None or HydraConfig.get().job.num == self.job):
            signal.raise_signal(signal.SIGTERM)


class HeldRank(L.Callback):
    """Holds rank `rank` as its run is built, before it could meet the other ranks (a node that is slow to start),
    once it has written its pid to `marker`: rank 0 then waits for it inside torch's rendezvous."""

    def __init__(self, rank: int, marker: str) -> None:
        if process_rank() == rank:
            Path(marker).write_text(str(os.getpid()))
            while True:
                time.sleep(1)


class SigtermAfterFit(L.Callback):
    """Sends SIGTERM to rank 0 as `fit` ends, after Lightning has put back the SIGTERM handler it found: before the
    test and the results."""

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_rank == 0:
            signal.raise_signal(signal.SIGTERM)


class Stall:
    """Pickled, writes its `marker` and never returns: a checkpoint's write that stops halfway, its file open."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        Path(self.marker).touch()
        while True:
            time.sleep(1)


class StallInCheckpointWrite(L.Callback):
    """Holds rank 0 inside the write of its first checkpoint after `last.ckpt` (torch.save has opened the file
    when it pickles): a rank that a SIGKILL ends with a write half done, a whole `last.ckpt` beside it."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        last = Path(trainer.checkpoint_callback.dirpath) / "last.ckpt"
        if trainer.global_rank == 0 and last.exists():
            checkpoint["stall"] = Stall(self.marker)
