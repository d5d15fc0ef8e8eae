"""An Optuna search of the user's own (its YAML in their config dir) over their own module's argument."""

import math
import shutil
from pathlib import Path

import pytest
import torch

from tests.helpers import check_ok, error_lines, read_json, train_own

SEARCH_CONF = Path(__file__).parent / "conf"


@pytest.mark.slow
def test_an_optuna_search_of_your_own_optimises_the_metric_your_module_logs(user_dir: Path, tmp_path: Path):
    """Each trial returns its val/mse (the summary shows it, Optuna minimises it) for the lr it was given."""
    sweep = tmp_path / "search"
    shutil.copytree(SEARCH_CONF, user_dir / "my_conf", dirs_exist_ok=True)  # the user's search beside their modules
    result = check_ok(
        train_own(
            user_dir,
            "model=regression",
            "data=regression",
            "hydra.mode=MULTIRUN",
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
def test_an_optuna_search_of_a_module_that_logs_no_metric_ends_at_its_first_trial(user_dir: Path, tmp_path: Path):
    """A search needs its objective: Lightning's BoringModel logs none, so the first trial's first validation ends
    the search in one line (a grid of it runs: tests/test_own_modules.py), and no other trial runs."""
    sweep = tmp_path / "search"
    shutil.copytree(SEARCH_CONF, user_dir / "my_conf", dirs_exist_ok=True)
    result = train_own(
        user_dir,
        "model=boring",
        "data=boring",
        "hydra.mode=MULTIRUN",
        "hparams_search=seeds",
        "trainer.max_epochs=3",
        "logger=none",
        f"hydra.sweep.dir={sweep}",
    )

    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert error_lines(result.stderr) == [result.stderr.rstrip("\n").splitlines()[-1]], "one line, the last"
    assert error_lines(result.stderr)[0].startswith("error: optimized_metric=val/acc is not logged by BoringModel")
    assert error_lines(result.stderr)[0].endswith("(the search optimises it)")
    assert sorted(path.name for path in sweep.iterdir() if path.name.isdigit()) == ["0"]
    assert "Sweep:" not in result.stdout
