"""The keys and options suggested for a misspelt override (project/engine/errors.py), on the config `train` composes."""

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf.errors import ConfigKeyError

from project.engine.errors import dotted_keys, nearest_keys, run_hydra_app, typo_message, unknown_option
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


def test_at_most_three_nearest_keys_and_options_are_suggested_the_nearest_first(keys: list[str]):
    """A config with Lightning's `limit_predict_batches` too (a user's): four `limit_*_batches` are near one
    misspelling; a group of torch's optimizers: four are near `adamm`."""
    assert nearest_keys("trainer.limit_train_bathes", [*keys, "trainer.limit_predict_batches"]) == [
        "trainer.limit_train_batches",
        "trainer.limit_val_batches",
        "trainer.limit_test_batches",
    ]
    assert unknown_option("optimizer/adamm", ["adam", "adamw", "adamax", "nadam", "radam", "sgd"]) == (
        "optimizer=adamm is not an option of optimizer: did you mean optimizer=adam or optimizer=radam or "
        "optimizer=nadam? (optimizer has: adam, adamw, adamax, nadam, radam, sgd)"
    )


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer=ddpp", "trainer=ddpp is not an option of trainer: did you mean trainer=ddp? (trainer has: cpu, ddp,"),
        ("model=mnist_mpl", "model=mnist_mpl is not an option of model: did you mean model=mnist_mlp?"),
        ("model=zzz", "model=zzz is not an option of model (model has: "),
        ("model.optimizer.lrr=0.1", "model.optimizer.lrr is not a key of the config: did you mean model.optimizer.lr?"),
        ("~trainer.max_epoch", "~trainer.max_epoch deletes trainer.max_epoch, which is not a key of the config"),
    ],
)
def test_hydras_composition_error_becomes_the_message_with_the_nearest(override: str, message: str):
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE), pytest.raises(ConfigCompositionException) as error:
        compose("train", overrides=[override])
    assert typo_message(error.value).startswith(message), typo_message(error.value)


@pytest.mark.parametrize(
    ("config_name", "override"),
    [
        ("nosuch", "seed=1"),  # a primary config that is not there: Hydra names no options for it
        ("train", "hydra.job.chdir=notabool"),  # a value of the wrong type for a key the config has
        ("train", "+trainer.max_epochs=3"),  # a key added that the config has already
        ("train", "~trainer.max_epochs=5"),  # a key deleted only at a value it does not have
    ],
)
def test_a_composition_error_that_is_no_misspelt_key_or_option_gets_no_message(config_name: str, override: str):
    with initialize_config_dir(str(CONF_DIR), **VERSION_BASE), pytest.raises(ConfigCompositionException) as error:
        compose(config_name, overrides=[override])
    assert typo_message(error.value) is None


def test_hydras_words_without_the_errors_it_names_them_from_get_no_message():
    """Made by hand, as Hydra 1.3 raises neither: an option missing outside a group, or "Could not override" without
    OmegaConf's error that holds the config. The message would have no group to name, or no keys to suggest."""
    assert typo_message(MissingConfigException("no train", missing_cfg_file="train", options=["train_"])) is None
    not_applied = "Could not override 'trainer.max_epoch'.\nTo append to your config use +trainer.max_epoch=3"
    error = ConfigCompositionException(not_applied)
    assert typo_message(error) is None
    error.__cause__ = ConfigKeyError("Key 'max_epoch' is not in struct")  # made by hand: no parent node
    assert typo_message(error) is None


def test_an_entry_point_ends_a_misspelt_override_in_its_one_line_and_status_2(capsys, monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)  # which run_hydra_app sets: unset again after the test

    def main() -> None:
        with initialize_config_dir(str(CONF_DIR), **VERSION_BASE):
            compose("train", overrides=["trainer=ddpp"])

    with pytest.raises(SystemExit) as ended:
        run_hydra_app(main)
    assert ended.value.code == 2
    assert capsys.readouterr().err.startswith(
        "error: trainer=ddpp is not an option of trainer: did you mean trainer=ddp?"
    )
