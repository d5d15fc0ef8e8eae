"""Predict with a trained checkpoint: `python -m project.predict ckpt_path=<file> [split=test] [data.root=<dir>]`.

The checkpoint's stored config rebuilds its network and data (as `project.evaluate` does, `weights_only=True`);
Lightning's `predict` runs it over one split with the chosen `trainer=` (under DDP each rank predicts its
share, `UnrepeatedDistributedSampler`'s samples r, r + N, ..., and rank 0 puts them back in order; `trainer=ddp_spawn`
is refused: Lightning returns no predictions from spawned workers). Rank 0 writes what `predict_step` returned,
whatever the module, to `predictions.pt` (and `predictions.csv` where it fits a table: `project.engine.predictions`).
Where those are class scores and labels (the classifier's `predict_step`), it writes `predictions.csv`,
`per_class.csv`, `confusion_matrix.png` and, for image data, `most_confident_mistakes.png` into the run dir
(`project.example.predictions`) instead, and prints the per-class table; its accuracy is `evaluate`'s test/acc. A data
module of your own needs no `class_names` (the labels then name the classes) and no datasets with the project's
`image` (then no mistakes are drawn).
"""

from collections.abc import Callable
from pathlib import Path

import hydra
import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher
from omegaconf import DictConfig, OmegaConf

from project.engine import predictions as predicted_outputs
from project.engine.errors import UserError, exit_on_user_error, run_hydra_app
from project.engine.job import isolated_job
from project.engine.run_config import RunConfigCallback
from project.engine.run_log import capture_logs, report
from project.evaluate import blamed_on_data_given, rebuild_trained
from project.example.predictions import (
    Predictions,
    per_class_table,
    plot_confident_mistakes,
    plot_confusion_matrix,
    write_csv,
    write_per_class,
)
from project.train import instantiate_group

SPLITS = ("test", "val", "train")


def predict(cfg: DictConfig) -> tuple[predicted_outputs.Outputs | None, L.LightningDataModule]:
    """What `predict_step` returns for every sample of the split, once, in order, on rank 0 (None on the other
    ranks), by output name (`project.engine.predictions`), and the data."""
    if cfg.split not in SPLITS:
        raise UserError(f"split must be one of {' | '.join(SPLITS)}, got {cfg.split!r}")
    datamodule, module, same_classes = rebuild_trained(cfg, "project.predict")
    datamodule.predict_split = cfg.split  # the project's data modules serve that split; a user's own its own
    # The ranks of a DDP prediction check that they composed the same config (`HydraDDPStrategy`).
    same_config = RunConfigCallback(OmegaConf.to_container(cfg, resolve=True))
    trainer: L.Trainer = instantiate_group(
        "trainer",
        cfg.trainer,
        logger=False,
        enable_checkpointing=False,
        callbacks=[same_config, same_classes],
        enable_progress_bar=False,
    )
    if isinstance(trainer.strategy.launcher, _MultiProcessingLauncher):
        raise UserError(
            "project.predict takes the predictions back from its processes, which spawned workers (trainer=ddp_spawn) "
            "do not return: use trainer=ddp"
        )
    with isolated_job(trainer):
        with blamed_on_data_given(cfg):
            outputs = predicted_outputs.joined(trainer.predict(module, datamodule=datamodule))
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            outputs = predicted_outputs.interleave(gathered_shares(outputs))
    if trainer.global_rank != 0:
        return None, datamodule
    return outputs, datamodule


def as_class_predictions(outputs: predicted_outputs.Outputs, datamodule: L.LightningDataModule) -> Predictions | None:
    """The outputs as class predictions, where they are class scores and labels (the classifier's), else None."""
    scores = predicted_outputs.class_scores(outputs)
    if scores is None:
        return None
    probabilities, labels = scores
    return Predictions(labels, probabilities, class_names(datamodule, probabilities.shape[1]))


def class_names(datamodule: L.LightningDataModule, classes: int) -> tuple[str, ...]:
    """The data module's names of its classes, or the labels as strings ("0", "1", ...) where it names none."""
    names = getattr(datamodule, "class_names", ())  # a user's own data module may not name its classes
    return tuple(str(name) for name in names) if names else tuple(str(label) for label in range(classes))


def gathered_shares(outputs: predicted_outputs.Outputs) -> list[predicted_outputs.Outputs]:
    """Every rank's outputs, by rank, on every rank.

    The shares travel on the CPU: `all_gather_object` pickles them, and a GPU tensor unpickles onto the GPU it was
    sent from, which the receiving rank may not see (where each rank is shown only its own GPU).
    """
    shares: list = [None] * dist.get_world_size()
    dist.all_gather_object(shares, {name: output.cpu() for name, output in outputs.items()})
    return shares


def write_outputs(
    outputs: predicted_outputs.Outputs,
    predictions: Predictions | None,
    images: Callable[[int], torch.Tensor] | None,
    run_dir: Path,
) -> list[str]:
    """`predictions.pt` always; for class predictions the files `project.example.predictions` makes, else
    `predictions.csv` where the outputs fit a table; the names written, in `run_dir`."""
    torch.save(outputs, run_dir / "predictions.pt")
    written = ["predictions.pt"]
    if predictions is None:
        return written + (
            ["predictions.csv"] if predicted_outputs.write_table(outputs, run_dir / "predictions.csv") else []
        )
    write_csv(predictions, run_dir / "predictions.csv")
    write_per_class(predictions, run_dir / "per_class.csv")
    plot_confusion_matrix(predictions, run_dir / "confusion_matrix.png")
    written += ["predictions.csv", "per_class.csv", "confusion_matrix.png"]
    if images is not None and plot_confident_mistakes(predictions, images, run_dir / "most_confident_mistakes.png"):
        written.append("most_confident_mistakes.png")
    return written


def split_images(datamodule: L.LightningDataModule, split: str) -> Callable[[int], torch.Tensor] | None:
    """The split's image at an index, in [0, 1] for drawing (read when drawn: an image folder may not fit in
    memory), or None when the data are no images: the toy points, or a dataset without the project's `image`
    (uint8 `[channels, height, width]` at an index), as a user's own may be."""
    dataset = getattr(datamodule, f"{split}_set", None)
    image = getattr(dataset, "image", None)
    if image is None or image(0) is None:
        return None
    return lambda index: image(index).float() / 255


@hydra.main(version_base="1.3", config_path="../conf", config_name="predict")
@exit_on_user_error
def main(cfg: DictConfig) -> None:
    capture_logs()
    outputs, datamodule = predict(cfg)
    if outputs is None:
        return
    predictions = as_class_predictions(outputs, datamodule)
    written = write_outputs(outputs, predictions, split_images(datamodule, cfg.split), Path(cfg.run_dir))
    if predictions is not None:
        report(f"{cfg.split} split of {cfg.ckpt_path}\n{per_class_table(predictions)}")
    else:
        # A data module of the user's own serves its own predict_dataloader, whatever `split` says.
        shapes = ", ".join(f"{name} {list(output.shape)}" for name, output in outputs.items())
        report(f"predictions of {cfg.ckpt_path}: {shapes or 'none'}")
    report(f"run dir: {cfg.run_dir} ({', '.join(written)})")


if __name__ == "__main__":
    run_hydra_app(main)
