"""The Lightning path: `python -m project.train [overrides]` composes conf/, trains, tests, prints the results.

Every strategy is a `trainer=` config; nothing here branches on it. What the run writes lands in its Hydra run
dir (`run_dir`), and `main` returns the `optimized_metric` so Hydra sweepers can optimise it.
"""

import hydra
import lightning as L
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from project.config_checks import check_config
from project.errors import exit_on_user_error
from project.history import HistoryCallback
from project.results import format_results_table, save_results


def train(cfg: DictConfig) -> dict:
    """Fit and test the model `cfg` describes; return the results every run prints."""
    check_config(cfg)
    L.seed_everything(cfg.seed, workers=True)
    datamodule: L.LightningDataModule = instantiate(cfg.data)
    module: L.LightningModule = instantiate(cfg.model)
    module.run_config = OmegaConf.to_container(cfg, resolve=True)
    callbacks = [instantiate(callback) for callback in cfg.callbacks.values()]
    loggers = [instantiate(logger) for logger in cfg.logger.values()]
    trainer: L.Trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)

    trainer.fit(module, datamodule=datamodule)
    fit_metrics = {name: value.item() for name, value in trainer.callback_metrics.items()}
    trainer.test(module, datamodule=datamodule, verbose=False)
    metrics = fit_metrics | {name: value.item() for name, value in trainer.callback_metrics.items()}

    history = next((c.history for c in callbacks if isinstance(c, HistoryCallback)), None)
    samples = sum(history.epoch_samples) * trainer.world_size if history else 0
    fit_seconds = history.fit_seconds if history else float("nan")
    return metrics | {
        "epochs": trainer.current_epoch,
        "world_size": trainer.world_size,
        "fit_seconds": fit_seconds,
        "samples_per_second": samples / fit_seconds if history else float("nan"),
        "run_dir": cfg.run_dir,
    }


@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
@exit_on_user_error
def main(cfg: DictConfig) -> float | None:
    results = train(cfg)
    if L.fabric.utilities.rank_zero.rank_zero_only.rank == 0:
        save_results(results, cfg.run_dir)
        print(format_results_table(results), flush=True)
    return results.get(cfg.optimized_metric)


if __name__ == "__main__":
    main()
