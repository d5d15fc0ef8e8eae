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

    full_state_update = False  # an update needs only its own batch: no recompute of the global state per step

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        for name in ("loss_sum", "correct", "count"):
            self.add_state(name, default=torch.tensor(0.0), dist_reduce_fx="sum")

    def update(self, logits: Tensor, labels: Tensor, loss: Tensor) -> None:
        """Count one batch; `loss` is the batch's mean loss (as `cross_entropy` returns it)."""
        self.loss_sum += loss.detach() * len(labels)
        self.correct += (logits.detach().argmax(dim=1) == labels).sum()
        self.count += len(labels)

    def compute(self) -> dict[str, Tensor]:
        return {"loss": self.loss_sum / self.count, "acc": self.correct / self.count}
