"""The LightningModule: any classifier network, an optimizer from config, cross-entropy and accuracy.

The network arrives built (`project.example.networks`), the optimizer and the optional learning-rate schedule as
partials (`_partial_: true` in `conf/model/`), so swapping any of them is a config change. The loss and accuracy come
from `project.example.metrics.ClassificationTotals`, the metric the raw reference loop counts with too; it sums over
all processes when an epoch's numbers are computed, under every strategy.
"""

from collections.abc import Callable, Iterable
from pathlib import Path

import lightning as L
import torch
from torch import Tensor, nn

from project.engine.errors import UserError
from project.engine.schedules import build_schedule, check_resumable
from project.engine.trained_run import Outputs
from project.example.metrics import ClassificationTotals

STAGES = ("train", "val", "test")
OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
# A partial of any torch.optim.lr_scheduler class (project.engine.schedules builds it on the optimizer).
SchedulerFactory = Callable[..., torch.optim.lr_scheduler.LRScheduler]


def first_training_inputs(datamodule: L.LightningDataModule) -> Tensor:
    """The inputs of the data module's first training sample, which `on_fit_start` puts through the network; refused
    in one line where it holds no `train_set` of `(inputs, label)` samples, what the classifier asks of a data module
    beside its loaders (docs/your-code.md), which Lightning does not: a user's own may name its splits otherwise."""
    name = type(datamodule).__name__
    fix = (
        f"give {name} a train_set (its training samples, set in setup), or train a module of your own on it "
        "(model=<yours>); docs/your-code.md lists what the example classifier asks of a data module"
    )
    train_set = getattr(datamodule, "train_set", None)
    if train_set is None:
        raise UserError(
            f"the example classifier (ClassifierModule) reads its data module's train_set, a dataset of "
            f"(inputs, label) samples, and {name} has none after setup: {fix}"
        )
    try:
        sample = train_set[0]
    except (TypeError, IndexError, KeyError, NotImplementedError) as error:
        raise UserError(f"{name}.train_set[0] cannot be read ({type(error).__name__}: {error}): {fix}") from None
    if not (isinstance(sample, (tuple, list)) and len(sample) == 2 and isinstance(sample[0], Tensor)):
        raise UserError(
            f"{name}.train_set[0] is a {type(sample).__name__}, not an (inputs, label) pair of a tensor and its "
            f"class, which the example classifier trains on: {fix}"
        )
    return sample[0]


class ClassifierModule(L.LightningModule):
    """Trains `network` on `(inputs, labels)` batches and logs `{train,val,test}/{loss,acc}`."""

    def __init__(
        self,
        network: nn.Module,
        optimizer: OptimizerFactory,
        scheduler: SchedulerFactory | None = None,
    ) -> None:
        super().__init__()
        learning_rate = getattr(optimizer, "keywords", {}).get("lr")  # a partial's: torch checks it only when built
        if learning_rate is not None and not (isinstance(learning_rate, (int, float)) and learning_rate > 0):
            raise UserError(f"model.optimizer.lr must be a number > 0, got {learning_rate!r}")
        # No `save_hyperparameters()`: the entry point saves the whole Hydra config (which builds the network and
        # the partials) in every checkpoint (`project.engine.config`), and logs it to TensorBoard's HParams view.
        self.network = network
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        # The learning-rate schedule's state stored in the checkpoint being resumed, if any (`on_load_checkpoint`).
        self.resumed_schedule: dict | None = None
        # One loss-and-accuracy count per stage (submodules, so they follow the network to its device).
        for stage in STAGES:
            setattr(self, f"{stage}_totals", ClassificationTotals())

    def __setattr__(self, name: str, value: object) -> None:
        # Lightning sets `_current_fx_name` (a plain str) around every hook it calls, dozens of times per training
        # step, and nn.Module.__setattr__ first looks for a parameter, buffer or module of that name. Skipping that
        # search for this one name is worth it on small steps: docs/reference.md, the "plain __setattr__" row.
        if name == "_current_fx_name":
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    def on_fit_start(self) -> None:
        """Refuse a network that does not take the data's samples, or scores another number of classes, in one line.

        The first training sample goes through the network in eval mode without gradients: no random numbers are
        drawn and no statistics change, so the run's numbers stay what they would have been.
        """
        datamodule = self.trainer.datamodule
        if datamodule is None:  # loaders passed to fit directly: nothing to look at in advance
            return
        inputs = first_training_inputs(datamodule).unsqueeze(0).to(self.device)
        training = self.network.training
        self.network.eval()
        try:
            with torch.no_grad():
                scores = self.network(inputs).shape[-1]
        except RuntimeError as error:
            raise UserError(
                f"model.network does not take this data's samples (shape {tuple(inputs.shape[1:])}): "
                f"{' '.join(str(error).split())}; pick a model for the data (model=toy for data=toy, "
                "model=mnist_mlp for the MNIST family)"
            ) from None
        finally:
            self.network.train(training)
        names = getattr(datamodule, "class_names", ())  # a user's own data module may not name its classes
        if names and scores != len(names):
            raise UserError(
                f"model.network scores {scores} classes, the data has {len(names)} ({', '.join(names)}): "
                f"set model.network.num_classes={len(names)}"
            )

    def forward(self, inputs: Tensor) -> Tensor:
        return self.network(inputs)

    def _step(self, batch: tuple[Tensor, Tensor], stage: str) -> Tensor:
        inputs, labels = batch
        logits = self(inputs)
        loss = nn.functional.cross_entropy(logits, labels)
        # `update`, not a call: calling a metric also computes this batch's own value, which nothing reads.
        getattr(self, f"{stage}_totals").update(logits, labels, loss)
        return loss

    def _log_epoch_metrics(self, stage: str) -> None:
        """Log `<stage>/loss` and `<stage>/acc` of the whole epoch (all processes), then start counting afresh.

        Once per epoch, from the running totals: a `self.log` call per step would give the same numbers and add
        Lightning's per-call bookkeeping to every step (docs/reference.md measures it). `compute()` has already
        summed over processes, so `sync_dist` averages equal numbers: it changes nothing but tells Lightning the
        value is global (it warns otherwise under DDP).
        """
        totals = getattr(self, f"{stage}_totals")
        for name, value in totals.compute().items():
            self.log(f"{stage}/{name}", value, prog_bar=True, sync_dist=True)
        totals.reset()

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        loss = self._step(batch, "train")
        # This step's loss (this process's batch) and learning rate, logged only on the steps Lightning hands to
        # the loggers (`(step + 1) % trainer.log_every_n_steps == 0`): on the others they would reach no logger.
        if (self.global_step + 1) % self.trainer.log_every_n_steps == 0:
            self.log("train/step_loss", loss.detach(), on_step=True, on_epoch=False, prog_bar=True)
            self.log("train/lr", self.trainer.optimizers[0].param_groups[0]["lr"], on_step=True, on_epoch=False)
        return loss

    def on_train_epoch_end(self) -> None:
        # A run resumed from a checkpoint written as this epoch's training ended (SIGTERM during its validation)
        # trained none of it: there is nothing to report, on every rank alike.
        if self.train_totals.update_count:
            self._log_epoch_metrics("train")

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._step(batch, "val")

    def on_validation_epoch_end(self) -> None:
        self._log_epoch_metrics("val")

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._step(batch, "test")

    def on_test_epoch_end(self) -> None:
        self._log_epoch_metrics("test")

    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> tuple[Tensor, Tensor]:
        """(class probabilities, labels) of one batch: what `project.predict` writes and draws."""
        inputs, labels = batch
        return torch.softmax(self(inputs).float(), dim=1), labels

    def write_predictions(self, outputs: Outputs, datamodule: L.LightningDataModule, directory: Path) -> list[str]:
        """`project.predict`'s files of a classifier: every sample's prediction, a per-class table, the confusion
        matrix and, for images, the mistakes it was surest of (`project.example.predictions`); their names."""
        from project.example.predictions import write_class_predictions  # (matplotlib: imported to predict only)

        return write_class_predictions(outputs, datamodule, directory)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Remember the resumed run's schedule, for `configure_optimizers` to check that it fits this run.

        Lightning calls this before `configure_optimizers` when resuming (`Trainer._run` restores the module, then
        sets up the strategy, which builds the optimizers; only sharding strategies such as FSDP restore later).
        """
        self.resumed_schedule = (checkpoint.get("lr_schedulers") or [{}])[0]  # {}: the resumed run had none

    def configure_optimizers(self) -> torch.optim.Optimizer | dict:
        """The optimizer, and the schedule (if any) sized to the run (`project.engine.schedules`).

        `${run_steps:}` is Lightning's count of this process's optimizer steps over the whole fit (batches per epoch
        after any DistributedSampler, times `trainer.max_epochs`); the reference loop sizes and steps the schedule the
        same way, so both paths keep giving the same numbers. A resumed run gets the schedule
        stored in its checkpoint, so it must have been sized for this run: otherwise a `UserError`.
        """
        try:
            optimizer = self.optimizer_factory(self.parameters())
        except (TypeError, ValueError) as error:  # torch's optimizers check their arguments, e.g. a negative lr
            raise UserError(f"model.optimizer: {error}") from None
        schedule = None
        if self.scheduler_factory is not None:
            steps, epochs = self.trainer.estimated_stepping_batches, self.trainer.max_epochs
            schedule = build_schedule(self.scheduler_factory, optimizer, steps, epochs)
        check_resumable(self.resumed_schedule, schedule)
        if schedule is None:
            return optimizer
        return {"optimizer": optimizer, "lr_scheduler": schedule.lightning_config()}
