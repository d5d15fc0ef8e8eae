"""`logger=mlflow` against a real MLflow tracking server on 127.0.0.1 (SQLite behind it), read back with MlflowClient:
what a run, a DDP run and a sweep log there, and that a server lost mid-run costs the run one warning line.

The server is started once for the module (its start is the slow part) and stopped at the end; where it cannot
start, the tests that need it skip with its output as the reason.
"""

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from hydra import compose, initialize_config_dir
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from project.engine.build import build
from project.engine.upstream import VERSION_BASE
from tests.helpers import CONF_DIR, REPO, check_ok, free_port, read_json, run_module

LOST_SERVER_WARNING = re.compile(r"^MLflow: \S+ failed; no more logging there, training goes on: ", re.MULTILINE)


@dataclass
class Server:
    uri: str
    process: subprocess.Popen


def start_server(root: Path) -> Server:
    """`mlflow server` on a free port of 127.0.0.1, its runs in `root`/mlflow.db and artifacts in `root`/artifacts,
    in a process group of its own (it starts uvicorn as a child)."""
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    command = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    command += ["--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination", str(root / "art")]
    # No job runner: it serves MLflow's GenAI jobs, and starts a handful of worker processes for them.
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with open(root / "server.log", "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600  # only against a hang: the loop ends when the server answers
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if requests.get(f"{uri}/health", timeout=1).ok:
                return Server(uri, process)
        except requests.ConnectionError:
            time.sleep(0.2)
    stop_server(Server(uri, process))
    pytest.fail(f"no MLflow server answered on {uri}: {(root / 'server.log').read_text()[-1500:]}")


def stop_server(server: Server) -> None:
    if server.process.poll() is None:
        os.killpg(server.process.pid, signal.SIGTERM)
        try:
            server.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = start_server(tmp_path_factory.mktemp("mlflow-server"))
    yield running
    stop_server(running)


def train(cwd: Path, *overrides: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """A run that logs to MLflow, which waits for a server answer as long as a loaded machine may need (a slow
    answer is not what these tests are about), then retries at once."""
    patient = ("logger.mlflow.request_timeout=120", "logger.mlflow.request_backoff_factor=0")
    return check_ok(run_module("project.train", *overrides, *patient, cwd=cwd, env=env))


def printed_run_dirs(output: str) -> list[Path]:
    return [Path(path) for path in re.findall(r"^run dir +(\S+)", output, flags=re.MULTILINE)]


def runs_of(client: MlflowClient, run_dir: Path) -> list[Run]:
    """The MLflow runs, in any experiment, that name `run_dir` as theirs."""
    experiments = [experiment.experiment_id for experiment in client.search_experiments()]
    return client.search_runs(experiments, filter_string=f"tags.run_dir = '{run_dir}'")


@dataclass
class LoggedRun:
    run_dir: Path
    stderr: str
    run: Run
    client: MlflowClient


@pytest.fixture(scope="module")
def many_run(server: Server, tmp_path_factory: pytest.TempPathFactory) -> LoggedRun:
    """A run with `logger=many` (TensorBoard, CSV and MLflow) that logs to the server, its best checkpoint too."""
    cwd = tmp_path_factory.mktemp("many")
    result = train(cwd, "logger=many", f"logger.mlflow.tracking_uri={server.uri}", "logger.mlflow.log_model=true")
    (run_dir,) = printed_run_dirs(result.stdout)
    client = MlflowClient(server.uri)
    (run,) = runs_of(client, run_dir)
    return LoggedRun(run_dir, result.stderr, run, client)


@pytest.mark.slow
def test_run_is_named_after_its_dir_and_holds_the_flattened_config_and_world_size(many_run: LoggedRun):
    run = many_run.run
    assert run.info.status == "FINISHED"
    assert many_run.client.get_experiment(run.info.experiment_id).name == "train"
    assert run.info.run_name == str(many_run.run_dir.relative_to(many_run.run_dir.parents[2]))  # outputs/<date>/<time>
    params = run.data.params
    assert params["world_size"] == "1"
    assert (params["seed"], params["model/optimizer/lr"], params["data/batch_size"]) == ("123", "0.5", "2")
    assert params["trainer/max_epochs"] == "3"


@pytest.mark.slow
def test_step_and_epoch_metrics_are_logged_with_their_steps(many_run: LoggedRun):
    """The toy's 3 epochs of 2 steps: a loss per step, a validation accuracy per epoch."""
    client, run_id = many_run.client, many_run.run.info.run_id
    step_losses = client.get_metric_history(run_id, "train/step_loss")
    assert [metric.step for metric in step_losses] == [0, 1, 2, 3, 4, 5]
    assert step_losses[-1].value < step_losses[0].value
    assert [metric.step for metric in client.get_metric_history(run_id, "val/acc")] == [1, 3, 5]
    assert len(client.get_metric_history(run_id, "train/loss")) == 3


@pytest.mark.slow
def test_final_test_metrics_are_the_runs_results(many_run: LoggedRun):
    results = read_json(many_run.run_dir / "results.json")
    metrics = many_run.run.data.metrics
    assert metrics["test/acc"] == pytest.approx(results["test/acc"]) == pytest.approx(metrics["hp/test_acc"])
    assert metrics["hp/val_loss"] == pytest.approx(results["val/loss"])


@pytest.mark.slow
def test_best_checkpoint_is_an_artifact_when_asked(many_run: LoggedRun):
    (best,) = (many_run.run_dir / "checkpoints").glob("best-*.ckpt")
    artifacts = {artifact.path for artifact in many_run.client.list_artifacts(many_run.run.info.run_id, best.stem)}
    assert f"{best.stem}/{best.name}" in artifacts
    downloaded = many_run.client.download_artifacts(many_run.run.info.run_id, f"{best.stem}/{best.name}")
    assert Path(downloaded).read_bytes() == best.read_bytes()


@pytest.mark.slow
def test_many_writes_tensorboard_csv_and_mlflow(many_run: LoggedRun):
    assert list((many_run.run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert "train/step_loss" in (many_run.run_dir / "csv" / "metrics.csv").read_text()
    assert "train/step_loss" in many_run.run.data.metrics


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
def test_ddp_run_of_two_ranks_is_one_mlflow_run(server: Server, tmp_path: Path, strategy: str):
    """Rank 0 alone logs; under ddp_spawn also the spawning process, which fit and test each spawn anew."""
    result = train(
        tmp_path,
        "logger=mlflow",
        f"logger.mlflow.tracking_uri={server.uri}",
        f"trainer={strategy}",
        "trainer.devices=2",
    )
    (run_dir,) = printed_run_dirs(result.stdout)
    (run,) = runs_of(MlflowClient(server.uri), run_dir)
    assert run.data.params["world_size"] == "2"
    assert {"train/step_loss", "val/acc", "test/acc", "hp/test_acc"} <= set(run.data.metrics)


@pytest.mark.slow
def test_sweep_jobs_are_runs_of_one_experiment_named_after_the_sweep(server: Server, tmp_path: Path):
    result = train(tmp_path, "-m", "seed=1,2", "logger=mlflow", f"logger.mlflow.tracking_uri={server.uri}")
    job_dirs = printed_run_dirs(result.stdout)
    assert len(job_dirs) == 2
    client = MlflowClient(server.uri)
    runs = [run for job_dir in job_dirs for run in runs_of(client, job_dir)]
    assert [run.info.run_name for run in runs] == ["0", "1"]
    assert [run.data.params["seed"] for run in runs] == ["1", "2"]
    assert {run.info.experiment_id for run in runs} == {runs[0].info.experiment_id}
    sweep_dir = job_dirs[0].parent
    assert client.get_experiment(runs[0].info.experiment_id).name == str(sweep_dir.relative_to(tmp_path))


@pytest.mark.slow
def test_a_server_lost_mid_run_costs_one_warning_line(tmp_path: Path):
    """The server is SIGKILLed after step 3 of 40: training, checkpoints and results go on, exit status 0."""
    lost = start_server(tmp_path / "server")
    try:
        result = train(
            tmp_path,
            "logger=mlflow",
            f"logger.mlflow.tracking_uri={lost.uri}",
            "trainer.max_epochs=20",
            "+callbacks.kill_server._target_=tests.crash_callback.KillProcessGroupAtStep",
            "+callbacks.kill_server.step=3",
            f"+callbacks.kill_server.pgid={lost.process.pid}",
            env={"PYTHONPATH": str(REPO)},  # lets the run import tests.crash_callback
        )
    finally:
        stop_server(lost)
    # One line says it, urllib3's retries included.
    said = [line for line in result.stderr.splitlines() if lost.uri.removeprefix("http://") in line or "Retry" in line]
    assert len(said) == 1 and LOST_SERVER_WARNING.match(said[0]), result.stderr[-3000:]
    (run_dir,) = printed_run_dirs(result.stdout)
    assert read_json(run_dir / "results.json")["epochs"] == 20
    assert (run_dir / "checkpoints" / "last.ckpt").is_file() and list((run_dir / "checkpoints").glob("best-*.ckpt"))
    # The server's database holds the steps before it went, none after.
    database = MlflowClient(f"sqlite:///{tmp_path / 'server' / 'mlflow.db'}")
    (run,) = runs_of(database, run_dir)
    steps = [metric.step for metric in database.get_metric_history(run.info.run_id, "train/step_loss")]
    assert steps == list(range(len(steps))) and 0 < len(steps) <= 4, steps


@pytest.mark.slow
def test_a_server_not_there_as_the_run_starts_is_one_error_line_before_training(tmp_path: Path):
    uri = f"http://127.0.0.1:{free_port()}"
    no_backoff = "logger.mlflow.request_backoff_factor=0"  # the retries still run, at once
    result = run_module("project.train", "logger=mlflow", f"logger.mlflow.tracking_uri={uri}", no_backoff, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: logger.mlflow.tracking_uri={uri} does not answer")
    assert not list(tmp_path.glob("outputs/*/*/checkpoints/*.ckpt"))


@pytest.mark.slow  # MLflow makes its store's tables: seconds
def test_without_a_server_a_run_logs_into_the_store_under_outputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The default `logger=mlflow`: an SQLite file and the artifacts under outputs/ of where the run started."""
    monkeypatch.chdir(tmp_path)
    for name in ("PL_GLOBAL_SEED", "PL_SEED_WORKERS"):  # build seeds; later tests in this process must not inherit it
        monkeypatch.setenv(name, "0")
    run_dir = tmp_path / "outputs" / "2026-01-01" / "00-00-00"
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        cfg = compose(
            "train",
            overrides=[
                "logger=mlflow",
                "logger.mlflow.log_model=true",
                "callbacks.progress_bar=null",
                f"run_dir={run_dir}",
            ],
        )
    setup = build(cfg, tmp_path / "outputs")
    setup.trainer.fit(setup.module, datamodule=setup.datamodule)

    client = MlflowClient("sqlite:///outputs/mlflow.db")
    (run,) = runs_of(client, run_dir)
    assert run.info.run_name == "outputs/2026-01-01/00-00-00"
    assert len(client.get_metric_history(run.info.run_id, "train/step_loss")) == 6
    assert list((tmp_path / "outputs" / "mlartifacts").glob("*/artifacts/best-*/best-*.ckpt"))
