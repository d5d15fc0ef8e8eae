"""A module of the user's own under a two-host torchrun launch whose killed worker is restarted."""

from pathlib import Path

import pytest

from tests.helpers import REGRESSION, REPO, assert_each_rank_trained_its_half, check_ok
from tests.optional.torchrun.nodes import torchrun_nodes

# Rank 1 dies (SIGKILL) as epoch 2 of 4 starts, in torchrun's first attempt only.
CRASH = (
    "+callbacks.crash._target_=tests.crash_callback.KillAtEpochStart",
    "+callbacks.crash.epoch=2",
    "+callbacks.crash.rank=1",
    "+callbacks.crash.attempt=0",
)


@pytest.mark.slow
def test_a_two_host_torchrun_launch_trains_a_module_of_your_own_and_resumes_it_after_a_restart(
    user_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Two ranks on two "hosts", each its half every epoch; the killed worker is restarted and the run resumes
    from its last.ckpt at epoch 2."""
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # every rank imports tests.foreign_modules
    args = [f"hydra.searchpath=[file://{user_dir / 'my_conf'}]", *REGRESSION, "logger=none", "trainer.max_epochs=4"]
    launch_args = [*args, "trainer=ddp", "trainer.num_nodes=2", "trainer.devices=1", *CRASH]
    for agent in torchrun_nodes("project.train", launch_args, tmp_path, "own", options=("--max-restarts=1",)):
        check_ok(agent)
    assert_each_rank_trained_its_half(tmp_path, first_epoch=2)
