"""Test a trained checkpoint: `python -m project.evaluate ckpt_path=<file> [data.root=<dir>]`.

The checkpoint carries its run's whole config, so the network and the data are rebuilt exactly as they were
trained, except for the `data` keys given (`data.root=<dir>` where the files are on this machine, as
`project.predict` takes `data.root`); the printed test metrics equal those of the training run's results table for
the same weights (`last.ckpt` holds the final ones). Loading uses `weights_only=True`; a file that is not a checkpoint
of this project is refused with one line.
"""

from typing import Any

import hydra
import lightning as L
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from project.errors import UserError, exit_on_user_error, find_user_error, run_hydra_app
from project.runs.checkpoints import LAST, load_project_checkpoint


def evaluate(cfg: DictConfig) -> dict[str, float]:
    """Test metrics of the checkpoint `cfg.ckpt_path` on the test split of the data it was trained on."""
    datamodule, module = rebuild_trained(cfg, "project.evaluate")
    trainer = L.Trainer(accelerator=cfg.accelerator, devices=1, logger=False, enable_checkpointing=False)
    trainer.test(module, datamodule=datamodule, verbose=False)
    return {name: value.item() for name, value in trainer.callback_metrics.items()}


def rebuild_trained(cfg: DictConfig, program: str) -> tuple[Any, Any]:
    """(datamodule, module with the trained weights) of the checkpoint `cfg.ckpt_path`, from its stored config.

    The keys of `cfg.data` that are not null replace those of the stored data config (`data.root=<dir>`, where the
    files are on this machine).
    """
    given = OmegaConf.to_container(cfg.data) if "data" in cfg else {}
    data_overrides = {key: value for key, value in given.items() if value is not None}
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
    return datamodule, module


@hydra.main(version_base="1.3", config_path="../conf", config_name="evaluate")
@exit_on_user_error
def main(cfg: DictConfig) -> None:
    metrics = evaluate(cfg)
    print(f"checkpoint  {cfg.ckpt_path}")
    for name in sorted(metrics):
        print(f"{name:<12}{metrics[name]}")  # full precision: comparable with the run's results.json


if __name__ == "__main__":
    run_hydra_app(main)
