"""`hparams_search=mnist_optuna`: a search runs its trials and ends with the sweep's table."""

from pathlib import Path

import pytest

from tests.helpers import check_ok, mnist_overrides, read_json, run_module


@pytest.mark.slow
def test_optuna_search_runs_three_trials_and_prints_the_table(tmp_path: Path, mnist_root: Path):
    sweep_dir = tmp_path / "search"
    result = check_ok(
        run_module(
            "project.train",
            *mnist_overrides(mnist_root, "trainer.max_epochs=1"),
            "hydra.mode=MULTIRUN",
            "hparams_search=mnist_optuna",
            "hydra.sweeper.n_trials=3",
            "hydra.sweeper.sampler.n_startup_trials=3",
            f"hydra.sweep.dir={sweep_dir}",
            cwd=tmp_path,
        )
    )
    jobs = sorted(path.name for path in sweep_dir.iterdir() if (path / "results.json").is_file())
    assert jobs == ["0", "1", "2"]
    table = result.stdout[result.stdout.index("Sweep: 3 job(s)") :]
    for job in jobs:
        value = read_json(sweep_dir / job / "results.json")["val/acc"]
        line = next(line for line in table.splitlines() if line.startswith(f"{job}    "))
        assert "model.optimizer.lr=" in line and f"{value:.4f}" in line
