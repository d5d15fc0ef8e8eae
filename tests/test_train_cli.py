"""`python -m project.train` as a user runs it: a subprocess, its output, its run dir.

The default run and a config error go through interpreters of their own (marked `fresh`), start-up included; the
rest are forked from the tests' preloaded Python (tests/preloaded_python.py)."""

import re
import subprocess
from pathlib import Path

import pytest

from tests.helpers import check_ok, histories, last_weights, read_json, run_module, shell_environment
from tests.tensorboard_events import read_scalars

pytestmark = pytest.mark.slow


@pytest.mark.fresh
def test_default_run_learns_the_toy_problem_and_writes_everything_in_its_run_dir(tmp_path: Path):
    result = check_ok(run_module("project.train", cwd=tmp_path))
    run_dirs = [p for p in (tmp_path / "outputs").glob("*/*") if p.is_dir()]
    assert len(run_dirs) == 1, run_dirs
    run_dir = run_dirs[0]
    assert "Results" in result.stdout and str(run_dir) in result.stdout
    noise = re.findall(r".*(?:\.py:\d+: |warn|💡).*", result.stdout + result.stderr, flags=re.IGNORECASE)
    assert noise == [], "a first run prints only what its user can act on (project/engine/upstream.py)"

    results = read_json(run_dir / "results.json")
    assert results["train/acc"] == 1.0 and results["test/acc"] == 1.0
    assert results["epochs"] == 3 and results["world_size"] == 1
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()

    scalars = read_scalars(run_dir / "tensorboard")
    assert len(scalars["train/step_loss"]) == 6, "3 epochs × 2 steps, logged every step"
    assert scalars["train/step_loss"][-1] < scalars["train/step_loss"][0]
    assert len(scalars["val/loss"]) == 3 and scalars["val/acc"][-1] == 1.0
    assert {"train/loss", "train/acc", "test/acc"} <= set(scalars)


def test_checkpoint_carries_the_config_that_rebuilds_its_network(tmp_path: Path):
    import torch
    from hydra.utils import instantiate

    check_ok(run_module("project.train", "logger=none", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path))
    checkpoint = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=False)
    network = instantiate(checkpoint["config"]["model"]["network"])
    network.load_state_dict(last_weights(tmp_path / "run"))
    logits = network(torch.tensor([[-0.8, 2.8], [2.6, -1.6]]))
    assert logits.argmax(dim=1).tolist() == [0, 1]


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        # Found by Hydra, before any of the project runs: as a user's interpreter finds it.
        pytest.param(
            "trainer=nope",
            "error: trainer=nope is not an option of trainer",
            marks=[pytest.mark.hydra_report, pytest.mark.fresh],
        ),
        ("trainer.max_epochs=abc", "trainer.max_epochs must be an integer"),
        ("data.batch_size=0", "data.batch_size must be a positive integer"),
        ("data.name=cifar", "data.name='cifar' is not one of"),
    ],
)
def test_bad_input_ends_with_one_clear_line(tmp_path: Path, override: str, expected: str):
    extra = ["experiment=mnist"] if override.startswith("data.name") else []
    result = run_module("project.train", *extra, override, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert expected in result.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize(("trainer", "both"), [("trainer=cpu", ""), ("trainer=ddp", "2>&1")])
def test_a_console_its_reader_closed_leaves_the_run_going_to_its_log_file(tmp_path: Path, trainer: str, both: str):
    """`python -m project.train | head -3` (or `2>&1 | head -3`): the user saw what they wanted; the run (every rank)
    trains to its end, its output in its log file."""
    run_dir = tmp_path / "run"
    command = f"python -m project.train {trainer} logger=none hydra.run.dir={run_dir} {both} | head -3"
    result = subprocess.run(
        ["bash", "-c", f"{command}; exit ${{PIPESTATUS[0]}}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=shell_environment(),
    )
    check_ok(result)
    assert len(result.stdout.splitlines()) == 3 and "Traceback" not in result.stderr, result.stderr[-3000:]
    note = f"was closed by its reader: the run goes on; its output is in {run_dir}"
    log = (run_dir / "train.log").read_text()
    assert note in log and "Results" in log
    if not both:
        assert f"stdout {note}" in result.stderr
    assert read_json(run_dir / "results.json")["test/acc"] == 1.0


@pytest.mark.parametrize("trainer", ["trainer=cpu", "trainer=ddp"])
def test_early_stopping_is_one_key_and_stops_every_rank_where_the_metric_stopped_improving(
    tmp_path: Path, trainer: str
):
    """The toy's val/acc soon reaches 1.0: with patience 2 the run ends two epochs later, far before epoch 50,
    every rank at the same epoch, saying why (once, not once per rank)."""
    run_dir = tmp_path / "run"
    args = [trainer, "logger=none", "trainer.max_epochs=50", f"hydra.run.dir={run_dir}"]
    result = check_ok(
        run_module(
            "project.train",
            *args,
            "callbacks.early_stopping.enabled=true",
            "callbacks.early_stopping.patience=2",
            cwd=tmp_path,
        )
    )
    assert (result.stdout + result.stderr).count("did not improve in the last 2 records") == 1, "said once"
    epochs = read_json(run_dir / "results.json")["epochs"]
    assert epochs < 10
    assert [len(history["epoch_losses"]) for history in histories(run_dir)] == [epochs] * (2 if "ddp" in trainer else 1)
