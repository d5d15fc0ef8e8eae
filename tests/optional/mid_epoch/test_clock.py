"""The mid-epoch checkpoint's clock (`every_n_minutes`): the ranks agree on it beside the training, and it writes once
each time it falls due."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from project.optional.mid_epoch import checkpoint as mid_epoch_checkpoint
from tests.helpers import one_rank_process_group


def test_a_clock_checkpoint_is_written_once_each_time_the_clock_falls_due(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """One second a step and a write every minute: a write at step 61 (the clock fell due at 60 and the ranks agreed
    one step later), then every 61 steps; each clock is read again after its write resets it, so no write follows
    at once. (The reference loop's clock writes at the same steps: tests/optional/reference.)"""
    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(mid_epoch_checkpoint, "time", SimpleNamespace(monotonic=lambda: clock.now))
    writes = []
    trainer = SimpleNamespace(
        world_size=2, global_step=0, accumulate_grad_batches=1, num_training_batches=1000, ckpt_path=None
    )
    trainer.save_checkpoint = lambda path: writes.append(trainer.global_step)
    trainer._signal_connector = SimpleNamespace(received_sigterm=False)
    progress = SimpleNamespace(current=SimpleNamespace(processed=0))
    trainer.fit_loop = SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=progress))
    with one_rank_process_group(tmp_path):  # the ranks agree as under DDP, on a group of this process alone
        callback = mid_epoch_checkpoint.MidEpochCheckpoint(str(tmp_path), every_n_minutes=1)
        callback.on_train_start(trainer, None)
        for step in range(1, 200):
            clock.now = float(step)
            trainer.global_step = progress.current.processed = step
            callback.on_train_batch_end(trainer, None, None, None, step - 1)
    assert writes == [61, 122, 183]
