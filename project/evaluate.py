"""Test a trained checkpoint: `python -m project.evaluate ckpt_path=<file> [data.root=<dir>]`.

The checkpoint carries its run's whole config, so the network and the data are rebuilt exactly as they were
trained, except for the `data` keys given (`data.root=<dir>` where the files are on this machine, as
`project.predict` takes `data.root`); the printed test metrics equal those of the training run's results table for
the same weights (`last.ckpt` holds the final ones). Loading uses `weights_only=True`; a file that is not a checkpoint
of this project is refused with one line.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import hydra
import lightning as L
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from project.engine.checkpoints import LAST, load_project_checkpoint
from project.engine.errors import UserError, exit_on_user_error, find_user_error, run_hydra_app
from project.engine.run_config import CLASS_NAMES, class_names_of


class SameClassesCheck(L.Callback):
    """Refuses, before the first batch, data that names other classes than the checkpoint was trained on (its
    `class_names`): labels are positions in that list, so a folder with other, fewer or renamed classes would be
    scored against the wrong names, and the accuracy would be silently wrong. Data that names no classes (a data
    module of your own) and checkpoints that store none are taken as they are."""

    def __init__(self, trained: list[str] | None, ckpt_path: str) -> None:
        self.trained, self.ckpt_path = trained, ckpt_path

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # Lightning set the data up just before this.
        names = class_names_of(trainer.datamodule)
        if self.trained is None or not names or names == self.trained:
            return
        raise UserError(
            f"the data has the classes {names}, but {self.ckpt_path} was trained on "
            f"{self.trained} (labels are positions in that list): give data with the same class folders"
        )


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


def evaluate(cfg: DictConfig) -> dict[str, float]:
    """Test metrics of the checkpoint `cfg.ckpt_path` on the test split of the data it was trained on."""
    datamodule, module, same_classes = rebuild_trained(cfg, "project.evaluate")
    trainer = L.Trainer(
        accelerator=cfg.accelerator, devices=1, logger=False, enable_checkpointing=False, callbacks=[same_classes]
    )
    with blamed_on_data_given(cfg):
        trainer.test(module, datamodule=datamodule, verbose=False)
    return {name: value.item() for name, value in trainer.callback_metrics.items()}


def rebuild_trained(cfg: DictConfig, program: str) -> tuple[Any, Any, SameClassesCheck]:
    """(datamodule, module with the trained weights, the check its Trainer needs) of the checkpoint `cfg.ckpt_path`,
    from its stored config.

    The keys of `cfg.data` that are not null replace those of the stored data config (`data.root=<dir>`, where the
    files are on this machine); such data must name the classes the network was trained on (`SameClassesCheck`).
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
    except InstantiationException as error:
        if find_user_error(error):  # the user's own mistake, already worded (e.g. data that is missing)
            raise
        raise UserError(
            f"{cfg.ckpt_path}: its stored config no longer builds with this version of the project ({error}); "
            f"use it with the version that trained it"
        ) from None
    module.load_state_dict(checkpoint["state_dict"])
    return datamodule, module, SameClassesCheck(checkpoint.get(CLASS_NAMES), cfg.ckpt_path)


@hydra.main(version_base="1.3", config_path="../conf", config_name="evaluate")
@exit_on_user_error
def main(cfg: DictConfig) -> None:
    metrics = evaluate(cfg)
    print(f"checkpoint  {cfg.ckpt_path}")
    for name in sorted(metrics):
        print(f"{name:<12}{metrics[name]}")  # full precision: comparable with the run's results.json


if __name__ == "__main__":
    run_hydra_app(main)
