"""A LightningModule and LightningDataModule of the user's own, behind `model=` and `data=`, with no edit to project/:
runs, resumes, evaluation, DDP and sweeps work with them; what needs the classifier refuses them in one line.

The modules are tests/foreign_modules.py (a regression, one with dict batches) and Lightning's BoringModel; their
YAML files (tests/foreign_conf/) sit in a directory of the user's, on Hydra's search path.
"""

import math
import re
import shutil
from pathlib import Path

import pytest
import torch

from project.engine.checkpoints import resume_path
from project.engine.errors import UserError
from tests.foreign_modules import FOREIGN_CONF
from tests.helpers import (
    REPO,
    check_ok,
    follow_readme_steps,
    histories,
    read_json,
    readme_section_blocks,
    run_module,
    simulated_slurm_nodes,
    torchrun_nodes,
)

ENV = {"PYTHONPATH": str(REPO)}  # the runs import tests.foreign_modules
REGRESSION = ["model=regression", "data=regression", "optimized_metric=val/mse", "optimized_mode=min"]


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The user's working directory, with their config files in my_conf/."""
    cwd = tmp_path_factory.mktemp("own-modules")
    shutil.copytree(FOREIGN_CONF, cwd / "my_conf")
    return cwd


def train(cwd: Path, *args: str, module: str = "project.train"):
    """`python -m <module> <flags> hydra.searchpath=[file://<cwd>/my_conf] <overrides>` in the user's directory."""
    flags = [arg for arg in args if arg.startswith("-")]
    overrides = [arg for arg in args if not arg.startswith("-")]
    searchpath = f"hydra.searchpath=[file://{cwd / 'my_conf'}]"
    return run_module(module, *flags, searchpath, *overrides, cwd=cwd, env=ENV)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


@pytest.mark.slow
def test_a_regression_module_trains_resumes_from_last_and_is_evaluated(user_dir: Path):
    """Its own metric names fill the results; `ckpt_path=last` finds its run; evaluate rebuilds it from the file."""
    first = check_ok(train(user_dir, *REGRESSION, "trainer.max_epochs=2", "logger=none", "hydra.run.dir=outputs/a"))
    run_dir = user_dir / "outputs" / "a"
    results = read_json(run_dir / "results.json")
    assert all(math.isfinite(results[f"{stage}/mse"]) for stage in ("train", "val", "test"))
    assert results["epochs"] == 2 and results["samples_per_second"] > 0
    assert re.search(r"^mse\s+\d+\.\d{4}\s+\d+\.\d{4}\s+\d+\.\d{4}$", first.stdout, flags=re.MULTILINE), first.stdout
    assert histories(run_dir)[0]["epoch_samples"] == [48, 48]
    assert len(list((run_dir / "checkpoints").glob("best-epoch*.ckpt"))) == 1, "val/mse picks the best"
    stored = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["config"]
    assert stored["model"]["_target_"] == "tests.foreign_modules.RegressionModule"

    check_ok(train(user_dir, *REGRESSION, "ckpt_path=last", "trainer.max_epochs=3", "hydra.run.dir=outputs/b"))
    resumed = read_json(user_dir / "outputs" / "b" / "results.json")
    assert resumed["epochs"] == 3 and histories(user_dir / "outputs" / "b")[0]["first_epoch"] == 2

    last = user_dir / "outputs" / "b" / "checkpoints" / "last.ckpt"
    evaluated = check_ok(train(user_dir, f"ckpt_path={last}", "hydra.run.dir=outputs/eval", module="project.evaluate"))
    printed = dict(line.split() for line in evaluated.stdout.splitlines() if line.startswith("test/"))
    assert float(printed["test/mse"]) == resumed["test/mse"]

    check_ok(train(user_dir, f"ckpt_path={last}", "hydra.run.dir=outputs/predict", module="project.predict"))
    predicted = torch.load(user_dir / "outputs" / "predict" / "predictions.pt", weights_only=True)
    assert list(predicted) == ["output"] and predicted["output"].shape == (16, 1), "what predict_step returned"
    rows = (user_dir / "outputs" / "predict" / "predictions.csv").read_text().splitlines()
    assert rows[0] == "index,output" and len(rows) == 17


@pytest.mark.slow
def test_a_resume_inside_an_epoch_is_refused_where_the_data_cannot_say_where_it_stood(user_dir: Path, tmp_path: Path):
    """RegressionData keeps no position: its epoch would restart its batches, so only an epoch's end resumes."""
    check_ok(train(user_dir, *REGRESSION, "trainer.max_steps=3", "logger=none", f"hydra.run.dir={tmp_path}/a"))
    stopped = tmp_path / "a" / "checkpoints" / "last.ckpt"
    assert torch.load(stopped, weights_only=True)["global_step"] == 3, "6 steps an epoch: inside the first"
    result = train(user_dir, *REGRESSION, f"ckpt_path={stopped}", "logger=none", f"hydra.run.dir={tmp_path}/b")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert error_lines(result.stderr)[-1].startswith(
        f"error: ckpt_path={stopped} was written inside an epoch (step 3), and RegressionData cannot say where"
    )
    assert not (tmp_path / "b" / "checkpoints").exists(), "refused before the first step"


@pytest.mark.slow
def test_a_module_that_logs_no_metric_is_told_which_it_logs_and_trains_on(user_dir: Path, tmp_path: Path):
    """Lightning's BoringModel: one warning line at the first validation; refused where the metric is the result."""
    result = check_ok(
        train(user_dir, "model=boring", "data=boring", "trainer.max_epochs=1", f"hydra.run.dir={tmp_path}/a")
    )
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: optimized_metric")]
    assert warnings == [
        "warning: optimized_metric=val/acc is not logged by BoringModel, which logs no metric: log one with self.log "
        "in the module and name it with optimized_metric=<name> optimized_mode=min|max; no best checkpoint is kept"
    ]
    assert "none logged" in result.stdout and (tmp_path / "a" / "checkpoints" / "last.ckpt").is_file()
    assert histories(tmp_path / "a")[0]["epoch_samples"] == [64]

    refused = train(user_dir, "model=boring", "data=boring", "results_from=best", f"hydra.run.dir={tmp_path}/b")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert error_lines(refused.stderr)[-1].endswith("(results_from=best is that metric)")


@pytest.mark.slow
def test_dict_batches_sweep_under_ddp_with_the_metric_they_log(user_dir: Path, tmp_path: Path):
    """Two DDP jobs of one `-m` sweep on dict batches: each rank its half, the summary shows the module's metric."""
    sweep = tmp_path / "sweep"
    result = check_ok(
        train(
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


# Rank 1 dies (SIGKILL) as epoch 2 of 4 starts, in torchrun's first attempt only.
CRASH = (
    "+callbacks.crash._target_=tests.crash_callback.KillAtEpochStart",
    "+callbacks.crash.epoch=2",
    "+callbacks.crash.rank=1",
    "+callbacks.crash.attempt=0",
)


@pytest.mark.slow
@pytest.mark.parametrize("launch", ["ddp_spawn", "slurm", "torchrun"])
def test_the_launchers_that_start_every_rank_train_a_module_of_your_own(
    user_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, launch: str
):
    """Two ranks, each its half (24 of 48 points) every epoch: spawned workers, Slurm tasks on two simulated nodes,
    and a two-host torchrun launch whose killed worker is restarted and resumes from the run's last.ckpt."""
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # every rank imports tests.foreign_modules
    args = [f"hydra.searchpath=[file://{user_dir / 'my_conf'}]", *REGRESSION, "logger=none", "trainer.max_epochs=4"]
    if launch == "ddp_spawn":
        check_ok(run_module("project.train", *args, "trainer=ddp_spawn", "hydra.run.dir=outputs/spawn", cwd=tmp_path))
    elif launch == "slurm":
        slurm = ["trainer=slurm", "trainer.num_nodes=2", "trainer.devices=1"]
        for task in simulated_slurm_nodes("project.train", [*args, *slurm], cwd=tmp_path):
            check_ok(task)
    else:
        launch_args = [*args, "trainer=ddp", "trainer.num_nodes=2", "trainer.devices=1", *CRASH]
        for agent in torchrun_nodes("project.train", launch_args, tmp_path, "own", options=("--max-restarts=1",)):
            check_ok(agent)
    (run_dir,) = [path.parent for path in (tmp_path / "outputs").rglob("results.json")]
    ranks = histories(run_dir)
    first_epoch = 2 if launch == "torchrun" else 0
    assert [(h["rank"], h["world_size"], h["first_epoch"]) for h in ranks] == [(0, 2, first_epoch), (1, 2, first_epoch)]
    assert all(h["epoch_samples"] == [24] * (4 - first_epoch) for h in ranks)
    results = read_json(run_dir / "results.json")
    assert results["epochs"] == 4 and math.isfinite(results["val/mse"])


@pytest.mark.slow
def test_an_optuna_search_of_your_own_optimises_the_metric_your_module_logs(user_dir: Path, tmp_path: Path):
    """Each trial returns its val/mse (the summary shows it, Optuna minimises it) for the lr it was given."""
    sweep = tmp_path / "search"
    result = check_ok(
        train(
            user_dir,
            "model=regression",
            "data=regression",
            "hparams_search=line",
            "trainer.max_epochs=2",
            "logger=none",
            f"hydra.sweep.dir={sweep}",
        )
    )
    summary = result.stdout[result.stdout.index("Sweep: 3 job(s)") :]
    shown = [float(line.split()[-2]) for line in summary.splitlines() if line[:1].isdigit()]
    trained = [read_json(sweep / str(job) / "results.json")["val/mse"] for job in range(3)]
    assert shown == pytest.approx(trained, abs=1e-4) and all(math.isfinite(value) for value in trained)
    assert (sweep / "optuna.db").is_file()
    for job in range(3):
        stored = torch.load(sweep / str(job) / "checkpoints" / "last.ckpt", weights_only=True)["config"]
        assert 0.001 <= stored["model"]["lr"] <= 0.1


@pytest.mark.slow
def test_dataparallel_replicates_the_network_attribute_it_is_told(user_dir: Path, tmp_path: Path):
    """The classifier's is `network`; a module of your own names its own, or is refused in one line."""
    refused = train(user_dir, *REGRESSION, "trainer=dp", f"hydra.run.dir={tmp_path}/a")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "set trainer.strategy.module_attribute=<the attribute that holds its network>" in refused.stderr
    check_ok(
        train(
            user_dir,
            *REGRESSION,
            "trainer=dp",
            "trainer.strategy.module_attribute=layers",
            "trainer.max_epochs=1",
            "logger=none",
            f"hydra.run.dir={tmp_path}/b",
        )
    )
    assert read_json(tmp_path / "b" / "results.json")["epochs"] == 1


@pytest.mark.slow
def test_compare_refuses_a_module_of_your_own_before_training(user_dir: Path, tmp_path: Path):
    result = train(user_dir, *REGRESSION, f"hydra.run.dir={tmp_path}", module="project.optional.reference.compare")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert error_lines(result.stderr) == [
        "error: model=tests.foreign_modules.RegressionModule is not a ClassifierModule: the reference path "
        "(project/optional/reference/: its scripts and compare) re-implements the classifier example only; train your "
        "own model with python -m project.train, under any trainer="
    ]
    assert "log:" not in result.stdout, "neither side was started"


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
    config = {"model": {"_target_": "my.Module"}, "data": {"_target_": "my.Data"}}
    assert resume_path("last", tmp_path / "run", outputs, config) == str(mine)
    with pytest.raises(UserError, match=r"none of the 2 earlier runs .* trained this model \(my.Module\) on this data"):
        resume_path("last", tmp_path / "run", outputs, {**config, "data": {"_target_": "their.Data"}})


@pytest.mark.slow
def test_the_readme_steps_train_a_module_of_your_own_under_ddp(tmp_path: Path):
    """The README's module, data module, YAML files and command as written, in a fresh directory."""
    blocks = readme_section_blocks("Start your own project")
    assert [language for language, _ in blocks] == ["python", "yaml", "yaml", "bash"]
    results_file = follow_readme_steps(blocks, tmp_path, {"OMP_NUM_THREADS": "1"})
    results = read_json(results_file)
    assert results["world_size"] == 2 and results["test/mse"] < 0.05, results  # the noise's variance is 0.01
    rank0, rank1 = histories(results_file.parent)
    assert rank0["epoch_samples"] == rank1["epoch_samples"] == [400] * results["epochs"], "each rank its half"
    checkpoint = torch.load(results_file.parent / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["config"]["model"]["_target_"] == "my_project.LineFit"
    assert len(list((results_file.parent / "checkpoints").glob("best-epoch*.ckpt"))) == 1


@pytest.mark.slow
def test_your_modules_own_one_cycle_schedule_resumed_for_a_longer_run_is_refused_before_training(user_dir: Path):
    """Lightning loads the checkpoint's schedule, sized for 2 epochs, over the one built for 3: torch would fail
    with a ValueError once the run steps past it."""
    one_cycle = [*REGRESSION, "+model.one_cycle=true", "logger=none"]
    check_ok(train(user_dir, *one_cycle, "trainer.max_epochs=2", "hydra.run.dir=outputs/cycle"))
    last = user_dir / "outputs" / "cycle" / "checkpoints" / "last.ckpt"
    longer = train(user_dir, *one_cycle, f"ckpt_path={last}", "trainer.max_epochs=3", "hydra.run.dir=outputs/longer")
    assert longer.returncode == 2 and "Traceback" not in longer.stderr, longer.stderr[-2000:]
    assert error_lines(longer.stderr) == [
        "error: the learning-rate schedule OneCycleLR ends after 12 steps (the checkpoint's length: it was sized for a "
        "shorter run), and this run steps it 18 times: resume with the trainer.max_epochs it was sized for, or size "
        "it from the run's length (trainer.estimated_stepping_batches) and start a new run"
    ]
    assert not (user_dir / "outputs" / "longer" / "checkpoints" / "last.ckpt").exists(), "refused before a step"
