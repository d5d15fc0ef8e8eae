"""The LightningModule: any classifier network, an optimizer from config, cross-entropy and accuracy.

The network arrives built (`project.models`), the optimizer as a partial (`_partial_: true` in `conf/model/`),
so swapping either is a config change. The metrics are torchmetrics objects, which Lightning reduces across
processes correctly under every strategy.
"""

from collections.abc import Callable, Iterable

import lightning as L
import torch
from torch import Tensor, nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

STAGES = ("train", "val", "test")
OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


class ClassifierModule(L.LightningModule):
    """Trains `network` on `(inputs, labels)` batches and logs `{train,val,test}/{loss,acc}`."""

    def __init__(self, network: nn.Module, optimizer: OptimizerFactory, num_classes: int) -> None:
        super().__init__()
        # The network and the optimizer partial are not hyperparameters of their own: the entry point saves the
        # whole Hydra config (which builds both) in every checkpoint.
        self.save_hyperparameters(ignore=["network", "optimizer"])
        self.network = network
        self.optimizer_factory = optimizer
        # The run's whole resolved config, set by the entry point and stored in every checkpoint, so a checkpoint
        # alone can rebuild its network (`checkpoint["config"]["model"]`).
        self.run_config: dict | None = None
        # One loss mean and one accuracy per stage; torchmetrics reduces them over all processes at epoch end.
        for stage in STAGES:
            setattr(self, f"{stage}_loss", MeanMetric())
            setattr(self, f"{stage}_acc", MulticlassAccuracy(num_classes, average="micro"))

    def forward(self, inputs: Tensor) -> Tensor:
        return self.network(inputs)

    def _step(self, batch: tuple[Tensor, Tensor], stage: str) -> Tensor:
        inputs, labels = batch
        logits = self(inputs)
        loss = nn.functional.cross_entropy(logits, labels)
        mean_loss, accuracy = getattr(self, f"{stage}_loss"), getattr(self, f"{stage}_acc")
        mean_loss(loss.detach(), weight=len(labels))
        accuracy(logits.detach(), labels)
        self.log(f"{stage}/loss", mean_loss, on_step=False, on_epoch=True, prog_bar=True)
        self.log(f"{stage}/acc", accuracy, on_step=False, on_epoch=True, prog_bar=True)
        return loss

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        loss = self._step(batch, "train")
        # The per-step value, for the progress bar and TensorBoard; this process's own batch only.
        self.log("train/step_loss", loss.detach(), on_step=True, on_epoch=False, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._step(batch, "val")

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._step(batch, "test")

    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return self(batch[0]).argmax(dim=1)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        if self.run_config is not None:
            checkpoint["config"] = self.run_config

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.optimizer_factory(self.parameters())
