"""The Lightning path: `python -m project.train [overrides]` composes conf/, trains, tests, prints the results.

Every strategy is a `trainer=` config; nothing here branches on it. Whatever the number of processes, the run
writes into one Hydra run dir (`run_dir`); rank 0 alone writes results. `main` returns the `optimized_metric`
so Hydra sweepers can optimise it (None where it is not a finite number).
"""

# As a script (`python project/train.py`) this file runs before the project package is imported: importing it first
# handles a SIGTERM from here on (project/__init__.py), not only after lightning's seconds of imports.
import project  # noqa: F401

# isort: split
import math
from pathlib import Path

import lightning as L
from hydra.core.hydra_config import HydraConfig
from hydra.utils import get_original_cwd
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only
from omegaconf import DictConfig, OmegaConf

from project.engine.build import build, why_no_test
from project.engine.errors import exit_on_user_error, in_sweep_job, run_hydra_app
from project.engine.history import summarise_history
from project.engine.job import isolated_job, stop_if_signalled
from project.engine.reports import format_results_table, log_hyperparameters, save_results
from project.engine.run_dir import launch_of, targets_of, write_receipt
from project.engine.run_log import capture_logs, report
from project.engine.sweeps import finished_results
from project.engine.trusted_targets import job_whitelist
from project.engine.upstream import hydra_main


def train(cfg: DictConfig) -> dict:
    """Fit and test the model `cfg` describes (test where the module has a test_step and something serves its
    batches: a module may define neither, as Lightning's LightningTransformer demo does); return the results every
    run prints.

    `results_from` picks the weights the validation and test numbers (and so the value a sweep optimises) come
    from: `last`, the final epoch's, or `best`, the checkpoint with the best `optimized_metric`.
    """
    setup = build(cfg, Path(get_original_cwd()) / "outputs")  # checks the config first, and fills in its hints
    # Before training, so that a run that crashes has one (docs/reproducibility.md).
    write_receipt(cfg.run_dir, targets_of(cfg), launch_of(setup.trainer, setup.ckpt_path))
    if rank_zero_only.rank == 0:
        report(f"Config\n{OmegaConf.to_yaml(cfg, resolve=True)}")
    trainer, module, datamodule = setup.trainer, setup.module, setup.datamodule
    with isolated_job(trainer):
        trainer.fit(module, datamodule=datamodule, ckpt_path=setup.ckpt_path)
        stop_if_signalled(trainer)
        results = metrics_of(trainer)
        weights = "last"
        # No best: a resumed run that validated nothing, and whose checkpoint's best was another run's file (dropped).
        if cfg.results_from == "best" and trainer.checkpoint_callback.best_model_path:
            weights = trainer.checkpoint_callback.best_model_path
            trainer.validate(module, datamodule=datamodule, ckpt_path=weights, verbose=False)
            results |= metrics_of(trainer)
        skipped = why_no_test(module, datamodule)
        if skipped is None:
            trainer.test(module, datamodule=datamodule, ckpt_path=None if weights == "last" else weights, verbose=False)
            stop_if_signalled(trainer)
            results |= metrics_of(trainer)
        else:
            rank_zero_info(f"no test: {skipped}")
        results |= summarise_history(cfg.run_dir, trainer.world_size, trainer.current_epoch) | {"weights": weights}
        # Inside the job: its end closes the loggers, after this last write to them.
        log_hyperparameters(trainer, cfg, results)
    return results


def metrics_of(trainer: L.Trainer) -> dict[str, float]:
    """The numbers the last fit, validate or test call logged."""
    return {name: value.item() for name, value in trainer.callback_metrics.items()}


@hydra_main("../conf", "train", job_whitelist)
@exit_on_user_error
def main(cfg: DictConfig) -> float | None:
    capture_logs()
    finished = finished_results(cfg.run_dir) if in_sweep_job() else None
    if finished is not None:
        job = HydraConfig.get().job.num
        report(f"job {job} finished in an earlier run of this sweep: not run again ({cfg.run_dir})")
        return sweep_value(finished.get(cfg.optimized_metric))
    results = train(cfg)
    if rank_zero_only.rank == 0:
        save_results(results, cfg.run_dir)
        report(format_results_table(results))
    return sweep_value(results.get(cfg.optimized_metric))


def sweep_value(value: float | None) -> float | None:
    """What a sweeper is given: the metric, or None where there is no finite one (Optuna records a failed trial)."""
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


if __name__ == "__main__":
    run_hydra_app(main)
