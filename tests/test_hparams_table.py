"""The HParams summary a run writes: the keys it chose marked as differing (TensorBoard shows those first, ticked),
every other key still there, the optimised metric first. tests/test_tensorboard_browser.py checks the page itself."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.loggers import TensorBoardLogger
from omegaconf import OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import metadata

from project.engine.reports import log_to_tensorboard
from project.engine.upstream import VERSION_BASE
from tests.helpers import CONF_DIR, requires


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
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        cfg = compose("train", overrides=[*overrides, f"run_dir={tmp_path}"], return_hydra_config=True)
    HydraConfig.instance().set_config(OmegaConf.masked_copy(cfg, "hydra"))
    logger = TensorBoardLogger(tmp_path, name="tensorboard", version="", default_hp_metric=False)
    config = OmegaConf.to_container(cfg)
    for key in ("hydra", "run_dir"):  # as project.train logs it: the run dir is the run's name in the table
        config.pop(key)
    try:
        log_to_tensorboard(logger, config, {"hp/val_loss": 0.5, "hp/val_acc": 0.75}, first_metric="hp/val_acc")
    finally:
        HydraConfig.instance().cfg = None

    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    experiment = metadata.parse_experiment_plugin_data(events.PluginTagToContent("hparams")[metadata.EXPERIMENT_TAG])
    assert {info.name for info in experiment.hparam_infos if info.differs} == chosen
    assert {"seed", "data/_target_", "trainer/max_epochs"} <= {info.name for info in experiment.hparam_infos}
    assert [metric.name.tag for metric in experiment.metric_infos] == ["hp/val_acc", "hp/val_loss"]
    assert events.Scalars("hp/val_acc")[0].value == 0.75
