"""Mid-epoch checkpoints: a run killed (SIGKILL) or stopped (SIGTERM) inside an epoch resumes to exactly the per-step
losses and weights of a run never stopped, alone and under DDP, on both paths; a mid-epoch checkpoint is refused in
one line by a run whose training order would differ.

The MNIST recipe (with its one-cycle schedule, stepped every step) on the small test files: 350 training images in
batches of 25, 14 steps per epoch alone and 7 per rank under DDP(2), 3 epochs. The stops land in the second epoch.
"""

import signal
import subprocess
from pathlib import Path

import pytest
import torch

from tests.helpers import (
    MID_EPOCH_ON,
    REPO,
    STOPPED_BY_SIGTERM,
    TRUST_TEST_CODE,
    assert_resumed_exactly,
    check_ok,
    histories,
    last_weights,
    mnist_overrides,
    run_module,
    signal_at,
)
from tests.idx_files import write_idx_split

pytestmark = pytest.mark.slow
ENV = {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}  # one thread per rank; lets a run import tests.crash_callback
DDP = ("trainer=ddp", "trainer.devices=2")


def recipe(mnist_root: Path, processes: int, *extra: str) -> list[str]:
    return mnist_overrides(
        mnist_root,
        "data.batch_size=25",
        "trainer.max_epochs=3",
        MID_EPOCH_ON,
        *(DDP if processes == 2 else ()),
        *extra,
    )


SIGTERM_IN_VALIDATION_OF_EPOCH_1 = [
    "+callbacks.crash._target_=tests.crash_callback.SignalInValidation",
    "+callbacks.crash.epoch=1",
    "+callbacks.crash.signal=SIGTERM",
]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory, mnist_root: Path) -> dict[int, Path]:
    """The run dirs of the recipe trained without a stop, by 1 and by 2 processes."""
    runs = {}
    for processes in (1, 2):
        run_dir = tmp_path_factory.mktemp(f"uninterrupted-{processes}") / "run"
        args = recipe(mnist_root, processes, f"hydra.run.dir={run_dir}")
        check_ok(run_module("project.train", *args, cwd=run_dir.parent, env=ENV))
        runs[processes] = run_dir
    return runs


@pytest.mark.parametrize(
    ("processes", "sent", "every", "signalled_after", "resumes_at"),
    [
        # SIGKILL leaves the periodic checkpoint before it: step 20 (epoch 1, batch 6 of 14).
        (1, "SIGKILL", "every_n_steps=4", 22, 20),
        # A timed checkpoint due at every step: the one of step 22, written before the kill at its end.
        (1, "SIGKILL", "every_n_minutes=1e-9", 22, 22),
        # SIGTERM writes the step it stopped after, with no periodic checkpoints at all.
        (1, "SIGTERM", None, 22, 22),
        (2, "SIGKILL", "every_n_steps=3", 11, 9),
        (2, "SIGKILL", "every_n_minutes=1e-9", 11, 11),
        # Under DDP the ranks agree on the signal during the next step (beside it, on a CPU group) and all stop after
        # the one after.
        (2, "SIGTERM", None, 9, 11),
    ],
)
def test_a_run_stopped_mid_epoch_resumes_to_the_losses_and_weights_of_a_run_never_stopped(
    tmp_path: Path,
    mnist_root: Path,
    uninterrupted: dict[int, Path],
    processes: int,
    sent: str,
    every: str | None,
    signalled_after: int,
    resumes_at: int,
):
    stopped_dir, resumed_dir = tmp_path / "stopped", tmp_path / "resumed"
    args = recipe(mnist_root, processes, *([f"callbacks.mid_epoch_checkpoint.{every}"] if every else []))
    stopped = run_module(
        "project.train", *args, *signal_at(signalled_after, sent), f"hydra.run.dir={stopped_dir}", cwd=tmp_path, env=ENV
    )
    last = stopped_dir / "checkpoints" / "last.ckpt"
    if sent == "SIGKILL":
        assert stopped.returncode == -signal.SIGKILL, stopped.stderr[-2000:]
    else:
        assert stopped.returncode == STOPPED_BY_SIGTERM, stopped.stderr[-2000:]
        line = [text for text in stopped.stderr.splitlines() if text.startswith("error:")][-1]
        assert line == (
            f"error: stopped by SIGTERM in epoch 1: resume from its last checkpoint (step {resumes_at}) with the "
            f"same command plus ckpt_path={last.resolve()}"
        )
    checkpoint = torch.load(last, map_location="cpu", weights_only=True)
    steps_per_epoch = 14 // processes
    assert checkpoint["global_step"] == resumes_at
    position = checkpoint["MNISTDataModule"]["position"]
    assert (position["epoch"], position["batches_done"]) == (1, resumes_at - steps_per_epoch)

    check_ok(resumed_from(last, args, resumed_dir))
    assert_resumed_exactly(resumed_dir, uninterrupted[processes], first_step=resumes_at)


def resumed_from(last: Path, args: list[str], resumed_dir: Path) -> subprocess.CompletedProcess:
    """The stopped run carried on as its line says, the same command plus `ckpt_path`, trusting the test callback
    that stopped it (the checkpoint's config names it, the resumed run does not)."""
    resume = [*args, f"ckpt_path={last}", TRUST_TEST_CODE, f"hydra.run.dir={resumed_dir}"]
    return run_module("project.train", *resume, cwd=resumed_dir.parent, env=ENV)


@pytest.mark.parametrize(
    ("processes", "stop", "stopped_after"),
    [
        # One process: the signal lands in epoch 1's closing validation, after its 14 training steps (28 in all).
        (1, SIGTERM_IN_VALIDATION_OF_EPOCH_1, 28),
        # DDP: signalled after step 12, the ranks agree during step 13 and stop after step 14, epoch 1's last:
        # Lightning then stops in the validation that follows it.
        (2, signal_at(12, "SIGTERM"), 14),
    ],
)
def test_a_sigterm_in_an_epochs_closing_validation_keeps_that_epochs_training(
    tmp_path: Path, mnist_root: Path, uninterrupted: dict[int, Path], processes: int, stop: list, stopped_after: int
):
    """Lightning stops a validation for SIGTERM before the epoch-end last.ckpt is written: the SIGTERM checkpoint
    must hold the epoch's training, and the resumed run go on from the next epoch to the same numbers."""
    stopped_dir, resumed_dir = tmp_path / "stopped", tmp_path / "resumed"
    args = recipe(mnist_root, processes)
    stopped = run_module("project.train", *args, *stop, f"hydra.run.dir={stopped_dir}", cwd=tmp_path, env=ENV)
    assert stopped.returncode == STOPPED_BY_SIGTERM, stopped.stderr[-2000:]
    assert f"resume from its last checkpoint (step {stopped_after})" in stopped.stderr.splitlines()[-1]
    last = stopped_dir / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, map_location="cpu", weights_only=True)
    assert checkpoint["global_step"] == stopped_after
    position = checkpoint["MNISTDataModule"]["position"]
    assert (position["epoch"], position["batches_done"]) == (2, 0), "epoch 1 trained whole, epoch 2 next"

    resumed = check_ok(resumed_from(last, args, resumed_dir))
    assert "compute` method of metric" not in resumed.stderr, "the resumed epoch 1 had nothing to count"
    assert_resumed_exactly(resumed_dir, uninterrupted[processes], first_step=stopped_after)


@pytest.fixture(scope="module")
def mid_epoch_checkpoint(tmp_path_factory: pytest.TempPathFactory, mnist_root: Path) -> Path:
    """A last.ckpt written after step 22 of one process (epoch 1, batch 8 of 14) by a SIGTERM."""
    run_dir = tmp_path_factory.mktemp("stopped") / "run"
    args = [*recipe(mnist_root, 1), *signal_at(22, "SIGTERM"), f"hydra.run.dir={run_dir}"]
    assert run_module("project.train", *args, cwd=run_dir.parent, env=ENV).returncode == STOPPED_BY_SIGTERM
    return run_dir / "checkpoints" / "last.ckpt"


@pytest.mark.parametrize(
    ("changed", "named"),
    [
        (["data.batch_size=20"], "its data.batch_size 25 (this run: 20)"),
        (list(DDP), "its processes (trainer.devices × trainer.num_nodes) 1 (this run: 2)"),
        (["data.val_size=60"], "its training samples 350 (this run: 340)"),
        (["seed=7"], "its seed 123 (this run: 7)"),
        # As many training images, other labels.
        (["data.root={other_labels}"], "its training labels' checksum"),
    ],
)
def test_a_mid_epoch_checkpoint_resumed_in_another_order_is_refused_in_one_line(
    tmp_path: Path, mnist_root: Path, mid_epoch_checkpoint: Path, changed: list[str], named: str
):
    other_labels = tmp_path / "other-labels"  # the small MNIST files' sizes, training labels drawn anew
    write_idx_split(other_labels / "MNIST" / "raw", train=True, count=400, seed=3)
    write_idx_split(other_labels / "MNIST" / "raw", train=False, count=100, seed=2)
    changed = [arg.format(other_labels=other_labels) for arg in changed]
    before = mid_epoch_checkpoint.read_bytes()
    args = [*recipe(mnist_root, 1), *changed, f"ckpt_path={mid_epoch_checkpoint}", f"hydra.run.dir={tmp_path / 'run'}"]
    args.append(TRUST_TEST_CODE)
    result = run_module("project.train", *args, cwd=tmp_path, env=ENV)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [errors[0]] * len(errors) and len(errors) in (1, 2), errors  # under DDP each rank says it once
    assert errors[0].startswith("error: ckpt_path: the checkpoint stopped part-way through epoch 1 (after batch 8)")
    assert named in errors[0]
    assert mid_epoch_checkpoint.read_bytes() == before, "the checkpoint is left as it was"


@pytest.mark.parametrize(
    ("processes", "signalled_in_batch", "stops_at_step"),
    [
        # 5 batches an epoch, windows (1 2) (3 4) (5): signalled in epoch 1's batch 3, it stops after batch 4.
        (1, 8, 5),
        # 3 batches a rank, windows (1 2) (3): signalled in epoch 1's batch 1 (the ranks agree as it starts), they
        # stop after its batch 2.
        (2, 4, 3),
    ],
)
def test_a_sigterm_inside_an_accumulation_window_stops_at_its_end_and_resumes_exactly(
    tmp_path: Path, processes: int, signalled_in_batch: int, stops_at_step: int
):
    """A checkpoint inside the window would leave its accumulated gradients behind: the run trains on to the
    window's last batch, checkpoints there, and resumes to the weights of a run never stopped."""
    args = ["data.batch_size=1", "trainer.accumulate_grad_batches=2", "logger=none", MID_EPOCH_ON]
    if processes == 2:
        args += ["trainer=ddp", "trainer.devices=2"]
    env = {**ENV, "PYTHONPATH": str(REPO)}  # the run imports tests.crash_callback
    whole, stopped, resumed = tmp_path / "whole", tmp_path / "stopped", tmp_path / "resumed"
    check_ok(run_module("project.train", *args, f"hydra.run.dir={whole}", cwd=tmp_path, env=env))
    signal_in_batch = [
        "+callbacks.crash._target_=tests.crash_callback.SignalAtBatch",
        f"+callbacks.crash.batch={signalled_in_batch}",
        "+callbacks.crash.signal=SIGTERM",
    ]
    result = run_module("project.train", *args, *signal_in_batch, f"hydra.run.dir={stopped}", cwd=tmp_path, env=env)
    assert result.returncode == STOPPED_BY_SIGTERM, result.stderr[-2000:]
    last = stopped / "checkpoints" / "last.ckpt"
    assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] == stops_at_step
    resume = [*args, f"ckpt_path={last}", TRUST_TEST_CODE, f"hydra.run.dir={resumed}"]
    check_ok(run_module("project.train", *resume, cwd=tmp_path, env=env))
    for again, once in zip(histories(resumed), histories(whole), strict=True):
        assert again["first_step"] == stops_at_step
        assert again["step_losses"] == once["step_losses"][-len(again["step_losses"]) :]
    expected, weights = (last_weights(run) for run in (whole, resumed))
    assert all(torch.equal(weights[name], tensor) for name, tensor in expected.items()), "weights differ"
