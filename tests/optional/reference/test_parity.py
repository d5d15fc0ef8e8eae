"""The distributed paths compute what one process computes: the claims the tutorials make in prose."""

import gc
import os
import signal
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from torch.utils.data.distributed import DistributedSampler

import project  # noqa: F401  (registers the ${launch_dir:} resolver)
from project.engine.history import TrainingHistory
from project.engine.upstream import VERSION_BASE
from project.optional.reference.ddp import train_process
from project.optional.reference.loop import Trainer, build
from project.optional.reference.parity import max_loss_difference, max_weight_difference, network_weights
from tests.helpers import (
    CONF_DIR,
    check_ok,
    free_port,
    histories,
    mnist_overrides,
    read_json,
    requires,
    run_module,
    simulated_slurm_nodes,
)

TOLERANCE = 1e-6
BATCH = 25  # 350 training images: 7 steps of 2 × 25 per epoch, no padding


def reference_cfg(tmp_path: Path, *overrides: str):
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        return compose("train", overrides=[*overrides, f"run_dir={tmp_path}"])


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoints" / "model.pt", weights_only=True)


@pytest.fixture(scope="module")
def torchrun_reference(tmp_path_factory: pytest.TempPathFactory, mnist_root: Path) -> Path:
    """The torchrun DDP reference, 2 ranks × batch 25, 2 epochs: what the other paths are held to."""
    run_dir = tmp_path_factory.mktemp("torchrun") / "run"
    args = mnist_overrides(mnist_root, "trainer.max_epochs=2", f"data.batch_size={BATCH}", f"hydra.run.dir={run_dir}")
    launcher = (sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}")
    check_ok(run_module("project.optional.reference.ddp", *args, cwd=run_dir.parent, launcher=launcher))
    return run_dir


def assert_same_training(run_dir: Path, expected_dir: Path, weights: dict[str, torch.Tensor]) -> None:
    """Every rank's per-step losses and the final weights equal those of `expected_dir`."""
    got, expected = histories(run_dir), histories(expected_dir)
    assert [h["world_size"] for h in got] == [h["world_size"] for h in expected]
    for mine, theirs in zip(got, expected, strict=True):
        assert max_loss_difference(mine["step_losses"], theirs["step_losses"]) <= TOLERANCE
    assert max_weight_difference(weights, final_weights(expected_dir)) <= TOLERANCE


@pytest.mark.slow
def test_gradient_averaging_over_two_ranks_equals_one_process_with_twice_the_batch(
    tmp_path: Path, mnist_root: Path, torchrun_reference: Path
):
    cfg = reference_cfg(tmp_path, *mnist_overrides(mnist_root, "trainer.max_epochs=2", f"data.batch_size={2 * BATCH}"))
    device = torch.device("cpu")
    datamodule, network, optimizer, schedule = build(cfg, device)
    # One process, the global order DistributedSampler gives two ranks: rank r takes items r, r+2, r+4, ...
    sampler = DistributedSampler(datamodule.train_set, num_replicas=1, rank=0, shuffle=True, seed=cfg.seed)
    trainer = Trainer(network, optimizer, schedule, device, TrainingHistory())
    trainer.fit(datamodule.loader(datamodule.train_set, sampler, train=True), None, epochs=2)

    ranks = histories(torchrun_reference)
    assert len(trainer.history.step_losses) == len(ranks[0]["step_losses"]) == 14
    # Each step's loss over 2b samples is the mean of the two ranks' losses over b samples each.
    rank_means = [(a + b) / 2 for a, b in zip(ranks[0]["step_losses"], ranks[1]["step_losses"], strict=True)]
    assert max_loss_difference(trainer.history.step_losses, rank_means) <= 1e-5
    assert max_weight_difference(network.state_dict(), final_weights(torchrun_reference)) <= 1e-5


@pytest.mark.slow
def test_slurm_reference_on_two_simulated_nodes_equals_torchrun(
    tmp_path: Path, mnist_root: Path, torchrun_reference: Path
):
    run_dir = tmp_path / "run"
    args = mnist_overrides(
        mnist_root, "trainer.max_epochs=2", f"data.batch_size={BATCH}", "trainer.devices=1", f"hydra.run.dir={run_dir}"
    )
    for node in simulated_slurm_nodes("project.optional.reference.slurm", args, cwd=tmp_path):
        check_ok(node)
    assert_same_training(run_dir, torchrun_reference, final_weights(run_dir))


@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["ddp_spawn", "slurm"])
def test_lightning_multi_process_strategies_equal_torchrun(
    tmp_path: Path, mnist_root: Path, torchrun_reference: Path, trainer: str
):
    run_dir = tmp_path / "run"
    args = mnist_overrides(
        mnist_root, f"trainer={trainer}", "trainer.max_epochs=2", f"data.batch_size={BATCH}", f"hydra.run.dir={run_dir}"
    )
    if trainer == "slurm":
        for node in simulated_slurm_nodes(
            "project.train", [*args, "trainer.num_nodes=2", "trainer.devices=1"], cwd=tmp_path
        ):
            check_ok(node)
    else:
        check_ok(run_module("project.train", *args, "trainer.devices=2", cwd=tmp_path))
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    weights = network_weights(checkpoint["state_dict"])
    assert_same_training(run_dir, torchrun_reference, weights)
    # The logged epoch numbers cover both ranks' data, as the reference's do (its rank 0 evaluates alone).
    got, expected = read_json(run_dir / "results.json"), read_json(torchrun_reference / "results.json")
    for name in ("train/loss", "train/acc", "val/loss", "val/acc", "test/loss", "test/acc"):
        assert got[name] == pytest.approx(expected[name], abs=1e-6), name


@pytest.mark.slow
@requires("torchrun")
@pytest.mark.parametrize("module", ["project.train", "project.optional.reference.ddp"])
def test_torchrun_on_two_nodes_equals_torchrun_on_one(
    tmp_path: Path, mnist_root: Path, torchrun_reference: Path, module: str
):
    """Two torchrun agents of one process each, meeting at a rendezvous as two machines' agents do: one run dir,
    named after the rendezvous id, and the per-step losses and weights of one host's two processes."""
    args = mnist_overrides(
        mnist_root,
        "trainer=ddp",
        "trainer.num_nodes=2",
        "trainer.devices=1",
        "trainer.max_epochs=2",
        f"data.batch_size={BATCH}",
    )
    from tests.optional.torchrun.nodes import torchrun_nodes

    for node in torchrun_nodes(module, args, cwd=tmp_path, run_id="two-nodes"):
        check_ok(node)
    assert [path.name for path in (tmp_path / "outputs").iterdir()] == ["torchrun-two-nodes"], "one run dir"
    run_dir = tmp_path / "outputs" / "torchrun-two-nodes"
    assert [(h["rank"], h["world_size"]) for h in histories(run_dir)] == [(0, 2), (1, 2)]
    if module == "project.train":
        weights = network_weights(torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"])
    else:
        weights = final_weights(run_dir)
    assert_same_training(run_dir, torchrun_reference, weights)


def train_in_process(tmp_path: Path, seed: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    cfg = reference_cfg(tmp_path, f"seed={seed}")
    datamodule, network, optimizer, schedule = build(cfg, torch.device("cpu"))
    trainer = Trainer(network, optimizer, schedule, torch.device("cpu"), TrainingHistory())
    trainer.fit(datamodule.train_dataloader(), datamodule.val_dataloader(), cfg.trainer.max_epochs)
    return trainer.history.step_losses, network.state_dict()


def test_same_seed_same_numbers_other_seed_other_numbers(tmp_path: Path):
    losses, weights = train_in_process(tmp_path, 123)
    again_losses, again_weights = train_in_process(tmp_path, 123)
    other_losses, other_weights = train_in_process(tmp_path, 124)
    assert losses == again_losses
    assert max_weight_difference(weights, again_weights) == 0.0
    assert losses != other_losses
    assert max_weight_difference(weights, other_weights) > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize(
    ("module", "expected"),
    [
        (
            "project.optional.reference.ddp",
            "start it as `torchrun --nproc_per_node=N -m project.optional.reference.ddp",
        ),
        (
            "project.optional.reference.slurm",
            "start it as `srun --nodes=N --ntasks-per-node=1 python -m project.optional.reference.slurm",
        ),
    ],
)
def test_reference_script_without_its_launcher_says_how_to_launch_it(tmp_path: Path, module: str, expected: str):
    result = run_module(module, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and expected in error_lines[0], result.stderr


def gloo_threads() -> int:
    return sum(
        (Path("/proc/self/task") / task / "comm").read_text().startswith("pt_gloo")
        for task in os.listdir("/proc/self/task")
    )


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc (Linux)")
def test_a_reference_rank_ends_its_gloo_threads_and_gives_sigterm_back_when_it_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A rank's process group must be gone when `train_process` returns, not at the interpreter's exit, where a gloo
    worker still releasing a collective's tensors aborts the process (CI saw SIGABRT: a SIGTERM handler had kept
    the Trainer, its DDP model and so the group alive)."""
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    handler, threads = signal.getsignal(signal.SIGTERM), gloo_threads()
    train_process(reference_cfg(tmp_path), rank=0, local_rank=0, world_size=1)
    assert read_json(tmp_path / "results.json")["test/acc"] == 1.0, "the toy trained"
    # A reference cycle holds the rank's frame, and so its group, until the collector runs (with collection off, its
    # 2 gloo threads remain): collected here, so that the verdict does not depend on where the tests before this one
    # left the collector. A strong reference, as a SIGTERM handler's would be, survives the collection.
    gc.collect()
    assert gloo_threads() == threads, "the process group's worker threads outlived the run"
    assert signal.getsignal(signal.SIGTERM) is handler
