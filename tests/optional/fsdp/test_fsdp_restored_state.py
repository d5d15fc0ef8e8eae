"""trainer=fsdp's strategy reads and deletes checkpoints itself (not through the Trainer's checkpoint plugin): it reads
no URL and unpickles nothing, and deletes a checkpoint of its run only, never a path a restored state names outside
it, nor a directory that is no checkpoint (RestoredStateCheck, in project/engine/checkpoints.py, drops such paths
first)."""

from pathlib import Path

import pytest
import torch

from project.engine.build import build
from project.engine.errors import UserError
from project.optional.fsdp.checkpoints import new_version_dir, publish
from project.optional.fsdp.strategy import HydraFSDPStrategy
from tests.helpers import watched_port
from tests.test_config import compose_train
from tests.test_restored_state import TouchWhenUnpickled, assert_victim_untouched, lay_victim


def strategy_of_a_run(run: Path) -> HydraFSDPStrategy:
    """The strategy of a trainer=fsdp run in `run`, with its module, as the Trainer holds it during fit."""
    setup = build(compose_train(run, "trainer=fsdp", "logger=none"), run.parent / "outputs")
    setup.module.trainer = setup.trainer
    setup.trainer.strategy.connect(setup.module)
    return setup.trainer.strategy


def test_fsdp_deletes_its_own_checkpoints_and_nothing_a_restored_state_names_elsewhere(tmp_path: Path):
    run = tmp_path / "run"
    strategy = strategy_of_a_run(run)
    lay_victim(tmp_path)
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "link").symlink_to(tmp_path / "victim")
    lay_victim(run)  # a directory of the run that is no checkpoint
    sharded = run / "checkpoints" / "best.ckpt"
    version = Path(new_version_dir(sharded))
    (version / "meta.pt").write_bytes(b"")
    publish(version, sharded)
    for path in (f"{run}/../victim", str(tmp_path / "victim"), f"{run}/checkpoints/link", str(run / "victim")):
        strategy.remove_checkpoint(path)
    assert_victim_untouched(tmp_path)
    assert_victim_untouched(run)
    strategy.remove_checkpoint(str(sharded))
    assert sorted(path.name for path in (run / "checkpoints").iterdir()) == ["link"], "the link and its version gone"


def test_fsdp_reads_no_url_and_unpickles_nothing(tmp_path: Path):
    strategy = strategy_of_a_run(tmp_path / "run")
    with watched_port() as (port, connections), pytest.raises(UserError, match="is a URL: checkpoints are read from"):
        strategy.load_checkpoint(f"http://127.0.0.1:{port}/best.ckpt")
    assert connections == []
    torch.save({"state_dict": TouchWhenUnpickled(tmp_path / "sentinel")}, tmp_path / "payload.ckpt")
    with pytest.raises(Exception, match="Weights only load failed"):
        strategy.load_checkpoint(tmp_path / "payload.ckpt", weights_only=False)
    assert not (tmp_path / "sentinel").exists()
