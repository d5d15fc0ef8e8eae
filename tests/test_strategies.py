"""Each strategy is one config word, and a run is one directory whatever its process count."""

from pathlib import Path
from types import SimpleNamespace

import pytest
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy
from torch.utils.data import DataLoader, RandomSampler

from project.engine.ddp import check_even_batches, evaluated_once
from project.engine.errors import UserError
from tests.helpers import (
    SRUN_TASK_ZERO,
    check_ok,
    histories,
    mnist_overrides,
    read_json,
    run_module,
    simulated_slurm_nodes,
)

pytestmark = pytest.mark.slow
TRAIN_IMAGES, BATCH = 350, 25


def assert_one_run_by_rank_zero(run_dir: Path, world_size: int, stdout: str) -> None:
    """World size seen by every rank, each rank's equal share of every epoch, rank 0 the only writer."""
    ranks = histories(run_dir)
    assert [h["rank"] for h in ranks] == list(range(world_size))
    assert all(h["world_size"] == world_size for h in ranks)
    share = -(-TRAIN_IMAGES // world_size)  # DistributedSampler pads up to an equal share
    assert all(h["epoch_samples"] == [share] * 2 for h in ranks), [h["epoch_samples"] for h in ranks]
    assert read_json(run_dir / "results.json")["world_size"] == world_size
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert len(checkpoints) == 2 and checkpoints[0].startswith("best-epoch") and checkpoints[1] == "last.ckpt"
    assert stdout.count("Results") == 1, "only rank 0 prints the results table"
    assert len(list(run_dir.rglob("config.yaml"))) == 1


def test_ddp_two_processes_write_one_run_dir(tmp_path: Path, mnist_root: Path):
    args = mnist_overrides(
        mnist_root, "trainer=ddp", "trainer.devices=2", "trainer.max_epochs=2", f"data.batch_size={BATCH}"
    )
    result = check_ok(run_module("project.train", *args, cwd=tmp_path))
    run_dirs = [p for p in (tmp_path / "outputs").glob("*/*") if p.is_dir()]
    assert len(run_dirs) == 1, run_dirs
    assert_one_run_by_rank_zero(run_dirs[0], 2, result.stdout)
    assert (run_dirs[0] / "train.rank1.log").exists(), "rank 1 logs to its own file"


def test_ddp_spawn_two_processes_write_one_run_dir(tmp_path: Path, mnist_root: Path):
    args = mnist_overrides(
        mnist_root,
        "trainer=ddp_spawn",
        "trainer.devices=2",
        "trainer.max_epochs=2",
        f"data.batch_size={BATCH}",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    result = check_ok(run_module("project.train", *args, cwd=tmp_path))
    assert_one_run_by_rank_zero(tmp_path / "run", 2, result.stdout)


def test_simulated_two_node_slurm_run_writes_one_run_dir(tmp_path: Path, mnist_root: Path):
    args = mnist_overrides(
        mnist_root,
        "trainer=ddp",
        "trainer.num_nodes=2",
        "trainer.devices=1",
        "trainer.max_epochs=2",
        f"data.batch_size={BATCH}",
    )
    nodes = simulated_slurm_nodes("project.train", args, cwd=tmp_path)
    for node in nodes:
        check_ok(node)
    run_dirs = [p.name for p in (tmp_path / "outputs").iterdir()]
    assert run_dirs == ["slurm-4242.0"], "every task derives the run dir from the Slurm job and step ids"
    assert_one_run_by_rank_zero(tmp_path / "outputs" / "slurm-4242.0", 2, nodes[0].stdout + nodes[1].stdout)


def sweep_jobs(sweep_dir: Path) -> list[Path]:
    return sorted(p for p in sweep_dir.iterdir() if p.is_dir())


def test_ddp_sweep_runs_each_job_once_in_its_own_dir(tmp_path: Path):
    sweep_dir = tmp_path / "sweep"
    result = check_ok(
        run_module(
            "project.train",
            "-m",
            "model.optimizer.lr=0.1,0.5",
            "trainer=ddp",
            "trainer.devices=2",
            "logger=none",
            f"hydra.sweep.dir={sweep_dir}",
            cwd=tmp_path,
        )
    )
    jobs = sweep_jobs(sweep_dir)
    assert [job.name for job in jobs] == ["0", "1"]
    for job, lr in zip(jobs, (0.1, 0.5), strict=True):
        ranks = histories(job)
        assert [h["world_size"] for h in ranks] == [2, 2]
        assert all(h["epoch_samples"] == [2, 2, 2] for h in ranks), "toy: 5 points padded to 3 per rank, batch 2"
        assert f"model.optimizer.lr={lr}" in (job / ".hydra" / "overrides.yaml").read_text()
    losses = [histories(job)[0]["step_losses"][-1] for job in jobs]
    assert losses[0] != losses[1], "the two jobs trained with different learning rates"
    assert result.stdout.count("Results") == 2
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "multirun").exists(), "no stray dirs"
    summary = result.stdout[result.stdout.index("Sweep: 2 job(s)") :]
    for job, lr in ((0, 0.1), (1, 0.5)):
        line = next(line for line in summary.splitlines() if line.startswith(f"{job}    "))
        assert f"model.optimizer.lr={lr}" in line and str(sweep_dir / str(job)) in line
        assert f"{read_json(sweep_dir / str(job) / 'results.json')['val/acc']:.4f}" in line


def test_sweep_over_device_counts_gives_each_job_its_world_size(tmp_path: Path):
    sweep_dir = tmp_path / "sweep"
    check_ok(
        run_module(
            "project.train",
            "-m",
            "trainer.devices=1,2",
            "trainer=ddp",
            "logger=none",
            f"hydra.sweep.dir={sweep_dir}",
            cwd=tmp_path,
        )
    )
    one, two = sweep_jobs(sweep_dir)
    assert [(h["world_size"], h["epoch_samples"]) for h in histories(one)] == [(1, [4, 4, 4])]
    assert [(h["world_size"], h["epoch_samples"]) for h in histories(two)] == [(2, [2, 2, 2])] * 2


@pytest.mark.parametrize(
    ("overrides", "env", "expected"),
    [
        (["trainer.devices=0"], {}, "trainer.devices must be a positive number"),
        (["trainer=gpu", "trainer.devices=64"], {}, "gpu"),
        (
            ["trainer=slurm", "trainer.devices=2"],
            SRUN_TASK_ZERO,  # a task of a two-node job, one task per node
            "HINT: Set `devices=1`. (trainer.devices, trainer.num_nodes)",
        ),
        (["trainer.strategy=warp_drive"], {}, "trainer.strategy='warp_drive' is not a known strategy"),
    ],
)
def test_bad_strategy_input_ends_with_one_clear_line(tmp_path: Path, overrides, env, expected):
    result = run_module("project.train", *overrides, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, env=env)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and expected in error_lines[0], result.stderr[-2000:]


@pytest.mark.parametrize(
    ("samples", "batch_size", "refused"),
    [
        (15, 8, False),
        (15, 7, True),
        (15, 1, True),
        (16, 1, False),
        (16, 3, False),
        (1030, 1, False),
        (3, 1, True),
        (5, 1, True),
    ],
)
def test_a_sharded_models_evaluation_shares_of_different_batch_counts_are_refused(samples, batch_size, refused):
    """Under fsdp every batch gathers parameters: 15 samples shared 8 and 7 make 1 batch each of 8, but 2 and 1 of 7,
    and the process with the extra batch would wait forever; the line names a batch size that fits, for the smallest
    shares too (1 and 2 samples, whose every batch size up to theirs divides them), and counts are compared as numbers
    past 256 batches (an even split of 515 each)."""
    sharded = SimpleNamespace(strategy=ModelParallelStrategy())
    if not refused:
        check_even_batches(samples, 2, batch_size, sharded, "test")
        return
    with pytest.raises(UserError) as raised:
        check_even_batches(samples, 2, batch_size, sharded, "test")
    fitting = int(str(raised.value).split("(such as ")[1].split(")")[0])
    largest, smallest = -(-samples // 2), samples // 2
    assert -(-largest // fitting) == -(-smallest // fitting), "the batch size it names fits"
    check_even_batches(samples, 2, batch_size, SimpleNamespace(strategy=DDPStrategy()), "test")  # ddp: no collective


def test_one_process_evaluates_its_loader_as_it_is_an_empty_one_too():
    """On one process nothing is shared out: a validation loader keeps its own sampler (a shuffled one here), and an
    empty set is Lightning's to skip, not refused as fewer samples than processes."""
    one = SimpleNamespace(world_size=1, global_rank=0, strategy=DDPStrategy())
    shuffled = DataLoader(range(5), batch_size=2, shuffle=True)
    assert type(evaluated_once(shuffled, one, "validation").sampler) is RandomSampler
    assert len(evaluated_once(DataLoader([], batch_size=2), one, "validation")) == 0


@pytest.mark.parametrize(
    ("samples", "batch_size", "said", "fitting"),
    [
        (15, 7, "15 samples split into shares of 8 and 7 among 2 processes, 2 and 1 batches of 7", "7 (such as 2)"),
        (15, 1, "15 samples split into shares of 8 and 7 among 2 processes, 8 and 7 batches of 1", "7 (such as 2)"),
        (9, 4, "9 samples split into shares of 5 and 4 among 2 processes, 2 and 1 batches of 4", "4 (such as 3)"),
    ],
)
def test_the_refusal_of_uneven_shares_names_the_shares_their_batches_and_a_batch_size_that_fits(
    samples, batch_size, said, fitting
):
    sharded = SimpleNamespace(strategy=ModelParallelStrategy())
    with pytest.raises(UserError) as raised:
        check_even_batches(samples, 2, batch_size, sharded, "test")
    assert str(raised.value) == (
        f"the test set's {said}, and a sharded model's processes must run the same number of batches (each gathers "
        f"its parameters): choose a data.batch_size that does not divide {fitting}, or another number of devices"
    )
