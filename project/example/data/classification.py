"""The LightningDataModule base both kinds of data share: the seeded training order, resumable mid-epoch, and a check
that a checkpoint's classes are the data's. Subclasses load the splits (`setup`) and say how
batches are made (`loader`): in memory (`project.example.data.in_memory`), or from disk (an image folder's).
"""

from dataclasses import asdict

import lightning as L
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler

from project.engine.checkpoints import SeededOrder
from project.engine.errors import UserError, quoted
from project.example.data.folds import check_fold_choice, fold_split
from project.example.data.training_order import TrainingPosition, labels_checksum


class ClassificationDataModule(L.LightningDataModule):
    """Serves `train_set`, `val_set` and `test_set` (set by a subclass's `setup`, each with a `targets` tensor of
    labels) in batches, through the subclass's `loader`.

    The training order comes from `seed` and the epoch (`SeededOrder`), not from the global RNG, so the
    Lightning path and the reference path see the same batches whatever else consumed random numbers. Where training
    stands in it is saved in every checkpoint (`state_dict`), so a mid-epoch checkpoint resumes at the next batch.
    Validation and test count every sample exactly once under every strategy: the engine shares them out
    (`project.engine.ddp.evaluated_once`).

    `folds` (None: off) and `fold` choose k-fold cross-validation's split: a subclass's `setup` pools its training and
    validation samples and takes fold `fold` of them to validate on (`fold_indices`), the other folds to train on.
    """

    train_set: Dataset
    val_set: Dataset
    test_set: Dataset
    # The training sampler: an `SeededOrder` (a subclass may hand its dataset more than the index).
    train_sampler_class = SeededOrder
    # Each class's name, by label.
    class_names: tuple[str, ...]

    def __init__(
        self, batch_size: int, seed: int, drop_last: bool = False, folds: int | None = None, fold: int = 0
    ) -> None:
        super().__init__()
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise UserError(f"data.batch_size must be a positive integer, got {batch_size!r}")
        check_fold_choice(folds, fold)
        self.batch_size = batch_size
        self.seed = seed
        self.drop_last = drop_last
        self.folds, self.fold = folds, fold
        self.predict_split = "test"
        # Where a resumed checkpoint left the training order (`load_state_dict`); None: from the start.
        self.resume_at: TrainingPosition | None = None
        # The class names of the checkpoint these data are given to (`load_state_dict`); None: not known.
        self.trained_class_names: list[str] | None = None

    def loader(self, dataset: Dataset, sampler: Sampler | None = None, train: bool = False) -> DataLoader:
        """A loader over `dataset`; `train` drops the last partial batch when configured to (`data.drop_last`)."""
        raise NotImplementedError  # each kind of data loads its own way (in memory, from disk)

    def fold_indices(self, pooled_targets: Tensor) -> tuple[Tensor, Tensor]:
        """(training indices, validation indices) into the pooled training and validation samples whose labels are
        `pooled_targets`: fold `fold` of `folds` validates, stratified by class and fixed by `seed`
        (`project.example.data.folds`)."""
        return fold_split(pooled_targets, self.folds, self.fold, self.seed, tuple(self.class_names))

    def processes(self) -> tuple[int, int]:
        """(processes sharing each epoch, this one's rank): (1, 0) alone, under `dp` and on the reference path."""
        share = self.trainer.distributed_sampler_kwargs if self.trainer is not None else None
        return (share["num_replicas"], share["rank"]) if share else (1, 0)

    def train_dataloader(self) -> DataLoader:
        """This process's training batches in the seeded order, from where a resumed checkpoint left it.

        Refused when `drop_last` would leave no batch at all, and where a resumed checkpoint stopped part-way through
        an epoch of another order.
        """
        self.check_classes()
        processes, rank = self.processes()
        samples = -(-len(self.train_set) // processes)  # each process's share, as DistributedSampler pads it
        if self.drop_last and samples < self.batch_size:
            raise UserError(
                f"data.batch_size={self.batch_size} is more than the {samples} training samples each of the "
                f"{processes} process(es) gets, and data.drop_last=true drops that incomplete batch, so no training "
                f"step would run: use data.batch_size <= {samples} (or data.drop_last=false)"
            )
        sampler = self.train_sampler_class(self.train_set, self.seed, processes, rank)
        if self.resume_at is not None:
            saved = self.resume_at
            saved.check_resumable_as(self.position(saved.epoch, saved.batches_done, processes))
            sampler.start_part_way(saved.epoch, saved.batches_done * self.batch_size)
        return self.loader(self.train_set, sampler, train=True)

    def position(self, epoch: int, batches_done: int, processes: int) -> TrainingPosition:
        """`batches_done` batches of epoch `epoch` trained by each of `processes` processes, in this data's order."""
        return TrainingPosition(
            epoch,
            batches_done,
            self.batch_size,
            processes,
            self.seed,
            len(self.train_set),
            labels_checksum(self.train_set.targets),
        )

    def state_dict(self) -> dict:
        """What every checkpoint keeps of the data (Lightning saves it): the names of its classes, which data given to
        the checkpoint later must have, in the same order (labels are positions in that list); and, while fitting,
        where training stands in its order: Lightning's count of the batches trained in this epoch, not the loader's
        (it fetches one batch ahead)."""
        state = {"class_names": [str(name) for name in self.class_names]} if getattr(self, "class_names", ()) else {}
        trainer = self.trainer
        if trainer is None or not hasattr(self, "train_set"):
            return state
        epoch, done = trainer.current_epoch, trainer.fit_loop.epoch_loop.batch_progress.current.processed
        if done >= trainer.num_training_batches:  # the epoch is over: the next one starts from its beginning
            epoch, done = epoch + 1, 0
        return state | {"position": asdict(self.position(epoch, done, self.processes()[0]))}

    def load_state_dict(self, state: dict) -> None:
        """Take a checkpoint's class names, and the training order's position to resume from (both checked as the
        loaders are made: data of other classes, or a mid-epoch position in another order, is refused); a state that
        is not one this class wrote is refused in one line."""
        names = state.get("class_names") if isinstance(state, dict) else None
        if not isinstance(state, dict) or not (
            names is None or (isinstance(names, list) and all(isinstance(name, str) for name in names))
        ):
            raise UserError(
                f"ckpt_path: the checkpoint's state of {type(self).__name__} is not one it wrote (its class_names hold "
                f"{quoted(names if isinstance(state, dict) else state)}): resume from a checkpoint "
                "project.train wrote, or train afresh (without ckpt_path)"
            )
        self.trained_class_names = names
        position = state.get("position")
        self.resume_at = TrainingPosition.stored(position) if position else None

    def check_classes(self) -> None:
        """Refuse, before the first batch, data of other classes than the checkpoint it is given to was trained on:
        labels are positions in that list, so a folder with other, fewer or renamed classes would be scored against
        the wrong names, and the accuracy would be silently wrong."""
        names = [str(name) for name in getattr(self, "class_names", ())]
        if self.trained_class_names and names and names != self.trained_class_names:
            raise UserError(
                f"the data has the classes {names}, but the checkpoint was trained on {self.trained_class_names} "
                "(labels are positions in that list): give data with the same classes"
            )

    def evaluation_loader(self, dataset: Dataset) -> DataLoader:
        """A loader over all of `dataset`, in order. Under a multi-process Trainer the engine gives each process its
        share with no sample twice (`project.engine.ddp.evaluated_once`), as it does any data module's."""
        self.check_classes()
        return self.loader(dataset)

    def val_dataloader(self) -> DataLoader:
        return self.evaluation_loader(self.val_set)

    def test_dataloader(self) -> DataLoader:
        return self.evaluation_loader(self.test_set)

    def predict_dataloader(self) -> DataLoader:
        """The split named by `predict_split` (`project.predict`'s `split=`), every sample once, in order."""
        return self.evaluation_loader(getattr(self, f"{self.predict_split}_set"))
