"""The one `error:` line the engine writes for a failure a user can cause, built from the error itself
(project/engine/errors.py); the processes that end on them are tested in tests/test_faults.py."""

import errno
from pathlib import Path

import pytest
from torch.multiprocessing.spawn import ProcessRaisedException

from project.engine.errors import UserError, error_line, find_user_error, unwritable


@pytest.fixture
def checkpoints(tmp_path: Path) -> Path:
    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    (folder / "last.ckpt").write_bytes(b"")
    return folder


def test_a_disk_over_its_quota_is_named_so_with_the_checkpoints_kept(checkpoints: Path):
    line = error_line(unwritable(checkpoints / "epoch=1.ckpt", errno.EDQUOT))
    assert line == (
        f"error: could not write {checkpoints}/epoch=1.ckpt: the disk quota of {checkpoints} is used up: make room "
        "there, or write the run elsewhere (hydra.run.dir); kept: last.ckpt"
    )


def test_a_disk_that_refuses_for_another_reason_is_named_with_its_own_words(checkpoints: Path):
    line = error_line(unwritable(checkpoints / "epoch=1.ckpt", errno.EIO, detail="Input/output\n error"))
    assert line == (
        f"error: could not write {checkpoints}/epoch=1.ckpt: Input/output error: write the run elsewhere "
        "(hydra.run.dir); kept: last.ckpt"
    )


def test_an_os_error_of_a_full_disk_is_the_users_whichever_writer_met_it(checkpoints: Path):
    written = checkpoints / "events.out"
    try:
        raise RuntimeError("the logger failed") from OSError(errno.ENOSPC, "No space left on device", str(written))
    except RuntimeError as error:
        found = find_user_error(error)
    assert isinstance(found, UserError) and "no space left on the disk of" in str(found)


def test_an_error_raised_in_a_dataloader_worker_is_its_message_without_the_workers_traceback():
    """PyTorch re-raises a worker's exception with the worker's traceback in its message."""
    message = (
        "Caught UserError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
        '  File "worker.py", line 1, in fetch\nUserError: data.root=/data: no images   there'
    )
    assert error_line(UserError(message)) == "error: data.root=/data: no images there"


def test_an_error_that_is_not_the_users_is_its_type_and_message_on_one_line():
    assert error_line(KeyError("weights")) == "error: KeyError: 'weights'"


def test_a_user_error_a_spawned_worker_raised_is_its_one_line_and_exit_status():
    """ddp_spawn's parent gets only the worker's traceback, as text: the user error in it is rebuilt, chained
    exceptions before it ignored; a bug's traceback stays a bug."""
    worker = (
        "\n\n-- Process 1 terminated with the following error:\nTraceback (most recent call last):\n"
        '  File "x.py", line 1, in f\nValueError: an earlier one\n\nThe above exception was the direct cause of the '
        'following exception:\n\nTraceback (most recent call last):\n  File "y.py", line 2, in g\n'
        "project.engine.history.Diverged: training diverged at step 3 (loss nan): lower the learning rate\n"
    )
    refusal = find_user_error(ProcessRaisedException(worker, 1, 123))
    assert error_line(refusal) == "error: training diverged at step 3 (loss nan): lower the learning rate"
    assert refusal.exit_status == UserError.exit_status
    bug = "\n\nTraceback (most recent call last):\n  File \"y.py\", line 2, in g\nKeyError: 'a bug'\n"
    assert find_user_error(ProcessRaisedException(bug, 0, 123)) is None
