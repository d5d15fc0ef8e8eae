"""A trained run rebuilt from its checkpoint alone, for `project.evaluate` and `project.predict`, whatever its module.

The checkpoint carries its run's whole config, so the network and the data are rebuilt exactly as they were
trained, except for the `data` keys given on the command line (`data.root=<dir>` where the files are on this
machine). Loading uses `weights_only=True`; a file that is not a checkpoint of this project is refused in one line.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from project.engine.checkpoints import LAST, load_project_checkpoint
from project.engine.errors import CONSTRUCTOR_ERRORS, UserError, find_user_error


def data_given(cfg: DictConfig) -> dict[str, Any]:
    """The `data.<key>=` values given on the command line (those not null): they replace the checkpoint's."""
    given = OmegaConf.to_container(cfg.data) if "data" in cfg else {}
    return {key: value for key, value in given.items() if value is not None}


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
    """(datamodule, module with the trained weights) of the checkpoint `cfg.ckpt_path`, from its stored config.

    The keys of `cfg.data` that are not null replace those of the stored data config (`data.root=<dir>`, where the
    files are on this machine). The data module gets its state from the checkpoint as Lightning gives it back when
    resuming (under its class's name), so that it can refuse data the weights were not trained on (the classifier's
    data modules refuse other classes).
    """
    data_overrides = data_given(cfg)
    if OmegaConf.is_missing(cfg, "ckpt_path"):
        raise UserError(f"give the checkpoint: python -m {program} ckpt_path=<run dir>/checkpoints/last.ckpt")
    checkpoint = load_project_checkpoint(cfg.ckpt_path)
    trained = OmegaConf.create(checkpoint["config"])
    lacking = [group for group in ("data", "model") if not isinstance(trained.get(group), DictConfig)]
    if lacking:
        raise UserError(
            f"ckpt_path={cfg.ckpt_path}: its stored config has no {lacking[0]} to rebuild: give a checkpoint "
            f"project.train wrote ({LAST}), which stores the whole config"
        )
    unknown = sorted(set(data_overrides) - set(trained.data))
    if unknown:
        keys = ", ".join(key for key in trained.data if not key.startswith("_"))
        raise UserError(
            f"data.{unknown[0]}: the checkpoint's data ({trained.data._target_}) has no such key; it has {keys}"
        )
    try:
        datamodule = instantiate(trained.data, **data_overrides)
        module = instantiate(trained.model)
    except CONSTRUCTOR_ERRORS as error:
        if find_user_error(error):  # the user's own mistake, already worded (e.g. data that is missing)
            raise
        raise UserError(
            f"{cfg.ckpt_path}: its stored config no longer builds with this version of the project ({error}); "
            f"use it with the version that trained it"
        ) from None
    module.load_state_dict(checkpoint["state_dict"])
    data_state = checkpoint.get(type(datamodule).__qualname__)
    if data_state is not None:
        datamodule.load_state_dict(data_state)
    return datamodule, module
