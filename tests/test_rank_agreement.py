"""`DeferredAgreement`: a flag one rank raises reaches every rank at the same later call, over a CPU group."""

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from project.engine.rank_agreement import DeferredAgreement
from project.optional.mid_epoch import checkpoint as mid_epoch_checkpoint
from project.optional.reference import loop
from tests.helpers import one_rank_process_group, results_of_two_ranks

# Which rank raises which flag at which call: rank 1 a SIGTERM at call 2, rank 0 its clock at call 3.
RAISED = {(1, 2): (True, False), (0, 3): (False, True)}


def agree_on_rank(rank: int, port: int, results: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        agreement = DeferredAgreement(size=2)
        answers = [agreement.exchange(RAISED.get((rank, call), (False, False))) for call in range(6)]
        answers.append(agreement.settle())  # call 5's, which nobody flagged
        answers.append(agreement.settle())  # none in flight
        answers.append(agreement.now([rank == 1, False]))  # agreed at once
        results[rank] = answers
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_a_flag_raised_on_one_rank_reaches_every_rank_at_the_next_call():
    results = results_of_two_ranks(agree_on_rank)
    none, sigterm, clock = [False, False], [True, False], [False, True]
    expected = [none, none, none, sigterm, clock, none, none, none, sigterm]
    assert results[0] == results[1] == expected


def test_a_clock_checkpoint_is_written_once_each_time_the_clock_falls_due_on_both_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """One second a step and a write every minute: a write at step 61 (the clock fell due at 60 and the ranks agreed
    one step later), then every 61 steps; each clock is read again after its write resets it, so no write follows
    at once."""
    clock = SimpleNamespace(now=0.0)
    fake_time = SimpleNamespace(monotonic=lambda: clock.now)
    monkeypatch.setattr(mid_epoch_checkpoint, "time", fake_time)
    monkeypatch.setattr(loop, "time", fake_time)
    callback_writes, reference_writes = [], []
    trainer = SimpleNamespace(
        world_size=2, global_step=0, accumulate_grad_batches=1, num_training_batches=1000, ckpt_path=None
    )
    trainer.save_checkpoint = lambda path: callback_writes.append(trainer.global_step)
    trainer._signal_connector = SimpleNamespace(received_sigterm=False)
    progress = SimpleNamespace(current=SimpleNamespace(processed=0))
    trainer.fit_loop = SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=progress))
    reference = object.__new__(loop.Trainer)  # only what _checkpoint_if_due reads
    reference.checkpointing = SimpleNamespace(every_n_steps=None, every_n_minutes=1)
    reference.sigterm, reference._last_write = False, 0.0
    reference._save_checkpoint = lambda: (
        reference_writes.append(reference.global_step),
        setattr(reference, "_last_write", clock.now),
    )
    with one_rank_process_group(tmp_path):  # both agree as under DDP, on a group of this process alone
        callback = mid_epoch_checkpoint.MidEpochCheckpoint(str(tmp_path), every_n_minutes=1)
        callback.on_train_start(trainer, None)
        reference.agreement = DeferredAgreement(size=2)
        for step in range(1, 200):
            clock.now = float(step)
            trainer.global_step = reference.global_step = progress.current.processed = step
            callback.on_train_batch_end(trainer, None, None, None, step - 1)
            reference._checkpoint_if_due()
    assert callback_writes == reference_writes == [61, 122, 183]
