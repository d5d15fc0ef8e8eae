"""Test a trained checkpoint: `python -m project.evaluate ckpt_path=<file> [data.root=<dir>]`.

The network and the data are rebuilt from the config stored in the checkpoint (`project.engine.trained_run`), with
the `data` keys given (`data.root=<dir>` where the files are on this machine, as `project.predict` takes them); the
printed test metrics, in the results table's format (4 decimals), equal those of the training run's table for the
same weights (`last.ckpt` holds the final ones). Progress shows as in `project.train` (`callbacks.progress_bar`): the
bar in a terminal, plain lines in a file or a pipe.
"""

import lightning as L
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from project.engine.build import check_data_for, configured_callbacks, progress_bar_switch
from project.engine.errors import exit_on_user_error, run_hydra_app
from project.engine.reports import metric_line
from project.engine.run_dir import launch_of, targets_of, write_receipt
from project.engine.trained_run import blamed_on_data_given, rebuild_trained
from project.engine.trusted_targets import job_whitelist
from project.engine.upstream import hydra_main


def evaluate(cfg: DictConfig, run_dir: str | None = None) -> dict[str, float]:
    """Test metrics of the checkpoint `cfg.ckpt_path` on the test split of the data it was trained on; its receipt
    written into `run_dir` (the entry point's Hydra dir), where one is given."""
    datamodule, module = rebuild_trained(cfg, "project.evaluate")
    check_data_for("test", module, datamodule, "project.evaluate")
    progress = configured_callbacks(cfg.callbacks)
    trainer = L.Trainer(
        accelerator=cfg.accelerator,
        devices=1,
        logger=False,
        enable_checkpointing=False,
        callbacks=progress,
        **progress_bar_switch(progress),
    )
    if run_dir is not None:
        write_receipt(run_dir, targets_of(cfg, module, datamodule), launch_of(trainer, cfg.ckpt_path))
    with blamed_on_data_given(cfg):
        trainer.test(module, datamodule=datamodule, verbose=False)
    return {name: value.item() for name, value in trainer.callback_metrics.items()}


@hydra_main("../conf", "evaluate", job_whitelist)
@exit_on_user_error
def main(cfg: DictConfig) -> None:
    metrics = evaluate(cfg, HydraConfig.get().runtime.output_dir)
    print(f"checkpoint  {cfg.ckpt_path}")
    width = max([12, *(len(name) + 2 for name in metrics)])
    for name in sorted(metrics):
        print(metric_line(name, metrics[name], width))  # as the training run's results table shows them


if __name__ == "__main__":
    run_hydra_app(main)
