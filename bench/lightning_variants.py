"""`ClassifierModule` variants that price, per step, what its logging and its `__setattr__` shortcut are worth
(`lightning_overhead`)."""

from torch import Tensor, nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from project.example.module import STAGES, ClassifierModule


class PerStepLoggingModule(ClassifierModule):
    """The textbook way, and this project's before the bench: torchmetrics' `MeanMetric` and `MulticlassAccuracy`,
    each called and `self.log`-ged at every step, and the step loss logged at every step."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        classes = list(self.network.modules())[-1].out_features  # the last layer's width
        for stage in STAGES:
            setattr(self, f"{stage}_loss", MeanMetric())
            setattr(self, f"{stage}_acc", MulticlassAccuracy(classes, average="micro"))

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
        self.log("train/step_loss", loss.detach(), on_step=True, on_epoch=False, prog_bar=True)
        return loss

    def _log_epoch_metrics(self, stage: str) -> None:
        """Nothing left to log: `_step` logged the metric objects already."""


class UnloggedModule(ClassifierModule):
    """No `self.log` at all: with no callbacks and no logger, what remains is Lightning's own training loop."""

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return self._step(batch, "train")

    def _log_epoch_metrics(self, stage: str) -> None:
        """Metrics are still updated (as the reference loop counts them) but not logged."""


class PlainSetattrModule(ClassifierModule):
    """`ClassifierModule` without its `__setattr__` shortcut: every attribute Lightning sets goes through
    `nn.Module.__setattr__`'s search for a parameter, buffer or module of that name."""

    __setattr__ = nn.Module.__setattr__
