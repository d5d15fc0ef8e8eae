"""A LightningModule and LightningDataModule of the user's own, behind `model=` and `data=`, with no edit to project/:
runs, resumes, evaluation, DDP and sweeps work with them; what needs the classifier refuses them in one line.

The modules are tests/foreign_modules.py (a regression, one with dict batches) and Lightning's BoringModel; their
YAML files (tests/foreign_conf/) sit in a directory of the user's, on Hydra's search path.
"""

import functools
import math
import re
from pathlib import Path

import lightning as L
import pytest
import torch
from hydra import initialize_config_dir
from torch import nn

from project.engine.checkpoints import RestoredStateCheck, resume_path
from project.engine.errors import UserError
from project.engine.reports import format_value
from project.engine.upstream import VERSION_BASE
from project.example.module import ClassifierModule
from project.example.networks import NeuralNetwork
from tests.docs_commands import follow_steps, section_blocks
from tests.foreign_modules import RegressionData, RegressionModule
from tests.helpers import (
    CONF_DIR,
    REGRESSION,
    REPO,
    assert_each_rank_trained_its_half,
    check_ok,
    error_lines,
    histories,
    read_json,
    run_module,
    simulated_slurm_nodes,
    train_own,
)

YOUR_CODE = REPO / "docs" / "your-code.md"


@pytest.mark.slow
def test_a_regression_module_trains_resumes_from_last_and_is_evaluated(user_dir: Path):
    """Its own metric names fill the results; `ckpt_path=last` finds its run; evaluate rebuilds it from the file."""
    first = check_ok(train_own(user_dir, *REGRESSION, "trainer.max_epochs=2", "logger=none", "hydra.run.dir=outputs/a"))
    run_dir = user_dir / "outputs" / "a"
    results = read_json(run_dir / "results.json")
    assert all(math.isfinite(results[f"{stage}/mse"]) for stage in ("train", "val", "test"))
    assert results["epochs"] == 2 and results["samples_per_second"] > 0
    assert re.search(r"^mse\s+\d+\.\d{4}\s+\d+\.\d{4}\s+\d+\.\d{4}$", first.stdout, flags=re.MULTILINE), first.stdout
    assert histories(run_dir)[0]["epoch_samples"] == [48, 48]
    assert len(list((run_dir / "checkpoints").glob("best-epoch*.ckpt"))) == 1, "val/mse picks the best"
    stored = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["config"]
    assert stored["model"]["_target_"] == "tests.foreign_modules.RegressionModule"

    check_ok(train_own(user_dir, *REGRESSION, "ckpt_path=last", "trainer.max_epochs=3", "hydra.run.dir=outputs/b"))
    resumed = read_json(user_dir / "outputs" / "b" / "results.json")
    assert resumed["epochs"] == 3 and histories(user_dir / "outputs" / "b")[0]["first_epoch"] == 2

    last = user_dir / "outputs" / "b" / "checkpoints" / "last.ckpt"
    evaluated = check_ok(
        train_own(user_dir, f"ckpt_path={last}", "hydra.run.dir=outputs/eval", module="project.evaluate")
    )
    printed = dict(line.split() for line in evaluated.stdout.splitlines() if line.startswith("test/"))
    assert printed["test/mse"] == format_value(resumed["test/mse"]), "as the results table shows it"

    check_ok(train_own(user_dir, f"ckpt_path={last}", "hydra.run.dir=outputs/predict", module="project.predict"))
    predicted = torch.load(user_dir / "outputs" / "predict" / "predictions.pt", weights_only=True)
    assert list(predicted) == ["output"] and predicted["output"].shape == (16, 1), "what predict_step returned"
    rows = (user_dir / "outputs" / "predict" / "predictions.csv").read_text().splitlines()
    assert rows[0] == "index,output" and len(rows) == 17


@pytest.mark.slow
def test_predicting_with_a_module_whose_forward_does_not_take_the_batch_asks_for_a_predict_step(user_dir: Path):
    """PairForwardModule trains (its steps unpack the batch) but has no predict_step, and its forward takes inputs
    and targets apart: Lightning's default predict_step, forward(batch), fails, said in one line, last, exit 2."""
    trained_on = ("model=pair_forward", "data=regression", "optimized_metric=val/mse", "optimized_mode=min")
    check_ok(train_own(user_dir, *trained_on, "logger=none", "hydra.run.dir=outputs/pair"))
    last = user_dir / "outputs" / "pair" / "checkpoints" / "last.ckpt"
    result = train_own(user_dir, f"ckpt_path={last}", "hydra.run.dir=outputs/pair-predict", module="project.predict")

    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert error_lines(result.stderr) == [result.stderr.rstrip("\n").splitlines()[-1]]
    assert error_lines(result.stderr)[0].startswith("error: PairForwardModule defines no predict_step")


@pytest.mark.slow
def test_a_resume_inside_an_epoch_is_refused_where_the_data_cannot_say_where_it_stood(user_dir: Path, tmp_path: Path):
    """RegressionData drawing its points with a sampler of its own keeps no position, and the engine cannot put its
    seeded order there: its epoch would restart its batches, so only an epoch's end resumes."""
    weighted = [*REGRESSION, "+data.weighted=true", "logger=none"]
    check_ok(train_own(user_dir, *weighted, "trainer.max_steps=3", f"hydra.run.dir={tmp_path}/a"))
    stopped = tmp_path / "a" / "checkpoints" / "last.ckpt"
    assert torch.load(stopped, weights_only=True)["global_step"] == 3, "6 steps an epoch: inside the first"
    result = train_own(user_dir, *weighted, f"ckpt_path={stopped}", f"hydra.run.dir={tmp_path}/b")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert error_lines(result.stderr)[-1].startswith(
        f"error: ckpt_path={stopped} was written inside an epoch (step 3), and RegressionData's training loader has a "
        "sampler of its own"
    )
    assert not (tmp_path / "b" / "checkpoints").exists(), "refused before the first step"


@pytest.mark.slow
def test_a_module_that_logs_no_metric_is_told_which_it_logs_and_trains_on(user_dir: Path, tmp_path: Path):
    """Lightning's BoringModel: one warning line at the first validation; refused where the metric is the result."""
    result = check_ok(
        train_own(user_dir, "model=boring", "data=boring", "trainer.max_epochs=1", f"hydra.run.dir={tmp_path}/a")
    )
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: optimized_metric")]
    assert warnings == [
        "warning: optimized_metric=val/acc is not logged by BoringModel, which logs no metric: log one with self.log "
        "in the module and name it with optimized_metric=<name> optimized_mode=min|max; no best checkpoint is kept"
    ]
    assert "none logged" in result.stdout and (tmp_path / "a" / "checkpoints" / "last.ckpt").is_file()
    assert histories(tmp_path / "a")[0]["epoch_samples"] == [64]

    refused = train_own(user_dir, "model=boring", "data=boring", "results_from=best", f"hydra.run.dir={tmp_path}/b")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert error_lines(refused.stderr)[-1].endswith("(results_from=best is that metric)")


@pytest.mark.slow
def test_a_grid_sweep_of_a_module_that_logs_no_metric_runs_every_job(user_dir: Path, tmp_path: Path):
    """A grid needs no objective: each job trains to its end with one warning, the table and the summary over its
    seeds show `-` for the metric."""
    sweep = tmp_path / "sweep"
    overrides = ("model=boring", "data=boring", "trainer.max_epochs=2", "logger=none", f"hydra.sweep.dir={sweep}")
    result = check_ok(train_own(user_dir, "-m", *overrides, "seed=1,2"))

    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: optimized_metric=val/acc")]
    assert len(warnings) == 2, "one per job, not one per epoch"
    assert not error_lines(result.stderr)
    summary = result.stdout[result.stdout.index("Sweep: 2 job(s)\n") :]
    rows = [line.split() for line in summary.splitlines() if line[:1].isdigit()]
    assert [(row[0], row[-2]) for row in rows] == [("0", "-"), ("1", "-")], summary
    assert [read_json(sweep / job / "results.json")["epochs"] for job in ("0", "1")] == [2, 2]
    over_seeds = summary[summary.index("\nOver seed: ") :].splitlines()  # n=2, and `-` for the metric it never logs
    assert over_seeds[4].split() == ["model=boring", "data=boring", "trainer.max_epochs=2", "logger=none", "2", "-"]


@pytest.mark.slow
def test_dict_batches_sweep_under_ddp_with_the_metric_they_log(user_dir: Path, tmp_path: Path):
    """Two DDP jobs of one `-m` sweep on dict batches: each rank its half, the summary shows the module's metric."""
    sweep = tmp_path / "sweep"
    result = check_ok(
        train_own(
            user_dir,
            "-m",
            "model=dict_batch",
            "data=dict_batch",
            "model.lr=0.1,0.5",
            "optimized_metric=holdout_hits",
            "trainer=ddp",
            "trainer.devices=2",
            "trainer.max_epochs=2",
            "logger=none",
            f"hydra.sweep.dir={sweep}",
        )
    )
    for job in ("0", "1"):
        ranks = histories(sweep / job)
        assert [(h["rank"], h["epoch_samples"]) for h in ranks] == [(0, [18, 18]), (1, [18, 18])]
        assert 0 <= read_json(sweep / job / "results.json")["holdout_hits"] <= 1
    summary = result.stdout[result.stdout.index("Sweep: 2 job(s)") :]
    values = [line.split()[-2] for line in summary.splitlines() if line[:1].isdigit()]
    assert len(values) == 2 and all(0 <= float(value) <= 1 for value in values), summary


@pytest.mark.slow
@pytest.mark.parametrize("launch", ["ddp_spawn", "srun"])
def test_the_launchers_that_start_every_rank_train_a_module_of_your_own(
    user_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, launch: str
):
    """Two ranks, each its half (24 of 48 points) every epoch: spawned workers, and Slurm tasks on two simulated
    nodes (a two-host torchrun launch: tests/optional/torchrun/test_torchrun_own_module.py)."""
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # every rank imports tests.foreign_modules
    args = [f"hydra.searchpath=[file://{user_dir / 'my_conf'}]", *REGRESSION, "logger=none", "trainer.max_epochs=4"]
    if launch == "ddp_spawn":
        check_ok(run_module("project.train", *args, "trainer=ddp_spawn", "hydra.run.dir=outputs/spawn", cwd=tmp_path))
    else:
        two_nodes = ["trainer=ddp", "trainer.num_nodes=2", "trainer.devices=1"]
        for task in simulated_slurm_nodes("project.train", [*args, *two_nodes], cwd=tmp_path):
            check_ok(task)
    assert_each_rank_trained_its_half(tmp_path, first_epoch=0)


def write_checkpoint(path: Path, model: str, data: str) -> Path:
    path.parent.mkdir(parents=True)
    torch.save({"state_dict": {}, "config": {"model": {"_target_": model}, "data": {"_target_": data}}}, path)
    return path


def test_ckpt_path_last_takes_the_newest_run_of_the_same_model_and_data(tmp_path: Path):
    """Not the newest run of any kind: that one may be another project's; none of the same kind is one line."""
    outputs = tmp_path / "outputs"
    mine = write_checkpoint(outputs / "mine" / "checkpoints" / "last.ckpt", "my.Module", "my.Data")
    write_checkpoint(
        outputs / "other" / "checkpoints" / "last.ckpt", "project.example.module.ClassifierModule", "my.Data"
    )
    # A user's module and data, which their own config dir would name: here trusted_targets does.
    config = {"model": {"_target_": "my.Module"}, "data": {"_target_": "my.Data"}, "trusted_targets": {"mine": "my.*"}}
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):  # conf/ names the example's module: trusted
        assert resume_path("last", tmp_path / "run", outputs, config) == str(mine)
        with pytest.raises(UserError, match=r"none of the 2 earlier runs .* trained this model \(my.Module\) on this"):
            resume_path("last", tmp_path / "run", outputs, {**config, "data": {"_target_": "their.Data"}})


@pytest.mark.slow
def test_the_docs_steps_train_a_module_of_your_own_under_ddp(tmp_path: Path):
    """docs/your-code.md's module, data module, YAML files and command as written, in a fresh directory."""
    blocks = section_blocks(YOUR_CODE, "A module of your own, step by step")
    assert [language for language, _ in blocks] == ["python", "yaml", "yaml", "bash"]
    results_file = follow_steps(blocks, tmp_path, {"OMP_NUM_THREADS": "1"})
    results = read_json(results_file)
    assert results["world_size"] == 2 and results["test/mse"] < 0.05, results  # the noise's variance is 0.01
    rank0, rank1 = histories(results_file.parent)
    assert rank0["epoch_samples"] == rank1["epoch_samples"] == [400] * results["epochs"], "each rank its half"
    checkpoint = torch.load(results_file.parent / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["config"]["model"]["_target_"] == "my_project.LineFit"
    assert len(list((results_file.parent / "checkpoints").glob("best-epoch*.ckpt"))) == 1


@pytest.mark.slow
def test_the_docs_steps_add_data_and_train_on_it_under_ddp(tmp_path: Path):
    """docs/your-code.md's data class, YAML and command as written: the points are learnt, each rank on its own half."""
    steps = section_blocks(YOUR_CODE, "Data for the example's classifier, step by step")
    assert [language for language, _ in steps] == ["python", "yaml", "bash"]
    results = follow_steps(steps, tmp_path, {"OMP_NUM_THREADS": "1"})
    summary = read_json(results)
    assert summary["world_size"] == 2 and summary["test/acc"] >= 0.9, summary  # half the points are inside
    checkpoint = torch.load(results.parent / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["config"]["data"]["_target_"] == "my_data.CircleDataModule"
    half = checkpoint["CircleDataModule"]["position"]["train_samples"] // 2  # the data module's place in its order
    rank0, rank1 = histories(results.parent)
    assert (rank0["rank"], rank1["rank"]) == (0, 1)
    assert rank0["epoch_samples"] == rank1["epoch_samples"] == [half] * summary["epochs"]
    assert len(rank0["step_losses"]) == len(rank1["step_losses"]) and rank0["step_losses"] != rank1["step_losses"]


@pytest.mark.slow
def test_your_modules_own_one_cycle_schedule_resumed_for_a_longer_run_is_refused_before_training(user_dir: Path):
    """Lightning loads the checkpoint's schedule, sized for 2 epochs, over the one built for 3: torch would fail
    with a ValueError once the run steps past it."""
    one_cycle = [*REGRESSION, "+model.one_cycle=true", "logger=none"]
    check_ok(train_own(user_dir, *one_cycle, "trainer.max_epochs=2", "hydra.run.dir=outputs/cycle"))
    last = user_dir / "outputs" / "cycle" / "checkpoints" / "last.ckpt"
    longer = train_own(
        user_dir, *one_cycle, f"ckpt_path={last}", "trainer.max_epochs=3", "hydra.run.dir=outputs/longer"
    )
    assert longer.returncode == 2 and "Traceback" not in longer.stderr, longer.stderr[-2000:]
    assert error_lines(longer.stderr) == [
        "error: the learning-rate schedule OneCycleLR ends after 12 steps (the checkpoint's length: it was sized for a "
        "shorter run), and this run steps it 18 times: resume with the trainer.max_epochs it was sized for, or size "
        "it from the run's length (trainer.estimated_stepping_batches) and start a new run"
    ]
    assert not (user_dir / "outputs" / "longer" / "checkpoints" / "last.ckpt").exists(), "refused before a step"


class LayersMadeInConfigureModel(RegressionModule):
    """`RegressionModule` making its layers in `configure_model`, as Lightning suggests for a model too large to
    build before the strategy places it: at `setup` it has none yet."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = None

    def configure_model(self) -> None:
        if self.layers is None:
            self.layers = nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, 1))


def test_a_module_that_makes_its_layers_in_configure_model_resumes_its_own_checkpoint(tmp_path: Path):
    """The check of the resumed weights runs at `setup`, before `configure_model`: it leaves such a module to
    Lightning's strict load, which comes after."""
    quiet = {"logger": False, "enable_progress_bar": False, "enable_model_summary": False, "accelerator": "cpu"}
    first = L.Trainer(max_epochs=1, default_root_dir=tmp_path, enable_checkpointing=False, **quiet)
    first.fit(LayersMadeInConfigureModel(), datamodule=RegressionData())
    path = tmp_path / "epoch-1.ckpt"
    first.save_checkpoint(path)
    trained = torch.load(path, weights_only=True)["state_dict"]
    check = RestoredStateCheck(str(path))
    resumed = L.Trainer(max_epochs=1, callbacks=[check], enable_checkpointing=False, **quiet)
    module = LayersMadeInConfigureModel()
    resumed.fit(module, datamodule=RegressionData(), ckpt_path=path)
    assert resumed.global_step == first.global_step > 0, "resumed at the end of its epoch, nothing more to train"
    assert all(torch.equal(module.state_dict()[name], weights) for name, weights in trained.items())


def test_the_example_classifier_refuses_a_data_module_without_a_train_set_before_a_step():
    """RegressionData keeps its splits in a dict, not in the `train_set` the classifier reads (docs/your-code.md):
    one line naming what is missing and what to give, not an AttributeError."""
    module = ClassifierModule(NeuralNetwork(num_inputs=1, num_outputs=2), functools.partial(torch.optim.SGD, lr=0.1))
    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    with pytest.raises(UserError) as refused:
        trainer.fit(module, datamodule=RegressionData())
    assert str(refused.value) == (
        "the example classifier (ClassifierModule) reads its data module's train_set, a dataset of (inputs, label) "
        "samples, and RegressionData has none after setup: give RegressionData a train_set (its training samples, "
        "set in setup), or train a module of your own on it (model=<yours>); docs/your-code.md lists what the "
        "example classifier asks of a data module"
    )
    assert trainer.global_step == 0
