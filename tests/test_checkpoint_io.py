"""Checkpoint writes that are interrupted leave the previous `last.ckpt` whole (`AtomicCheckpointIO`), where
Lightning's stock `TorchCheckpointIO` does not."""

import contextlib
import errno
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch import Callback, LightningModule
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO

from project.engine.checkpoints import AtomicCheckpointIO, BestCheckpoint, check_checkpoint_dirs, resume_path
from project.engine.errors import UserError
from tests.helpers import untrained_toy_checkpoint


def test_checkpoint_write_interrupted_midway_leaves_the_previous_file_whole(tmp_path: Path, monkeypatch):
    path = tmp_path / "last.ckpt"
    checkpoint_io = AtomicCheckpointIO(tmp_path)
    checkpoint_io.save_checkpoint({"epoch": 1}, path)

    def dies_halfway(obj, file):
        Path(file).write_bytes(b"half a checkpoi")
        raise KeyboardInterrupt  # the process is stopped while writing

    monkeypatch.setattr(torch, "save", dies_halfway)
    with contextlib.suppress(KeyboardInterrupt):
        checkpoint_io.save_checkpoint({"epoch": 2}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=True) in ({"epoch": 1}, {"epoch": 2})  # one whole checkpoint or the other
    assert list(tmp_path.iterdir()) == [path]


@pytest.mark.parametrize(
    "checkpoint_io",
    [
        AtomicCheckpointIO("unused: nothing is deleted"),
        pytest.param(
            TorchCheckpointIO(),
            marks=pytest.mark.xfail(
                strict=True, reason="stock: staged in $TMPDIR, then copied over last.ckpt across filesystems"
            ),
        ),
    ],
    ids=["atomic", "lightning-stock"],
)
def test_write_stopped_while_the_file_crosses_filesystems_keeps_the_previous_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, checkpoint_io
):
    """A run dir on another filesystem than $TMPDIR (a tmpfs /tmp, a cluster's shared disk): a rename across them
    fails, `shutil.move` copies instead, and the process is stopped halfway through that copy. Writing beside the
    target and renaming within its directory never crosses filesystems."""
    path = tmp_path / "last.ckpt"
    checkpoint_io.save_checkpoint({"epoch": 1}, path)

    def rename_across_filesystems(source, target, *args, **kwargs):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    def copy_stopped_halfway(source, target, *args, **kwargs):
        data = Path(source).read_bytes()
        Path(target).write_bytes(data[: len(data) // 2])
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "rename", rename_across_filesystems)
    monkeypatch.setattr(shutil, "copyfile", copy_stopped_halfway)
    with contextlib.suppress(KeyboardInterrupt):
        checkpoint_io.save_checkpoint({"epoch": 2}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=True) in ({"epoch": 1}, {"epoch": 2})  # one whole checkpoint or the other


def test_a_write_on_a_full_disk_names_the_checkpoints_really_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The new best checkpoint does not fit: the line names the files that are there (the old best, last.ckpt), not
    the one that was never written, and its temporary file is gone."""
    checkpoint_io = AtomicCheckpointIO(tmp_path)
    for name in ("best-epoch000.ckpt", "last.ckpt"):
        checkpoint_io.save_checkpoint({"epoch": 0}, tmp_path / name)

    def fills_the_disk(obj, file):
        Path(file).write_bytes(b"part of a checkpoi")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", fills_the_disk)
    with pytest.raises(UserError) as raised:
        checkpoint_io.save_checkpoint({"epoch": 1}, tmp_path / "best-epoch001.ckpt")
    line = str(raised.value)
    assert line.startswith(f"could not write {tmp_path / 'best-epoch001.ckpt'}: no space left on the disk of "), line
    assert line.endswith(
        "make room there, or write the run elsewhere (hydra.run.dir); kept: best-epoch000.ckpt, last.ckpt"
    )
    assert sorted(path.name for path in tmp_path.iterdir()) == ["best-epoch000.ckpt", "last.ckpt"]


def test_the_first_checkpoint_that_cannot_be_written_says_none_is_kept(tmp_path: Path, monkeypatch):
    def fails(obj, file):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", fails)
    with pytest.raises(UserError, match=r"; no checkpoint was written there before it$"):
        AtomicCheckpointIO(tmp_path).save_checkpoint({"epoch": 0}, tmp_path / "checkpoints" / "last.ckpt")


def test_a_disk_that_turns_read_only_between_the_write_and_the_rename_is_the_writes_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The temporary file can then not even be removed: that failure must not replace the line the write gets."""
    checkpoint_io = AtomicCheckpointIO(tmp_path)
    checkpoint_io.save_checkpoint({"epoch": 0}, tmp_path / "last.ckpt")

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(os, "replace", read_only)
    monkeypatch.setattr(Path, "unlink", read_only)
    with pytest.raises(UserError) as raised:
        checkpoint_io.save_checkpoint({"epoch": 1}, tmp_path / "last.ckpt")
    monkeypatch.undo()
    assert str(raised.value) == (
        f"could not write {tmp_path / 'last.ckpt'}: {tmp_path} cannot be written (a read-only disk, or no permission): "
        "make it writable, or write the run elsewhere (hydra.run.dir); kept: last.ckpt"
    )
    assert torch.load(tmp_path / "last.ckpt", weights_only=True) == {"epoch": 0}


def test_a_checkpoint_dir_that_cannot_be_written_is_refused_naming_where_it_would_be_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Root writes anywhere: what cannot be written is what `os.access` says, here everything under tmp_path."""
    writable = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: writable(path, mode) and tmp_path not in Path(path).parents)
    made = tmp_path / "made"
    made.mkdir()
    with pytest.raises(UserError) as refused:
        check_checkpoint_dirs([Callback(), ModelCheckpoint(), ModelCheckpoint(dirpath=made)])
    assert str(refused.value).startswith(f"the checkpoint dir {made} cannot be written (a read-only disk, or no ")
    with pytest.raises(UserError) as refused:
        check_checkpoint_dirs([ModelCheckpoint(dirpath=made / "run" / "checkpoints")])
    assert str(refused.value).startswith(
        f"the checkpoint dir {made}/run/checkpoints (it would be made in {made}) cannot be written"
    )
    monkeypatch.undo()
    check_checkpoint_dirs([ModelCheckpoint(dirpath=made / "run" / "checkpoints")])


class LogsLoss(LightningModule):
    """A module named in the line; what it logged (`val/loss` alone) is handed to the callback, as Lightning does."""


@pytest.mark.parametrize("rank", [0, 1])
def test_a_best_metric_the_module_never_logs_is_said_once_by_rank_zero_and_the_run_goes_on(rank: int, capsys):
    best = BestCheckpoint(monitor="val/acc", mode="max")
    trainer = SimpleNamespace(lightning_module=LogsLoss(), global_rank=rank)
    for _ in range(2):
        best.monitor_not_logged(trainer, {"val/loss": torch.tensor(0.5), "epoch": 1, "step": 4})
    said = capsys.readouterr().err.splitlines()
    assert said == ([] if rank else [
        "warning: optimized_metric=val/acc is not logged by LogsLoss (it logs: val/loss): set optimized_metric to one "
        "of those and optimized_mode=min|max, or log val/acc with self.log in the module; no best checkpoint is kept"
    ])  # fmt: skip


def test_a_best_metric_the_module_never_logs_ends_the_run_where_its_results_are_that_metric():
    best = BestCheckpoint(monitor="val/acc", mode="max", results_from="best")
    trainer = SimpleNamespace(lightning_module=LogsLoss(), global_rank=1)
    with pytest.raises(
        UserError, match=r"log val/acc with self.log in the module \(results_from=best is that metric\)$"
    ):
        best.monitor_not_logged(trainer, {"val/loss": torch.tensor(0.5)})


# Data whose class's full name sorts after the toy's, as MNIST's sorts before it.
LATER_DATA = "tests.foreign_modules.RegressionData"


def test_ckpt_path_last_resumes_the_newest_earlier_run_of_the_same_model_and_data(tmp_path: Path):
    """Three earlier runs of the toy, written in another order than their names sort, then one of another network,
    two of the toy's network on other data (whose class names sort before and after the toy's), and a file that is no
    checkpoint: `ckpt_path=last` takes the toy's newest, by the time its last.ckpt was written."""
    toy = untrained_toy_checkpoint(tmp_path)
    (tmp_path / "other").mkdir()
    other = untrained_toy_checkpoint(tmp_path / "other", "model.network.num_outputs=3")
    (tmp_path / "other-data").mkdir()
    other_data = untrained_toy_checkpoint(tmp_path / "other-data", "data=mnist")
    (tmp_path / "later-data").mkdir()
    later_data = untrained_toy_checkpoint(tmp_path / "later-data", f"data._target_={LATER_DATA}")
    outputs = tmp_path / "outputs"
    junk = tmp_path / "junk.ckpt"
    junk.write_bytes(b"not a checkpoint")
    written = {"12-00-00": (toy, 100), "13-00-00": (toy, 300), "14-00-00": (toy, 200), "15-00-00": (other, 400)}
    written |= {"15-10-00": (other_data, 450), "15-20-00": (later_data, 460), "15-30-00": (junk, 500)}
    for name, (checkpoint, seconds) in written.items():
        last = outputs / "2026-12-06" / name / "checkpoints" / "last.ckpt"
        last.parent.mkdir(parents=True)
        shutil.copy(checkpoint, last)
        os.utime(last, (seconds, seconds))
    (tmp_path / "now").mkdir()
    trusted = ("+trusted_targets.mnist=project.example.data.MNISTDataModule", f"+trusted_targets.later={LATER_DATA}")
    now = untrained_toy_checkpoint(tmp_path / "now", *trusted)
    run_config = torch.load(now, weights_only=True)["config"]  # trusting the other data, or it is refused
    resumed = resume_path("last", outputs / "2026-12-06" / "16-00-00", outputs, run_config)
    assert resumed == str(outputs / "2026-12-06" / "13-00-00" / "checkpoints" / "last.ckpt")


def test_a_checkpoint_given_by_its_path_is_resumed_where_the_run_dir_holds_a_last_checkpoint_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The same command again in its run dir (`hydra.run.dir` set) with `ckpt_path=<file>`: that file, as typed,
    whether its path sorts before `last` or after it; and so in a new run dir."""
    (tmp_path / "saved").mkdir()
    given = untrained_toy_checkpoint(tmp_path / "saved")
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    shutil.copy(given, run_dir / "checkpoints" / "last.ckpt")
    run_config = torch.load(given, weights_only=True)["config"]
    monkeypatch.chdir(tmp_path)
    for typed in (str(given), "saved/last.ckpt"):
        assert resume_path(typed, run_dir, tmp_path / "outputs", run_config) == typed
        assert resume_path(typed, tmp_path / "new", tmp_path / "outputs", run_config) == typed
