"""A study is data: the job dir a trial's user attribute names, which a worker settling the trial of a worker that is
gone reads results from and marks, is used only where it lies in this worker's sweep dir or is a job dir Hydra wrote
for that trial (another worker's); a study handed over that names any other place gets nothing written there. A
trial's results.json that is not a job's results leaves the trial unfinished, not the search ended in a traceback.
The search's pruning callback refuses a checkpoint's state that is not its own in one line."""

import logging
from pathlib import Path

import optuna
import pytest
from omegaconf import OmegaConf
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState

from project.engine.errors import UserError
from project.engine.sweeps import INTERRUPTED_FILE
from project.optional.optuna import search as search_module
from project.optional.optuna.pruning import TrialPruning
from project.optional.optuna.search import JOB_DIR_ATTR, OptunaSearch

SPACE = {"model.optimizer.lr": FloatDistribution(0.01, 0.1)}
PARAMETERS = {"model.optimizer.lr": 0.05}


def settled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, job_dir: str) -> tuple[OptunaSearch, int]:
    """A worker's search in `tmp_path`/sweep settling the running trial (of `PARAMETERS`) of a worker that is gone,
    whose `job_dir` attribute the study holds; the trial's number."""
    search = OptunaSearch(f"sqlite:///{tmp_path / 'study.db'}", "s", 9, 1, 5, 20, None, None, None, None)
    search.study = optuna.create_study(storage=search.storage, study_name="s", direction="maximize")
    search.sweep_dir, search.config = tmp_path / "sweep", OmegaConf.create({"optimized_metric": "val/acc"})
    search.study.enqueue_trial(PARAMETERS)
    trial = search.study.ask(SPACE)
    trial.set_user_attr(JOB_DIR_ATTR, job_dir)
    monkeypatch.setattr(search_module, "stale_trials", lambda study: [study.get_trials()[trial.number]])
    search._settle_stale()
    return search, trial.number


def job_dir_of_trial_0(directory: Path) -> Path:
    """A job dir Hydra wrote for trial 0 (of `PARAMETERS`) in the sweep dir `directory` of another worker."""
    job = directory / "0"
    (job / ".hydra").mkdir(parents=True)
    overrides = [f"{key}={value}" for key, value in PARAMETERS.items()]
    (job / ".hydra" / "overrides.yaml").write_text("".join(f"- {override}\n" for override in [*overrides, "seed=1"]))
    return job


@pytest.mark.parametrize("where", ["a-directory-elsewhere", "one-to-be-made-elsewhere", "a-url", "dot-dot"])
def test_a_job_dir_the_study_names_outside_the_sweep_gets_nothing_written(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    named = {
        "a-directory-elsewhere": str(elsewhere),
        "one-to-be-made-elsewhere": str(elsewhere / "made"),
        "a-url": "file:///etc",
        "dot-dot": f"{tmp_path}/sweep/../elsewhere",
    }[where]
    with caplog.at_level(logging.WARNING, logger=search_module.__name__):
        search, number = settled(tmp_path, monkeypatch, named)
    assert list(elsewhere.iterdir()) == []
    assert (search.sweep_dir / str(number) / INTERRUPTED_FILE).is_file(), "its place in this sweep dir stands in"
    (warning,) = [r.message for r in caplog.records if "the study names" in r.message]
    assert f"which is neither in this sweep dir nor a job dir of that trial: not used; {search.sweep_dir}" in warning
    assert search.study.get_trials()[number].state == TrialState.FAIL


def test_another_workers_job_dir_of_the_trial_is_still_marked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Workers of one search, each with its own sweep dir: a survivor marks the job dir of the one that died."""
    job = job_dir_of_trial_0(tmp_path / "other-worker")
    search, number = settled(tmp_path, monkeypatch, str(job))
    assert number == 0 and (job / INTERRUPTED_FILE).is_file()
    assert not (search.sweep_dir / "0").exists()


def test_a_job_dir_of_other_parameters_is_not_the_trials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    job = job_dir_of_trial_0(tmp_path / "other-worker")
    (job / ".hydra" / "overrides.yaml").write_text("- model.optimizer.lr=0.07\n")
    search, _ = settled(tmp_path, monkeypatch, str(job))
    assert not (job / INTERRUPTED_FILE).exists() and (search.sweep_dir / "0" / INTERRUPTED_FILE).is_file()


@pytest.mark.parametrize("content", ["[0.9]", "{not json"])
def test_a_results_json_that_is_not_a_jobs_results_leaves_the_trial_unfinished(
    content: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    job = tmp_path / "sweep" / "0"
    job.mkdir(parents=True)
    (job / "results.json").write_text(content)
    search, number = settled(tmp_path, monkeypatch, str(job))
    assert search.study.get_trials()[number].state == TrialState.FAIL
    assert (job / INTERRUPTED_FILE).is_file()


@pytest.mark.parametrize("state", [{}, {"validations": "3"}, {"validations": -1}])
def test_a_pruning_state_that_is_not_a_count_of_validations_is_one_line(state: dict):
    with pytest.raises(UserError, match=r"^ckpt_path: the checkpoint's TrialPruning state holds validations="):
        TrialPruning("val/acc", "unused").load_state_dict(state)
