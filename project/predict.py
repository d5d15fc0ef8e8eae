"""Predict with a trained checkpoint: `python -m project.predict ckpt_path=<file> [split=test] [data.root=<dir>]`.

The checkpoint's stored config rebuilds its network and data (`project.engine.trained_run`, as `project.evaluate`
does); Lightning's `predict` runs it over one split with the chosen `trainer=` (under DDP each rank predicts its
share, `UnrepeatedDistributedSampler`'s samples r, r + N, ..., and rank 0 puts them back in order; `trainer=ddp_spawn`
is refused: Lightning returns no predictions from spawned workers). Rank 0 writes what `predict_step` returned,
whatever the module, to `predictions.pt` (a module without one gets Lightning's, which calls its `forward` with the
batch, or else one line saying to define one: `project.engine.trained_run`). A module that defines
`write_predictions(outputs, datamodule, directory)` writes the rest of its files itself and returns their names (the
classifier: a CSV, a per-class table, pictures); for any other, `predictions.csv` is written where the outputs fit a
table (`project.engine.trained_run`). A data module with a `predict_split` attribute is told the split (`split=`); one
without serves its own predict_dataloader. Progress shows as in `project.train` (`callbacks.progress_bar`).
"""

from pathlib import Path

import lightning as L
import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf

from project.engine.build import check_data_for, configured_callbacks, instantiate_group, progress_bar_switch
from project.engine.config import RunConfigCallback
from project.engine.errors import UserError, exit_on_user_error, run_hydra_app
from project.engine.job import isolated_job
from project.engine.run_dir import launch_of, targets_of, write_receipt
from project.engine.run_log import capture_logs, report
from project.engine.trained_run import (
    Outputs,
    blamed_on_data_given,
    interleave,
    joined,
    predict_step_needed,
    rebuild_trained,
    write_table,
)
from project.engine.trusted_targets import job_whitelist
from project.engine.upstream import hydra_main, is_spawn_launcher

SPLITS = ("test", "val", "train")


def predict(
    cfg: DictConfig,
) -> tuple[Outputs | None, L.LightningModule, L.LightningDataModule | None]:
    """What `predict_step` returns for every sample of the split, once, in order, on rank 0 (None on the other
    ranks), by output name (`project.engine.trained_run`); the module and the data."""
    if cfg.split not in SPLITS:
        raise UserError(f"split must be one of {' | '.join(SPLITS)}, got {cfg.split!r}")
    datamodule, module = rebuild_trained(cfg, "project.predict")
    check_data_for("predict", module, datamodule, "project.predict")
    if hasattr(datamodule, "predict_split"):
        datamodule.predict_split = cfg.split
    # The ranks of a DDP prediction check that they composed the same config (`HydraDDPStrategy`).
    same_config = RunConfigCallback(OmegaConf.to_container(cfg, resolve=True))
    progress = configured_callbacks(cfg.callbacks)
    trainer: L.Trainer = instantiate_group(
        "trainer",
        cfg.trainer,
        logger=False,
        enable_checkpointing=False,
        callbacks=[same_config, *progress],
        **progress_bar_switch(progress),
    )
    if is_spawn_launcher(trainer.strategy.launcher):
        raise UserError(
            "project.predict takes the predictions back from its processes, which spawned workers (trainer=ddp_spawn) "
            "do not return: use trainer=ddp"
        )
    write_receipt(cfg.run_dir, targets_of(cfg, module, datamodule), launch_of(trainer, cfg.ckpt_path))
    with isolated_job(trainer):
        with blamed_on_data_given(cfg), predict_step_needed(module):
            outputs = joined(trainer.predict(module, datamodule=datamodule))
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            outputs = interleave(gathered_shares(outputs))
    return (outputs if trainer.global_rank == 0 else None), module, datamodule


def write_predictions(
    outputs: Outputs, module: L.LightningModule, datamodule: L.LightningDataModule | None, run_dir: Path
) -> list[str]:
    """`predictions.pt` always; then the module's own files (`write_predictions`), or else `predictions.csv` where the
    outputs fit a table; the names written, in `run_dir`."""
    torch.save(outputs, run_dir / "predictions.pt")
    own = getattr(module, "write_predictions", None)
    if own is not None:
        return ["predictions.pt", *own(outputs, datamodule, run_dir)]
    # A data module of the user's own serves its own predict_dataloader, whatever `split` says.
    shapes = ", ".join(f"{name} {list(output.shape)}" for name, output in outputs.items())
    report(f"outputs: {shapes or 'none'}")
    return [
        "predictions.pt",
        *(["predictions.csv"] if write_table(outputs, run_dir / "predictions.csv") else []),
    ]


def gathered_shares(outputs: Outputs) -> list[Outputs]:
    """Every rank's outputs, by rank, on every rank.

    The shares travel on the CPU: `all_gather_object` pickles them, and a GPU tensor unpickles onto the GPU it was
    sent from, which the receiving rank may not see (where each rank is shown only its own GPU).
    """
    shares: list = [None] * dist.get_world_size()
    dist.all_gather_object(shares, {name: output.cpu() for name, output in outputs.items()})
    return shares


@hydra_main("../conf", "predict", job_whitelist)
@exit_on_user_error
def main(cfg: DictConfig) -> None:
    capture_logs()
    outputs, module, datamodule = predict(cfg)
    if outputs is None:
        return
    report(f"predictions of {cfg.ckpt_path}")
    written = write_predictions(outputs, module, datamodule, Path(cfg.run_dir))
    report(f"run dir: {cfg.run_dir} ({', '.join(written)})")


if __name__ == "__main__":
    run_hydra_app(main)
