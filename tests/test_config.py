"""Every option of every config group composes and instantiates (no training)."""

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

import project  # noqa: F401  (registers the ${launch_dir:} resolver)
from tests.conftest import CONF_DIR

GROUPS = sorted(path.name for path in CONF_DIR.iterdir() if path.is_dir() and path.name != "hydra")
NEEDS_GPU = {("trainer", "gpu")}


def options(group: str) -> list[str]:
    return sorted(path.stem for path in (CONF_DIR / group).glob("*.yaml"))


def compose_train(tmp_path: Path, *overrides: str):
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return compose("train", overrides=[*overrides, f"run_dir={tmp_path}"])


@pytest.mark.parametrize(("group", "option"), [(g, o) for g in GROUPS for o in options(g)])
def test_every_option_composes_and_instantiates(tmp_path: Path, group: str, option: str):
    if (group, option) in NEEDS_GPU and not torch.cuda.is_available():
        pytest.skip(f"{group}={option} needs a CUDA GPU to instantiate")
    cfg = compose_train(tmp_path, f"{group}={option}")
    datamodule = instantiate(cfg.data)
    module = instantiate(cfg.model)
    callbacks = [instantiate(c) for c in cfg.callbacks.values()]
    loggers = [instantiate(logger) for logger in cfg.logger.values()]
    trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)
    assert datamodule.batch_size == cfg.data.batch_size
    assert sum(p.numel() for p in module.parameters()) > 0
    assert trainer.max_epochs == (1 if trainer.fast_dev_run else cfg.trainer.max_epochs)


def test_experiment_mnist_is_the_tutorial_recipe(tmp_path: Path):
    cfg = compose_train(tmp_path, "experiment=mnist")
    assert cfg.model.network._target_ == "project.models.DeepNeuralNetwork"
    assert (cfg.model.network.num_layers, cfg.model.network.input_features) == (4, 784)
    assert (cfg.model.network.num_hidden_features, cfg.model.network.num_classes) == (128, 10)
    assert cfg.model.optimizer._target_ == "torch.optim.Adam" and cfg.data.batch_size == 128


def test_default_is_the_toy_tutorial(tmp_path: Path):
    cfg = compose_train(tmp_path)
    assert cfg.seed == 123 and cfg.data.batch_size == 2 and cfg.trainer.max_epochs == 3
    assert cfg.model.optimizer._target_ == "torch.optim.SGD" and cfg.model.optimizer.lr == 0.5


def test_dataset_choice_survives_the_experiment(tmp_path: Path):
    cfg = compose_train(tmp_path, "experiment=mnist", "data=fashion_mnist")
    assert cfg.data.name == "fashion_mnist" and cfg.data.batch_size == 128


def test_every_yaml_key_is_commented():
    """A key line needs a comment on it or on the line just above; `_target_` and block openers are exempt."""
    uncommented = []
    for path in sorted(CONF_DIR.rglob("*.yaml")):
        lines = path.read_text().splitlines()
        for number, line in enumerate(lines):
            stripped = line.strip()
            is_key = ":" in stripped and not stripped.startswith(("#", "-"))
            if not is_key or "#" in line or stripped.startswith("_target_") or stripped.endswith(":"):
                continue
            above = next((lines[i].strip() for i in range(number - 1, -1, -1) if lines[i].strip()), "")
            if not above.startswith("#"):
                uncommented.append(f"{path.relative_to(CONF_DIR)}:{number + 1}: {stripped}")
    assert not uncommented, "\n".join(uncommented)
