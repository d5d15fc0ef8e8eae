"""A trained run rebuilt from its checkpoint, for `project.evaluate` and `project.predict`, whatever its module.

A checkpoint of this project carries its run's whole config, so the network and the data are rebuilt exactly as they
were trained, except for the `data` keys given on the command line (`data.root=<dir>` where the files are on this
machine). A Lightning checkpoint this project did not write (a plain `Trainer.save_checkpoint`, from before the
template) carries no config: its module and data are the ones the command line chooses, `model=<option>
data=<option>` as `project.train` takes them. Either way the weights load strictly, a mismatch named in one line.
Loading uses `weights_only=True`; a file that is not a Lightning checkpoint is refused in one line, and so is a stored
config that names code this checkout does not name or trust (`project.engine.trusted_targets`): it is checked whole
before any of it is imported.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from project.engine.build import instantiate_group
from project.engine.checkpoints import LAST, check_weights_fit, load_lightning_checkpoint
from project.engine.errors import CONSTRUCTOR_ERRORS, UserError, find_user_error
from project.engine.trusted_targets import trusted_instantiation, trusted_targets


def data_given(cfg: DictConfig) -> dict[str, Any]:
    """The `data.<key>=` values given on the command line (those not null): they replace the checkpoint's. Nothing where
    `data=<option>` chose a data config of its own (a foreign checkpoint's): nothing of a checkpoint's is replaced."""
    if "data" not in cfg or chosen(cfg, "data"):
        return {}
    return {key: value for key, value in OmegaConf.to_container(cfg.data).items() if value is not None}


def chosen(cfg: DictConfig, group: str) -> bool:
    """Whether the command line chose a config of `group` (`model=toy`): one that names its class."""
    return isinstance(cfg.get(group), DictConfig) and "_target_" in cfg[group]


@contextmanager
def blamed_on_data_given(cfg: DictConfig) -> Iterator[None]:
    """A network that fails on the samples of data changed by `data.<key>=` (`data.image_size`, `data.channels`)
    was given samples of another shape than it was trained on: one line naming those keys, not torch's traceback.
    Without such keys the failure is not the user's, and its traceback is kept."""
    given = data_given(cfg)
    try:
        yield
    except RuntimeError as error:
        if not given or find_user_error(error):
            raise
        keys = " ".join(f"data.{key}={value}" for key, value in given.items())
        raise UserError(
            f"the checkpoint's network does not take the samples of the data as given ({keys}): "
            f"{' '.join(str(error).split())}; change only where the data is and how it is read (data.root, "
            "data.batch_size), not what its samples are"
        ) from None


def rebuild_trained(cfg: DictConfig, program: str) -> tuple[Any, Any]:
    """(datamodule, module with the trained weights) of the checkpoint `cfg.ckpt_path`; the datamodule is None where
    the run had none (`data=none`: the module serves its own batches).

    From its stored config, where it has one: the keys of `cfg.data` that are not null replace those of the stored
    data config (`data.root=<dir>`, where the files are on this machine), and a `model=`/`data=` choice is refused
    (the stored config would silently win over it). A foreign Lightning checkpoint has none: `cfg.model` and
    `cfg.data` (`model=`/`data=` and their keys) build its module and data. The data module gets its state from the
    checkpoint as Lightning gives it back when resuming (under its class's name), so that it can refuse data the
    weights were not trained on (the classifier's data modules refuse other classes).
    """
    if OmegaConf.is_missing(cfg, "ckpt_path"):
        raise UserError(f"give the checkpoint: python -m {program} ckpt_path=<run dir>/checkpoints/last.ckpt")
    trust = trusted_targets(cfg)
    checkpoint = load_lightning_checkpoint(cfg.ckpt_path, trust)
    with trusted_instantiation(trust):
        if "config" in checkpoint:
            datamodule, module = rebuild_from_stored_config(cfg, checkpoint["config"])
            advice = "use it with the version of the project that trained it"
        else:
            datamodule, module = build_from_command_line(cfg)
            advice = "give the model= (and model.<key>=) that trained it"
    check_weights_fit(module, checkpoint["state_dict"], cfg.ckpt_path, advice)
    module.load_state_dict(checkpoint["state_dict"], strict=True)
    data_state = checkpoint.get(type(datamodule).__qualname__) if datamodule is not None else None
    if data_state is not None:
        datamodule.load_state_dict(data_state)
    return datamodule, module


def rebuild_from_stored_config(cfg: DictConfig, config: dict) -> tuple[Any, Any]:
    """(datamodule, module) as the run stored in the checkpoint built them, with the `data.<key>=` given."""
    given = [f"{group}=" for group in ("model", "data") if chosen(cfg, group)]
    if given:
        raise UserError(
            f"ckpt_path={cfg.ckpt_path} stores the config of the run that wrote it, which rebuilds its model and "
            f"data: leave out {' and '.join(given)} (data.<key>= changes a key of its data, e.g. data.root=<dir>)"
        )
    data_overrides = data_given(cfg)
    trained = OmegaConf.create(config)
    lacking = [group for group in ("data", "model") if not isinstance(trained.get(group), DictConfig)]
    if lacking:
        raise UserError(
            f"ckpt_path={cfg.ckpt_path}: its stored config has no {lacking[0]} to rebuild: give a checkpoint "
            f"project.train wrote ({LAST}), which stores the whole config"
        )
    unknown = sorted(set(data_overrides) - set(trained.data))
    if unknown and not trained.data:
        raise UserError(
            f"data.{unknown[0]}: the run of ckpt_path={cfg.ckpt_path} had no data module (data=none), its module "
            "serving its own batches: leave out data.<key>="
        )
    if unknown:
        keys = ", ".join(key for key in trained.data if not key.startswith("_"))
        raise UserError(
            f"data.{unknown[0]}: the checkpoint's data ({trained.data._target_}) has no such key; it has {keys}"
        )
    try:
        datamodule = instantiate(trained.data, **data_overrides) if trained.data else None  # None: data=none
        return datamodule, instantiate(trained.model)
    except CONSTRUCTOR_ERRORS as error:
        if find_user_error(error):  # the user's own mistake, already worded (e.g. data that is missing)
            raise
        raise UserError(
            f"{cfg.ckpt_path}: its stored config no longer builds with this version of the project ({error}); "
            f"use it with the version that trained it"
        ) from None


def build_from_command_line(cfg: DictConfig) -> tuple[Any, Any]:
    """(datamodule, module) of `model=`/`data=` and their keys, for a checkpoint that stores no config.

    The root config's `data.<key>` slots for a stored config's data (`data.root`, ...) are merged into the chosen
    data config; those left null are dropped, so that a data module that takes no such argument is not given one
    (null means not given, as it does for a stored config).
    """
    lacking = [f"{group}=<option>" for group in ("model", "data") if not chosen(cfg, group)]
    if lacking:
        raise UserError(
            f"ckpt_path={cfg.ckpt_path} is a Lightning checkpoint this project did not write (it holds weights, a "
            "state_dict, but no config to rebuild its module and data from): give "
            f"{' and '.join(lacking)} (and their keys) as project.train would take them to train it"
        )
    data = {key: value for key, value in OmegaConf.to_container(cfg.data, resolve=True).items() if value is not None}
    return instantiate_group("data", OmegaConf.create(data)), instantiate_group("model", cfg.model)
