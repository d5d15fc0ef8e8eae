"""`logger=wandb` offline, read back with wandb's own reader: what a run, a DDP run and a sweep log there, and how a
run chooses between online and offline without asking the network.
"""

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import wandb
from hydra import compose, initialize_config_dir

from project.engine.upstream import VERSION_BASE
from project.optional.wandb.login_state import logged_in
from tests.helpers import CONF_DIR, check_ok, free_port, read_json, run_module
from tests.optional.wandb.offline_runs import OfflineRun, offline_runs

# 40 characters, the form of an API key: wandb takes it as a login.
FAKE_API_KEY = "0123456789abcdef0123456789abcdef01234567"


def train(cwd: Path, *overrides: str) -> subprocess.CompletedProcess:
    return check_ok(run_module("project.train", *overrides, "callbacks.progress_bar=null", cwd=cwd))


def printed_run_dirs(output: str) -> list[Path]:
    return [Path(path) for path in re.findall(r"^run dir +(\S+)", output, flags=re.MULTILINE)]


@dataclass
class LoggedRun:
    run_dir: Path
    stdout: str
    run: OfflineRun


@pytest.fixture(scope="module")
def many_run(tmp_path_factory: pytest.TempPathFactory) -> LoggedRun:
    """A run with `logger=many` (TensorBoard, CSV, MLflow where here, W&B) whose W&B logger decides online or
    offline as `logger=wandb` does, on a machine logged in nowhere, WANDB_MODE unset."""
    cwd = tmp_path_factory.mktemp("many")
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("WANDB_MODE")
        result = train(cwd, "logger=many", "logger.wandb.mode=null")
    (run_dir,) = printed_run_dirs(result.stdout)
    (run,) = offline_runs(run_dir)
    return LoggedRun(run_dir, result.stdout, run)


@pytest.mark.slow
def test_a_machine_logged_in_nowhere_logs_offline_into_the_run_dir(many_run: LoggedRun):
    (sync_dir,) = many_run.run_dir.glob("wandb/offline-run-*")
    assert f"\nW&B run offline in {sync_dir}\n" in many_run.stdout
    assert many_run.run.summary["state"] == "finished"
    assert many_run.run.summary["name"] == str(many_run.run_dir.relative_to(many_run.run_dir.parents[2]))
    assert many_run.run.group is None


@pytest.mark.slow
def test_the_runs_config_is_the_composed_config_flattened_with_world_size(many_run: LoggedRun):
    config = many_run.run.config
    assert (config["seed"], config["model/optimizer/lr"], config["data/batch_size"]) == (123, 0.5, 2)
    assert (config["trainer/max_epochs"], config["world_size"]) == (3, 1)
    assert config["run_dir"] == str(many_run.run_dir)


@pytest.mark.slow
def test_metrics_have_the_names_and_steps_the_other_loggers_get(many_run: LoggedRun):
    """The toy's 3 epochs of 2 steps: a loss per step, a validation accuracy per epoch; every column of the CSV
    logger's file is a W&B metric; the final test metrics are the run's results."""
    run = many_run.run
    step_losses = run.history("train/step_loss")
    assert [step for step, _ in step_losses] == [0, 1, 2, 3, 4, 5]
    assert step_losses[-1][1] < step_losses[0][1]
    assert [step for step, _ in run.history("val/acc")] == [1, 3, 5]
    assert len(run.history("train/loss")) == 3
    csv_columns = (many_run.run_dir / "csv" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert set(csv_columns) - {"step"} <= run.metric_names()
    results, summary = read_json(many_run.run_dir / "results.json"), run.summary["summary"]
    assert summary["test/acc"] == pytest.approx(results["test/acc"]) == pytest.approx(summary["hp/test_acc"])
    assert summary["hp/val_loss"] == pytest.approx(results["val/loss"])


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
def test_ddp_run_of_two_ranks_is_one_wandb_run(tmp_path: Path, strategy: str):
    """Rank 0 alone starts the W&B run (under ddp_spawn the spawning process, whose run the workers join), which
    gets the run's steps: the toy's 4 training samples in batches of 2 over two ranks are one step per epoch, 3 in
    all. wandb itself prints nothing."""
    result = train(tmp_path, "logger=wandb", f"trainer={strategy}", "trainer.devices=2")
    assert "wandb" not in result.stderr.lower()
    (run_dir,) = printed_run_dirs(result.stdout)
    (run,) = offline_runs(run_dir)
    assert run.config["world_size"] == 2
    assert {"train/step_loss", "val/acc", "test/acc"} <= run.metric_names()
    assert [step for step, _ in run.history("train/step_loss")] == [0, 1, 2]


@pytest.mark.slow
def test_sweep_jobs_are_runs_of_one_group_named_after_the_sweep(tmp_path: Path):
    """The jobs run one after the other in one process: each its own W&B run, finished, in the sweep's group."""
    result = train(tmp_path, "-m", "seed=1,2", "logger=wandb")
    job_dirs = printed_run_dirs(result.stdout)
    assert len(job_dirs) == 2
    runs = [run for job_dir in job_dirs for run in offline_runs(job_dir)]
    assert [run.summary["name"] for run in runs] == [str(job_dir.relative_to(tmp_path)) for job_dir in job_dirs]
    assert [run.config["seed"] for run in runs] == [1, 2]
    assert [run.summary["state"] for run in runs] == ["finished", "finished"]
    assert [run.group for run in runs] == [str(job_dirs[0].parent.relative_to(tmp_path))] * 2
    assert [len(run.history("train/step_loss")) for run in runs] == [6, 6]


def test_many_adds_wandb_offline_whatever_the_login():
    """`logger=many` never sends a run anywhere unasked; `logger=wandb` decides by the machine's login."""
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        many = compose("train", overrides=["logger=many"])
        alone = compose("train", overrides=["logger=wandb"])
    assert many.logger.wandb._target_ == alone.logger.wandb._target_ == "project.optional.wandb.logger.WandbLogger"
    assert (many.logger.wandb.mode, alone.logger.wandb.mode) == ("offline", None)


def test_logged_in_follows_the_login_wandb_finds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """`wandb login`'s netrc entry for the server WANDB_BASE_URL names is a login; one for another server is not."""
    netrc = tmp_path / "netrc"
    netrc.write_text(f"machine 127.0.0.1:9 login user password {FAKE_API_KEY}\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    for server, login in (("http://127.0.0.1:9", True), ("http://127.0.0.1:10", False)):
        monkeypatch.setenv("WANDB_BASE_URL", server)
        wandb.teardown()  # wandb reads its settings, the server among them, once per process
        assert logged_in(wandb.Settings()) is login, server
    wandb.teardown()


@pytest.mark.slow
def test_a_server_that_does_not_answer_costs_one_warning_line_and_the_run_logs_offline(tmp_path: Path):
    """A login (WANDB_API_KEY) for a server that does not answer (a port nothing listens on): after
    `settings.init_timeout` seconds the run logs offline, trains and ends with exit status 0, and one line says so."""
    server = f"http://127.0.0.1:{free_port()}"
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("WANDB_MODE")
        patch.setenv("WANDB_API_KEY", FAKE_API_KEY)
        patch.setenv("WANDB_BASE_URL", server)
        result = train(tmp_path, "logger=wandb", "logger.wandb.settings.init_timeout=2")
    said = [line for line in result.stderr.splitlines() if "W&B" in line or "wandb" in line.lower()]
    assert len(said) == 1, result.stderr[-3000:]
    warning = re.fullmatch(
        rf"warning: W&B: {server} failed \(.+\); this run logs offline: upload it later with "
        r"`wandb sync (\S+)`",
        said[0],
    )
    assert warning, said[0]
    (run_dir,) = printed_run_dirs(result.stdout)
    assert read_json(run_dir / "results.json")["epochs"] == 3
    (run,) = offline_runs(run_dir)
    assert Path(warning[1]) == next(run_dir.glob("wandb/offline-run-*"))
    assert [step for step, _ in run.history("train/step_loss")] == [0, 1, 2, 3, 4, 5]


@pytest.mark.slow
def test_a_malformed_api_key_is_one_error_line_before_training(tmp_path: Path):
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("WANDB_MODE")
        patch.setenv("WANDB_API_KEY", "abc")
        result = run_module("project.train", "logger=wandb", cwd=tmp_path)
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: logger=wandb: WANDB_API_KEY invalid: ") and "wandb login --relogin" in last
    assert not list(tmp_path.glob("outputs/*/*/checkpoints/*.ckpt"))
    assert not list(tmp_path.glob("outputs/*/*/wandb"))
