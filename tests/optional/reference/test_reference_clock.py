"""The reference loop's checkpoint clock (`every_n_minutes`), agreed by its ranks beside the training."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from project.engine.ddp import DeferredAgreement
from project.optional.reference import loop
from tests.helpers import one_rank_process_group


def test_the_reference_loops_clock_checkpoint_is_written_once_each_time_the_clock_falls_due(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """As the Lightning path's mid-epoch checkpoint writes by the clock (tests/optional/mid_epoch): one second a step
    and a write every minute, at steps 61, 122 and 183, the ranks agreeing one step after the clock fell due."""
    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(loop, "time", SimpleNamespace(monotonic=lambda: clock.now))
    writes = []
    reference = object.__new__(loop.Trainer)  # only what _checkpoint_if_due reads
    reference.checkpointing = SimpleNamespace(every_n_steps=None, every_n_minutes=1)
    reference.sigterm, reference._last_write = False, 0.0
    reference._save_checkpoint = lambda: (
        writes.append(reference.global_step),
        setattr(reference, "_last_write", clock.now),
    )
    with one_rank_process_group(tmp_path):  # the ranks agree as under DDP, on a group of this process alone
        reference.agreement = DeferredAgreement(size=2)
        for step in range(1, 200):
            clock.now = float(step)
            reference.global_step = step
            reference._checkpoint_if_due()
    assert writes == [61, 122, 183]
