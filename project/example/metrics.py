"""The loss and accuracy both training paths report: one torchmetrics `Metric` that both import.

The Lightning module and the raw reference loop update the same object the same way, so their epoch numbers
agree by construction. It keeps three running sums and adds to them in place, which is what a hand-written loop
does: torchmetrics' `MeanMetric` and `MulticlassAccuracy` check their inputs on every update (NaNs, label range),
a dozen more small operations per step on the CPU and, on a GPU, a wait for the device at every step
(`MeanMetric`'s `if nans.any()`).
"""

import torch
from torch import Tensor
from torchmetrics import Metric


class ClassificationTotals(Metric):
    """Sums of loss × samples, correct predictions and samples; `compute()` gives `{"loss": mean, "acc": share}`.

    Under DDP, `compute()` sums the three totals over all processes first (torchmetrics' sync), so every rank gets
    the numbers of the whole epoch. Build it with `sync_on_compute=False` for a metric that one process fills
    alone, such as the reference path's rank-0 evaluation.
    """

    # torchmetrics asks every metric to say whether `forward()` needs the whole state; sums do not (neither path
    # calls `forward()`, but the answer spares torchmetrics a check at first use).
    full_state_update = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("loss_sum", default=torch.tensor(0.0), dist_reduce_fx="sum")
        # Integer counts stay exact however many samples an epoch has (a float32 count stops at 2**24).
        self.add_state("correct", default=torch.tensor(0), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0), dist_reduce_fx="sum")

    def _apply(self, fn, *args, **kwargs) -> "ClassificationTotals":
        """Move the states with the module, but keep their dtypes.

        Lightning's `16-true` and `bf16-true` precisions cast the whole LightningModule with `.to(dtype)`, which
        torchmetrics passes on to the states: a half-precision sum of an epoch's losses keeps about 3 digits.
        """
        dtypes = {name: getattr(self, name).dtype for name in self._defaults}
        moved = super()._apply(fn, *args, **kwargs)
        for name, dtype in dtypes.items():
            setattr(moved, name, getattr(moved, name).to(dtype))
            moved._defaults[name] = moved._defaults[name].to(dtype)
        return moved

    def update(self, logits: Tensor, labels: Tensor, loss: Tensor) -> None:
        """Count one batch; `loss` is the batch's mean loss (as `cross_entropy` returns it)."""
        self.loss_sum += loss.detach() * len(labels)
        self.correct += (logits.argmax(dim=1) == labels).sum()  # argmax carries no gradient
        self.count += len(labels)

    def compute(self) -> dict[str, Tensor]:
        return {"loss": self.loss_sum / self.count, "acc": self.correct / self.count}
