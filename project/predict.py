"""Predict with a trained checkpoint: `python -m project.predict ckpt_path=<file> [split=test] [data.root=<dir>]`.

The checkpoint's stored config rebuilds its network and data (as `project.evaluate` does, `weights_only=True`);
Lightning's `predict` runs it over one split with the chosen `trainer=` (under DDP each rank predicts its
share, `UnrepeatedDistributedSampler`'s samples r, r + N, ..., and rank 0 puts them back in order; `trainer=ddp_spawn`
is refused: Lightning returns no predictions from spawned workers). Rank 0 writes
`predictions.csv`, `per_class.csv`, `confusion_matrix.png` and, for image data, `most_confident_mistakes.png` into
the run dir (`project.predictions`), and prints the per-class table. Its accuracy is `evaluate`'s test/acc.
A data module of your own needs no `class_names` (the labels then name the classes) and no datasets with the
project's `image` (then no mistakes are drawn).
"""

from collections.abc import Callable
from pathlib import Path

import hydra
import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher
from omegaconf import DictConfig, OmegaConf

from project.errors import UserError, exit_on_user_error
from project.evaluate import rebuild_trained
from project.job import isolated_job
from project.predictions import (
    Predictions,
    per_class_table,
    plot_confident_mistakes,
    plot_confusion_matrix,
    write_csv,
    write_per_class,
)
from project.runs.run_log import capture_logs, report
from project.train import instantiate_group

SPLITS = ("test", "val", "train")


def predict(cfg: DictConfig) -> tuple[Predictions | None, L.LightningDataModule]:
    """Every sample of split `cfg.split` once, in order, on rank 0 (None on the other ranks), and the data."""
    if cfg.split not in SPLITS:
        raise UserError(f"split must be one of {' | '.join(SPLITS)}, got {cfg.split!r}")
    given = {key: value for key, value in OmegaConf.to_container(cfg.data).items() if value is not None}
    datamodule, module = rebuild_trained(cfg, "project.predict", given)
    datamodule.predict_split = cfg.split
    trainer: L.Trainer = instantiate_group(
        "trainer", cfg.trainer, logger=False, enable_checkpointing=False, callbacks=[], enable_progress_bar=False
    )
    if isinstance(trainer.strategy.launcher, _MultiProcessingLauncher):
        raise UserError(
            "project.predict takes the predictions back from its processes, which spawned workers (trainer=ddp_spawn) "
            "do not return: use trainer=ddp"
        )
    with isolated_job(trainer):
        batches = trainer.predict(module, datamodule=datamodule)
        probabilities = torch.cat([probabilities for probabilities, _ in batches])
        labels = torch.cat([labels for _, labels in batches])
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            probabilities, labels = interleave(gathered_shares(probabilities, labels))
    if trainer.global_rank != 0:
        return None, datamodule
    return Predictions(labels, probabilities, class_names(datamodule, probabilities.shape[1])), datamodule


def class_names(datamodule: L.LightningDataModule, classes: int) -> tuple[str, ...]:
    """The data module's names of its classes, or the labels as strings ("0", "1", ...) where it names none."""
    names = getattr(datamodule, "class_names", ())  # a user's own data module may not name its classes
    return tuple(str(name) for name in names) if names else tuple(str(label) for label in range(classes))


def gathered_shares(probabilities: torch.Tensor, labels: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every rank's (probabilities, labels), by rank, on every rank.

    The shares travel on the CPU: `all_gather_object` pickles them, and a GPU tensor unpickles onto the GPU it was
    sent from, which the receiving rank may not see (where each rank is shown only its own GPU).
    """
    shares: list = [None] * dist.get_world_size()
    dist.all_gather_object(shares, (probabilities.cpu(), labels.cpu()))
    return shares


def interleave(shares: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The ranks' shares back in the split's order: rank r holds samples r, r + N, r + 2N, ..."""
    ranks = len(shares)
    total = sum(len(labels) for _, labels in shares)
    probabilities = torch.empty(total, shares[0][0].shape[1])
    labels = torch.empty(total, dtype=shares[0][1].dtype)
    for rank, (rank_probabilities, rank_labels) in enumerate(shares):
        probabilities[rank::ranks] = rank_probabilities
        labels[rank::ranks] = rank_labels
    return probabilities, labels


def write_outputs(predictions: Predictions, images: Callable[[int], torch.Tensor] | None, run_dir: Path) -> list[str]:
    """The files `project.predictions` makes, in `run_dir`; their names."""
    write_csv(predictions, run_dir / "predictions.csv")
    write_per_class(predictions, run_dir / "per_class.csv")
    plot_confusion_matrix(predictions, run_dir / "confusion_matrix.png")
    written = ["predictions.csv", "per_class.csv", "confusion_matrix.png"]
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
    predictions, datamodule = predict(cfg)
    if predictions is None:
        return
    written = write_outputs(predictions, split_images(datamodule, cfg.split), Path(cfg.run_dir))
    report(f"{cfg.split} split of {cfg.ckpt_path}\n{per_class_table(predictions)}")
    report(f"run dir: {cfg.run_dir} ({', '.join(written)})")


if __name__ == "__main__":
    main()
