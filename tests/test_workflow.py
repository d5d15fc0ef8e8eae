"""The experiment loop: TensorBoard you can open, exact resume, evaluation, searches, debug presets."""

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from project.engine.reports import format_value
from tests.helpers import REPO, TRUST_TEST_CODE, check_ok, free_port, mnist_overrides, read_json, requires, run_module
from tests.tensorboard_events import read_scalars

pytestmark = pytest.mark.slow
WITH_TEST_CALLBACKS = {"PYTHONPATH": str(REPO)}  # lets a run import tests.crash_callback


def get_json(url: str, body: dict | None = None) -> object:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def test_tensorboard_server_serves_scalars_and_hparams_of_a_run(tmp_path: Path):
    check_ok(run_module("project.train", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path))
    logged = read_scalars(tmp_path / "run" / "tensorboard")
    port = free_port()
    server = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "tensorboard"),
            "--logdir",
            str(tmp_path),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    expected_tags = {"train/step_loss", "train/loss", "val/acc", "test/acc", "train/lr", "hp/test_acc"}

    def served_tags() -> set[str]:
        """The run's scalar tags TensorBoard serves so far: it lists a run before it has read the run's events."""
        return set(get_json(f"{base}/data/plugin/scalars/tags").get("run/tensorboard", ()))

    try:
        deadline = time.monotonic() + 300  # only against a hang: the loop ends when the data is served
        while True:
            try:
                if expected_tags <= served_tags():
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline and server.poll() is None, "tensorboard never served the run's tags"
            time.sleep(0.2)
        assert get_json(f"{base}/data/runs") == ["run/tensorboard"]
        served = get_json(f"{base}/data/plugin/scalars/scalars?run=run/tensorboard&tag=train/step_loss")
        assert [value for _, _, value in served] == pytest.approx(logged["train/step_loss"])
        assert len(served) == 6
        experiment = get_json(f"{base}/data/plugin/hparams/experiment", {"experimentName": ""})
        hparams = {info["name"] for info in experiment["hparamInfos"]}
        assert {"model/optimizer/lr", "seed", "data/batch_size"} <= hparams
        assert "hp/test_acc" in {info["name"]["tag"] for info in experiment["metricInfos"]}
    finally:
        server.terminate()
        server.wait(timeout=30)


def final_network(run_dir: Path) -> dict[str, torch.Tensor]:
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    return {k: v for k, v in state.items() if k.startswith("network.")}


@pytest.mark.parametrize("processes", [1, 2])
def test_run_killed_after_epoch_one_resumes_to_the_same_weights(tmp_path: Path, mnist_root: Path, processes: int):
    strategy = ["trainer=ddp", "trainer.devices=2", "data.batch_size=25"] if processes == 2 else []
    args = mnist_overrides(mnist_root, "trainer.max_epochs=3", *strategy)
    check_ok(run_module("project.train", *args, "hydra.run.dir=outputs/whole", cwd=tmp_path))

    crash = ["+callbacks.crash._target_=tests.crash_callback.KillAtEpochStart", "+callbacks.crash.epoch=1"]
    killed = run_module(
        "project.train", *args, *crash, "hydra.run.dir=outputs/killed", cwd=tmp_path, env=WITH_TEST_CALLBACKS
    )
    assert killed.returncode != 0
    assert torch.load(tmp_path / "outputs/killed/checkpoints/last.ckpt", weights_only=True)["epoch"] == 0

    resumed = check_ok(
        run_module(
            "project.train", *args, "ckpt_path=last", TRUST_TEST_CODE, "hydra.run.dir=outputs/resumed", cwd=tmp_path
        )
    )
    assert "outputs/killed/checkpoints/last.ckpt" in resumed.stdout + resumed.stderr
    assert read_json(tmp_path / "outputs/resumed/results.json")["epochs"] == 3
    whole, again = final_network(tmp_path / "outputs/whole"), final_network(tmp_path / "outputs/resumed")
    for name, tensor in whole.items():
        if processes == 1:
            assert torch.equal(tensor, again[name]), f"{name} differs after resuming"
        else:
            assert (tensor - again[name]).abs().max() <= 1e-6


def test_evaluate_reproduces_training_metrics_and_refuses_a_config_it_cannot_build(tmp_path: Path, mnist_root: Path):
    """Evaluated where the data have moved since training (`data.root`, as on another machine): the same numbers."""
    shutil.copytree(mnist_root, tmp_path / "data")
    check_ok(
        run_module(
            "project.train",
            *mnist_overrides(tmp_path / "data", "trainer.max_epochs=2"),
            f"hydra.run.dir={tmp_path / 'run'}",
            cwd=tmp_path,
        )
    )
    trained = read_json(tmp_path / "run" / "results.json")
    (tmp_path / "data").rename(tmp_path / "moved")
    result = check_ok(
        run_module(
            "project.evaluate",
            f"ckpt_path={tmp_path / 'run/checkpoints/last.ckpt'}",
            f"data.root={tmp_path / 'moved'}",
            f"hydra.run.dir={tmp_path / 'eval'}",
            cwd=tmp_path,
        )
    )
    printed = dict(line.split() for line in result.stdout.splitlines() if line.startswith("test/"))
    assert printed["test/acc"] == format_value(trained["test/acc"]), "as the results table shows it"
    assert printed["test/loss"] == format_value(trained["test/loss"])

    # A checkpoint of an earlier version, whose ClassifierModule still took `num_classes`: one line, exit 2.
    earlier = torch.load(tmp_path / "run/checkpoints/last.ckpt", weights_only=True)
    earlier["config"]["model"]["num_classes"] = 10
    torch.save(earlier, tmp_path / "earlier.ckpt")
    result = run_module(
        "project.evaluate",
        f"ckpt_path={tmp_path / 'earlier.ckpt'}",
        f"hydra.run.dir={tmp_path / 'eval2'}",
        cwd=tmp_path,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and "no longer builds" in error_lines[0] and "num_classes" in error_lines[0]


@pytest.mark.parametrize("content", [b"not a checkpoint at all", None])
def test_evaluate_refuses_corrupt_and_foreign_files_in_one_line(tmp_path: Path, content: bytes | None):
    path = tmp_path / "model.ckpt"
    if content is None:  # a real torch file, but not one of ours
        torch.save({"weights": torch.zeros(3)}, path)
    else:
        path.write_bytes(content)
    result = run_module("project.evaluate", f"ckpt_path={path}", f"hydra.run.dir={tmp_path / 'eval'}", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and str(path) in error_lines[0]


def test_debug_fast_runs_exactly_one_batch_per_stage(tmp_path: Path, mnist_root: Path):
    result = check_ok(
        run_module(
            "project.train",
            *mnist_overrides(mnist_root),
            "debug=fast",
            f"hydra.run.dir={tmp_path / 'run'}",
            cwd=tmp_path,
        )
    )
    history = read_json(tmp_path / "run" / "history.rank0.json")
    assert history["epoch_samples"] == [128] and len(history["step_losses"]) == 1
    assert "Results" in result.stdout


def test_debug_overfit_drives_the_loss_to_zero(tmp_path: Path, mnist_root: Path):
    check_ok(
        run_module(
            "project.train",
            *mnist_overrides(mnist_root),
            "debug=overfit",
            f"hydra.run.dir={tmp_path / 'run'}",
            cwd=tmp_path,
        )
    )
    history = read_json(tmp_path / "run" / "history.rank0.json")
    assert len(history["epoch_samples"]) == 60 and set(history["epoch_samples"]) == {256}
    assert history["step_losses"][0] > 1.0 and history["epoch_losses"][-1] < 0.05


def test_debug_profile_writes_the_profiler_report(tmp_path: Path):
    check_ok(run_module("project.train", "debug=profile", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path))
    report = (tmp_path / "run" / "fit-profile.txt").read_text()
    assert "run_training_epoch" in report and "Total" in report


def test_bf16_mixed_precision_trains(tmp_path: Path):
    check_ok(
        run_module("project.train", "trainer.precision=bf16-mixed", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    )
    results = read_json(tmp_path / "run" / "results.json")
    assert results["test/acc"] == 1.0 and results["epochs"] == 3
    checkpoint = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert checkpoint["config"]["trainer"]["precision"] == "bf16-mixed"


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["ckpt_path=/no/such/file.ckpt"], "ckpt_path=/no/such/file.ckpt: no such file"),
        (["ckpt_path=last"], "ckpt_path=last: no earlier run"),
        pytest.param(
            ["hparams_search=nope"],
            "error: hparams_search=nope is not an option of hparams_search",
            marks=[pytest.mark.hydra_report, requires("optuna")],
        ),
    ],
)
def test_bad_resume_or_search_input_touches_nothing(tmp_path: Path, overrides: list[str], expected: str):
    existing = tmp_path / "elsewhere" / "old-run"
    check_ok(run_module("project.train", "logger=none", f"hydra.run.dir={existing}", cwd=tmp_path))
    before = {path: path.stat().st_mtime_ns for path in existing.rglob("*")}
    result = run_module("project.train", *overrides, cwd=tmp_path)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert expected in result.stderr
    assert {path: path.stat().st_mtime_ns for path in existing.rglob("*")} == before
