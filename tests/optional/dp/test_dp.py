"""`trainer=dp`: DataParallel in one process, trained, validated, tested and predicted in process and as a user runs it;
what it refuses (several nodes or launched processes, compile=true)."""

import functools
from pathlib import Path

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir

from project.engine.build import build
from project.engine.errors import UserError
from project.engine.upstream import VERSION_BASE
from project.example.data import ToyDataModule
from project.example.module import ClassifierModule
from project.example.networks import NeuralNetwork
from project.optional.dp.strategy import DataParallelStrategy
from tests.helpers import CONF_DIR, check_ok, mnist_overrides, read_json, run_module
from tests.test_strategies import BATCH, assert_one_run_by_rank_zero


@pytest.mark.slow
def test_dp_on_cpu_trains_on_one_device_and_says_so(tmp_path: Path, mnist_root: Path):
    args = mnist_overrides(
        mnist_root,
        "trainer=dp",
        "trainer.max_epochs=2",
        f"data.batch_size={BATCH}",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    result = check_ok(run_module("project.train", *args, cwd=tmp_path))
    output = result.stdout + result.stderr
    assert output.count("dp: no GPU in use, so DataParallel does not split batches") == 1
    assert_one_run_by_rank_zero(tmp_path / "run", 1, result.stdout)


@pytest.mark.slow
def test_dp_on_several_nodes_is_refused_in_one_line(tmp_path: Path):
    run_dir = f"hydra.run.dir={tmp_path / 'run'}"
    result = run_module("project.train", "trainer=dp", "trainer.num_nodes=2", run_dir, cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: trainer=dp runs in one process on one machine")


DP_UNDER_SLURM_ERROR = (
    "error: trainer=dp runs in one process, but its launcher started 2: start one (under Slurm, --ntasks-per-node=1 on "
    "one node), or use trainer=ddp (trainer=slurm) for one process per device"
)


@pytest.mark.slow
@pytest.mark.parametrize(("tasks_per_node", "expected_error"), [("1", None), ("2", DP_UNDER_SLURM_ERROR)])
def test_dataparallel_under_slurm_takes_one_task_per_node(tmp_path: Path, tasks_per_node: str, expected_error):
    slurm = {
        "SLURM_JOB_ID": "9",
        "SLURM_JOB_NAME": "train",
        "SLURM_NTASKS": tasks_per_node,
        "SLURM_NTASKS_PER_NODE": tasks_per_node,
        "SLURM_NNODES": "1",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        "SLURM_NODELIST": "localhost",
    }
    result = run_module(
        "project.train", "trainer=dp", "logger=none", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, env=slurm
    )
    if expected_error is None:
        check_ok(result)
        assert read_json(tmp_path / "run" / "results.json")["test/acc"] == 1.0
    else:
        assert result.returncode == 2 and result.stderr.strip().splitlines()[-1] == expected_error


def test_dp_strategy_fits_validates_tests_and_predicts_in_process(tmp_path: Path):
    L.seed_everything(123)
    datamodule = ToyDataModule(batch_size=2, seed=123, drop_last=True)
    module = ClassifierModule(NeuralNetwork(2, 2), functools.partial(torch.optim.SGD, lr=0.5))
    trainer = L.Trainer(
        strategy=DataParallelStrategy(),
        accelerator="cpu",
        devices=1,
        max_epochs=3,
        logger=False,
        default_root_dir=tmp_path,
        enable_progress_bar=False,
    )
    assert isinstance(trainer.strategy, DataParallelStrategy)
    trainer.fit(module, datamodule=datamodule)
    assert trainer.validate(module, datamodule=datamodule)[0]["val/acc"] == 1.0
    assert trainer.test(module, datamodule=datamodule)[0]["test/acc"] == 1.0
    predictions = trainer.predict(module, dataloaders=datamodule.test_dataloader())
    assert [(probabilities.argmax(dim=1).tolist(), labels.tolist()) for probabilities, labels in predictions] == [
        ([0, 1], [0, 1])
    ]
    saved = trainer.strategy.lightning_module_state_dict()
    assert "network.layers.0.weight" in saved and not any(".module." in key for key in saved)


def test_dp_refuses_compile_before_training(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """DataParallel's per-step copies of a network compiled in place would all run the original's compiled code."""
    for name in ("PL_GLOBAL_SEED", "PL_SEED_WORKERS"):  # build seeds; later tests in this process must not inherit it
        monkeypatch.setenv(name, "0")
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        cfg = compose("train", overrides=["trainer=dp", "compile=true", "logger=none", f"run_dir={tmp_path}"])
    setup = build(cfg, tmp_path / "outputs")
    with pytest.raises(UserError, match="compile=true with trainer=dp: DataParallel copies the network"):
        setup.trainer.fit(setup.module, datamodule=setup.datamodule)
