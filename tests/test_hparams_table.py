"""The HParams summary a run writes: the keys it chose marked as differing (TensorBoard shows those first, ticked),
every other key still there, the optimised metric first. tests/test_tensorboard_browser.py checks the page itself."""

import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from hydra import compose, initialize_config_dir
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import metadata
from tensorboard.summary.writer.record_writer import RecordWriter

from project.engine.reports import log_hyperparameters, log_to_tensorboard
from project.engine.upstream import VERSION_BASE
from tests.helpers import CONF_DIR, held_by_hydra, requires


@pytest.mark.parametrize(
    ("overrides", "chosen"),
    [  # a plain run: its command line
        pytest.param(
            ["model.optimizer.lr=0.1", "data.batch_size=1"], {"model/optimizer/lr", "data/batch_size"}, id="run"
        ),
        # The search's space, not the fixed overrides its trials repeat (data.root).
        pytest.param(
            ["hydra.mode=MULTIRUN", "experiment=mnist", "hparams_search=mnist_optuna", "data.root=/data"],
            {"model/optimizer/lr", "data/batch_size"},
            id="optuna",
            marks=requires("optuna"),
        ),
    ],
)
def test_the_keys_a_run_chose_are_marked_differing_and_the_optimised_metric_comes_first(
    tmp_path: Path, overrides: list[str], chosen: set[str]
):
    events = logged_table(tmp_path, overrides)
    experiment = metadata.parse_experiment_plugin_data(events.PluginTagToContent("hparams")[metadata.EXPERIMENT_TAG])
    assert {info.name for info in experiment.hparam_infos if info.differs} == chosen
    assert {"seed", "data/_target_", "trainer/max_epochs"} <= {info.name for info in experiment.hparam_infos}
    assert [metric.name.tag for metric in experiment.metric_infos] == ["hp/val_acc", "hp/train_loss", "hp/val_loss"]
    assert events.Scalars("hp/val_acc")[0].value == 0.75


def test_the_final_metrics_are_on_disk_before_the_table_is_however_slow_tensorboards_writer_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """TensorBoard reads a run's event files one after the other and does not go back to an earlier one: metrics
    that the logger's writer thread wrote only after the table's file appeared would never show."""
    write = RecordWriter.write

    def slow_write(self: RecordWriter, data: bytes) -> None:
        if b"_hparams_" not in data:  # the logger's events, not the table's: its thread runs late, as on a busy machine
            time.sleep(0.2)
        write(self, data)

    monkeypatch.setattr(RecordWriter, "write", slow_write)
    events = logged_table(tmp_path, ["model.optimizer.lr=0.1"])
    assert events.Scalars("hp/val_acc")[0].value == 0.75
    assert events.Scalars("hp/val_loss")[0].value == 0.5


def test_a_rank_other_than_0_writes_no_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Every process of a DDP run logs its hyperparameters at its end; rank 0's table is the run's, and another
    rank's would put the run in TensorBoard's table once more."""
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    write_table(tmp_path, ["model.optimizer.lr=0.1"])
    assert list(tmp_path.rglob("events.*")) == []


def write_table(directory: Path, overrides: list[str]) -> None:
    """`log_to_tensorboard` of a run of `overrides`, as `project.train` calls it, into `directory`/tensorboard."""
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        cfg = compose("train", overrides=[*overrides, f"run_dir={directory}"], return_hydra_config=True)
    with held_by_hydra(OmegaConf.masked_copy(cfg, "hydra")):
        logger = TensorBoardLogger(directory, name="tensorboard", version="", default_hp_metric=False)
        config = OmegaConf.to_container(cfg)
        for key in ("hydra", "run_dir"):  # as project.train logs it: the run dir is the run's name in the table
            config.pop(key)
        metrics = {"hp/train_loss": 0.25, "hp/val_loss": 0.5, "hp/val_acc": 0.75}  # one sorts before the first
        first = "/".join(["hp", "val_acc"])  # built as the run builds it, not the same object as the key
        log_to_tensorboard(logger, config, metrics, first_metric=first)


def logged_table(directory: Path, overrides: list[str]) -> EventAccumulator:
    """What TensorBoard reads of the table `log_to_tensorboard` writes for a run of `overrides`, right after."""
    write_table(directory, overrides)
    events = EventAccumulator(str(directory / "tensorboard"))
    events.Reload()
    return events


class Tracker:
    """A tracker's logger (MLflow's, W&B's) as `log_hyperparameters` meets it: what it was given."""

    def __init__(self) -> None:
        self.params, self.metrics, self.saved = {}, {}, False

    def log_hyperparams(self, params: dict) -> None:
        self.params = params

    def log_metrics(self, metrics: dict, step: int) -> None:
        self.metrics = {"step": step, **metrics}

    def save(self) -> None:
        self.saved = True


def test_a_trackers_runs_table_gets_the_config_resolved_its_world_size_and_the_numeric_final_metrics():
    """Without the run dir, callbacks and loggers (the run's name, and machinery); metrics named `hp/...`."""
    tracker = Tracker()
    trainer = SimpleNamespace(loggers=[tracker], world_size=2, global_step=7)
    cfg = OmegaConf.create(
        {
            "model": {"lr": 0.1, "warmup_lr": "${model.lr}"},
            "run_dir": "/runs/0",
            "callbacks": {"a": 1},
            "logger": {"b": 2},
            "optimized_metric": "val/acc",
        }
    )
    results = {"val/acc": 0.5, "note": "text", "epochs": 3, "world_size": 2, "run_dir": "/runs/0"}
    log_hyperparameters(trainer, cfg, results)
    assert tracker.params == {
        "model": {"lr": 0.1, "warmup_lr": 0.1},
        "optimized_metric": "val/acc",
        "world_size": 2,
    }
    assert tracker.metrics == {"step": 7, "hp/val_acc": 0.5} and tracker.saved
