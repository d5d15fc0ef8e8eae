"""The keys and options suggested for a misspelt override (project/engine/errors.py), on the config `train` composes."""

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

from project.engine.errors import dotted_keys, nearest_keys, typo_message
from project.engine.upstream import VERSION_BASE
from tests.helpers import CONF_DIR


@pytest.fixture(scope="module")
def keys() -> list[str]:
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
        return dotted_keys(compose("train", return_hydra_config=True))


@pytest.mark.parametrize(
    ("misspelt", "nearest"),
    [
        ("trainer.max_epoch", ["trainer.max_epochs"]),
        ("trainer.devics", ["trainer.devices"]),
        ("model.optimizer.lrr", ["model.optimizer.lr"]),
        ("trainr.max_epochs", ["trainer.max_epochs"]),
        ("model.optimzer.lrr", ["model.optimizer.lr"]),
        ("trainr", ["trainer"]),
        ("hydra.run.dirr", ["hydra.run.dir"]),
        ("trainer.foo", []),
        ("seed.x", []),
    ],
)
def test_the_nearest_keys_are_beside_the_misspelt_one_or_under_the_nearest_parent(
    keys: list[str], misspelt: str, nearest: list[str]
):
    assert nearest_keys(misspelt, keys) == nearest


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer=ddpp", "trainer=ddpp is not an option of trainer: did you mean trainer=ddp? (trainer has: cpu, ddp,"),
        ("model=mnist_mpl", "model=mnist_mpl is not an option of model: did you mean model=mnist_mlp?"),
        ("model=zzz", "model=zzz is not an option of model (model has: "),
        ("model.optimizer.lrr=0.1", "model.optimizer.lrr is not a key of the config: did you mean model.optimizer.lr?"),
    ],
)
def test_hydras_composition_error_becomes_the_message_with_the_nearest(override: str, message: str):
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE), pytest.raises(ConfigCompositionException) as error:
        compose("train", overrides=[override])
    assert typo_message(error.value).startswith(message), typo_message(error.value)
