"""The reference loop's own checkpoint inside an epoch (`checkpoints/last.pt`: every N steps as
`callbacks.mid_epoch_checkpoint` says, and on SIGTERM), resumed to the numbers of the Lightning run never stopped."""

import json
import signal
import time
from pathlib import Path

import pytest
import torch

from tests.helpers import (
    MID_EPOCH_ON,
    REPO,
    STOPPED_BY_SIGTERM,
    check_ok,
    last_weights,
    mnist_overrides,
    requires,
    run_module,
    start_module,
)

pytestmark = [pytest.mark.slow, requires("mid_epoch")]  # the every_n_steps key is the mid-epoch checkpoint's
ENV = {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def test_the_reference_loop_stopped_mid_epoch_resumes_to_the_lightning_run_never_stopped(
    tmp_path: Path, mnist_root: Path
):
    """SIGTERM from outside, as Slurm sends it, lands wherever the loop is; the resumed run must still agree."""
    args = mnist_overrides(mnist_root, "data.batch_size=25", "trainer.max_epochs=30")
    check_ok(run_module("project.train", *args, f"hydra.run.dir={tmp_path / 'lightning'}", cwd=tmp_path, env=ENV))
    stopped_dir = tmp_path / "stopped"
    last = stopped_dir / "checkpoints" / "last.pt"
    every_5_steps = [MID_EPOCH_ON, "callbacks.mid_epoch_checkpoint.every_n_steps=5"]
    args_stopped = [*args, *every_5_steps, f"hydra.run.dir={stopped_dir}"]
    output = tmp_path / "stopped.out", tmp_path / "stopped.err"
    proc = start_module("project.optional.reference.single", args_stopped, tmp_path, *output, env=ENV)
    deadline = time.monotonic() + 120
    while not last.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    status = proc.wait(timeout=120)
    stderr = output[1].read_text()
    assert status == STOPPED_BY_SIGTERM, stderr[-3000:]
    assert stderr.splitlines()[-1].endswith(f"ckpt_path={last.resolve()}")
    first_step = torch.load(last, weights_only=True)["global_step"]
    assert 0 < first_step < 30 * 14

    resumed_dir = tmp_path / "resumed"
    check_ok(
        run_module(
            "project.optional.reference.single",
            *args,
            f"ckpt_path={last}",
            f"hydra.run.dir={resumed_dir}",
            cwd=tmp_path,
            env=ENV,
        )
    )
    lightning = json.loads((tmp_path / "lightning" / "history.rank0.json").read_text())
    resumed = json.loads((resumed_dir / "history.rank0.json").read_text())
    assert resumed["first_step"] == first_step
    assert resumed["step_losses"] == lightning["step_losses"][first_step:]
    expected = last_weights(tmp_path / "lightning")
    weights = torch.load(resumed_dir / "checkpoints" / "model.pt", weights_only=True)
    assert expected and weights.keys() == expected.keys()
    assert all(torch.equal(weights[name], tensor) for name, tensor in expected.items())
