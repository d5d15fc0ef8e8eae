"""A search with a pruner stops the trials of an absurd learning rate after their first validation, on every rank.

The sampler's seed 6 draws lr 0.003, 0.003, 1e-7, 0.003 for the trials 0..3 (batch 64 fixed): the median pruner
(2 trials to finish first, no warm-up) then prunes trial 2, whose first validation is far below the others' (all
three alike: same lr, same seed); the trials of the good lr are never pruned (a value equal to the median is kept).
"""

import json
from pathlib import Path

import optuna
import pytest
import torch

from tests.helpers import check_ok, mnist_overrides, run_module

MEDIAN_PRUNER = "hydra.sweeper.pruner={_target_:optuna.pruners.MedianPruner,n_startup_trials:2,n_warmup_steps:0}"
BAD_TRIAL = 2


def pruned_search(mnist_root: Path, sweep_dir: Path, trials: int, *extra: str) -> list[str]:
    return [
        *mnist_overrides(mnist_root, "data.batch_size=64", *extra),
        "hydra.mode=MULTIRUN",
        "hparams_search=mnist_optuna",
        f"hydra.sweeper.n_trials={trials}",
        "hydra.sweeper.sampler.seed=6",
        "model.optimizer.lr=choice(0.003,1e-7)",
        MEDIAN_PRUNER,
        f"hydra.sweep.dir={sweep_dir}",
    ]


def stored_trials(sweep_dir: Path) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name="mnist_optuna", storage=f"sqlite:///{sweep_dir}/optuna.db").trials


def steps_of_every_rank(job_dir: Path) -> list[int]:
    histories = sorted(job_dir.glob("history.rank*.json"))
    return [len(json.loads(path.read_text())["step_losses"]) for path in histories]


@pytest.fixture(scope="module")
def four_trials(tmp_path_factory: pytest.TempPathFactory, mnist_root: Path) -> tuple[Path, str]:
    """The search of four trials, 3 epochs each, that prunes trial 2: its sweep dir and output."""
    cwd = tmp_path_factory.mktemp("pruned")
    sweep_dir = cwd / "search"
    result = check_ok(
        run_module("project.train", *pruned_search(mnist_root, sweep_dir, 4, "trainer.max_epochs=3"), cwd=cwd)
    )
    return sweep_dir, result.stdout


@pytest.mark.slow
def test_a_pruned_search_stops_the_absurd_learning_rate_after_one_epoch_and_lists_it_pruned(four_trials):
    sweep_dir, stdout = four_trials
    trials = stored_trials(sweep_dir)
    complete, pruned = optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED
    assert [trial.state for trial in trials] == [complete, complete, pruned, complete]
    assert [trial.params["model.optimizer.lr"] for trial in trials] == [0.003, 0.003, 1e-7, 0.003]
    assert list(trials[BAD_TRIAL].intermediate_values) == [0], "reported once, at its first validation"
    assert all(list(trial.intermediate_values) == [0, 1, 2] for trial in trials if trial.state == complete)
    assert trials[BAD_TRIAL].value < min(trial.value for trial in trials if trial.state == complete)

    steps_per_epoch = -(-350 // 64)
    bad_dir = sweep_dir / str(BAD_TRIAL)
    assert torch.load(bad_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == steps_per_epoch
    assert steps_of_every_rank(bad_dir) == [steps_per_epoch]
    assert steps_of_every_rank(sweep_dir / "3") == [3 * steps_per_epoch]
    mark = (bad_dir / "pruned.txt").read_text()
    assert mark.startswith("pruned: MedianPruner stopped this trial after its validation 0")
    assert "test/acc" in json.loads((bad_dir / "results.json").read_text()), "a pruned trial is tested as any run"

    summary = stdout[stdout.index("Sweep: 4 job(s), 1 pruned") :]
    shown = [line.split()[-2] for line in summary.splitlines() if line[:1].isdigit()]
    assert shown[BAD_TRIAL] == "pruned" and all(value != "pruned" for i, value in enumerate(shown) if i != BAD_TRIAL)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("trial", "verdict"),
    [
        (3, "reproduced bitwise: 18 step(s) on each of 1 process(es)"),
        (
            BAD_TRIAL,
            "reproduced bitwise: 6 step(s) on each of 1 process(es) (its search's pruner stopped it after step 6, and "
            "the re-run there; final metrics not compared)",
        ),
    ],
    ids=["complete", "pruned"],
)
def test_a_trial_of_the_search_is_verified_with_the_searchs_settings_and_a_pruned_one_where_it_stopped(
    four_trials, trial, verdict
):
    """project.verify re-runs one trial as one run with the search's settings (its `results_from: best`, so the final
    metrics are the best epoch's, as the trial's are), and a pruned one to the step where the pruner stopped it."""
    sweep_dir, _ = four_trials
    result = check_ok(run_module("project.verify", str(sweep_dir / str(trial)), cwd=sweep_dir.parent))
    lines = result.stdout.strip().splitlines()
    assert lines[-1] == verdict
    assert trial == BAD_TRIAL or "  the 6 final metrics equal" in lines


@pytest.mark.slow
def test_a_pruned_trial_under_ddp_stops_both_ranks_at_the_same_step(tmp_path: Path, mnist_root: Path):
    """Rank 0 alone reports to the study; rank 1 hears its decision and stops at the same step, with no error."""
    sweep_dir = tmp_path / "search"
    ddp = ("trainer=ddp", "trainer.devices=2", "trainer.max_epochs=2")
    check_ok(
        run_module(
            "project.train", *pruned_search(mnist_root, sweep_dir, 3, *ddp), cwd=tmp_path, env={"OMP_NUM_THREADS": "1"}
        )
    )
    trials = stored_trials(sweep_dir)
    assert [trial.state.name for trial in trials] == ["COMPLETE", "COMPLETE", "PRUNED"]
    steps_per_epoch = -(-175 // 64)  # 175 images per rank
    assert steps_of_every_rank(sweep_dir / str(BAD_TRIAL)) == [steps_per_epoch, steps_per_epoch]
    assert steps_of_every_rank(sweep_dir / "1") == [2 * steps_per_epoch, 2 * steps_per_epoch]
    assert not (sweep_dir / str(BAD_TRIAL) / "error.txt").exists()
