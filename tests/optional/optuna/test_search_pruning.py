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


@pytest.mark.slow
def test_a_pruned_search_stops_the_absurd_learning_rate_after_one_epoch_and_lists_it_pruned(
    tmp_path: Path, mnist_root: Path
):
    sweep_dir = tmp_path / "search"
    result = check_ok(
        run_module("project.train", *pruned_search(mnist_root, sweep_dir, 4, "trainer.max_epochs=3"), cwd=tmp_path)
    )
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

    summary = result.stdout[result.stdout.index("Sweep: 4 job(s), 1 pruned") :]
    shown = [line.split()[-2] for line in summary.splitlines() if line[:1].isdigit()]
    assert shown[BAD_TRIAL] == "pruned" and all(value != "pruned" for i, value in enumerate(shown) if i != BAD_TRIAL)


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
