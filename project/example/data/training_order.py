"""The training order: each process's share of a fresh seeded shuffle per epoch, and where a run stands in it.

A checkpoint written part-way through an epoch (`project.optional.mid_epoch.checkpoint`) must resume with exactly the
batches an uninterrupted run would have trained next. The order depends on the seed, the epoch, the number of
processes and the data alone, so the position is two numbers, `epoch` and `batches_done`, saved beside the weights
(`TrainingPosition`), and `EpochShuffleSampler.start_part_way` starts the resumed epoch after them: both paths do
this, Lightning through the data module's `state_dict` (saved in every checkpoint), the reference loop by hand.

Why not the loader's own state (torchdata's `StatefulDataLoader`, which Lightning saves when the train loader has a
`state_dict`): Lightning fetches one batch ahead of the one it trains (`_PrefetchDataFetcher`), so a loader's count of
what it has handed out is one batch past what was trained when a checkpoint is written, and a resume would skip a
batch; the trained-batch count Lightning keeps (its batch progress) is the one that is right, and is what is saved.
"""

import itertools
import zlib
from dataclasses import dataclass, fields

from torch import Tensor
from torch.utils.data import Dataset
from torch.utils.data.distributed import DistributedSampler

from project.engine.errors import UserError, quoted


class EpochShuffleSampler(DistributedSampler):
    """This process's share of a fresh random order each epoch, drawn from `seed + epoch` alone.

    The order depends on the epoch number only (not on a generator that advances as iterators are exhausted), so a
    loop that stops after the last batch (Lightning) and one that runs into `StopIteration` (a `for` loop) agree, and
    a resumed run sees the order it would have seen. With one process it is the global order that the ranks of a
    DDP run share out (rank r takes samples r, r + N, ...). Being a `DistributedSampler`, Lightning leaves it in place
    under DDP instead of putting its own there. Lightning and the reference loop call `set_epoch`.
    """

    def __init__(self, dataset: Dataset, seed: int, num_replicas: int = 1, rank: int = 0) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed)
        self.skip = 0  # samples of this epoch's share already trained (a resumed mid-epoch checkpoint)

    def start_part_way(self, epoch: int, samples_done: int) -> None:
        """Begin epoch `epoch` after the first `samples_done` samples of this process's share; later epochs whole.

        The length stays the whole share's: Lightning counts the batches already done towards the epoch's end.
        """
        self.epoch, self.skip = epoch, samples_done

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.skip = 0
        super().set_epoch(epoch)

    def __iter__(self):
        return itertools.islice(super().__iter__(), self.skip, None)


def labels_checksum(labels: Tensor) -> int:
    """A checksum of the training labels in their stored order: tells two datasets of the same size apart."""
    return zlib.crc32(labels.cpu().contiguous().numpy().tobytes())


@dataclass(frozen=True)
class TrainingPosition:
    """`batches_done` batches of epoch `epoch` trained, in the order the other fields fix.

    An epoch-end checkpoint is at (next epoch, 0): it can resume with any batch size or process count, as before.
    """

    epoch: int
    batches_done: int
    batch_size: int
    processes: int
    seed: int
    train_samples: int
    labels_checksum: int

    @classmethod
    def stored(cls, position: object) -> "TrainingPosition":
        """The position a checkpoint stored (`ClassificationDataModule.state_dict`), refused in one line where it is
        not one: a checkpoint is data, and may hold anything there."""
        names = [field.name for field in fields(cls)]
        if not isinstance(position, dict):
            problem = f"holds {quoted(position)}, not a position"
        elif unknown := [key for key in position if key not in names]:
            problem = f"has a key no position has, {quoted(unknown[0])}"
        elif missing := [name for name in names if name not in position]:
            problem = f"has no {missing[0]}"
        else:
            wrong = [name for name in names if type(position[name]) is not int or position[name] < 0]
            if not wrong:
                return cls(**position)
            problem = f"holds {wrong[0]}={quoted(position[wrong[0]])}, not a count"
        raise UserError(
            f"ckpt_path: the checkpoint's position in the training order (its data module's state) {problem}: it is "
            "not one this data module wrote; resume from a checkpoint project.train wrote, or train afresh (without "
            "ckpt_path)"
        )

    def check_resumable_as(self, now: "TrainingPosition") -> None:
        """Refuse, in one line, to resume this mid-epoch position in a run whose order differs (`now`).

        "Batch 40 of epoch 2" names other samples with another batch size, process count, seed or data, so the run
        would train some samples twice and others never: that is refused rather than resumed approximately.
        """
        if self.batches_done == 0:
            return
        changed = [
            f"{WHAT_FIXES_THE_ORDER[field.name]} {getattr(self, field.name)} (this run: {getattr(now, field.name)})"
            for field in fields(self)
            if field.name in WHAT_FIXES_THE_ORDER and getattr(self, field.name) != getattr(now, field.name)
        ]
        if changed:
            raise UserError(
                f"ckpt_path: the checkpoint stopped part-way through epoch {self.epoch} (after batch "
                f"{self.batches_done}) of a training order this run would not follow: its {'; its '.join(changed)}. "
                "Resume it with its own data, data.batch_size, seed and number of processes, or resume from an "
                "epoch-end checkpoint"
            )


# The fields that fix the order, as the user sets them.
WHAT_FIXES_THE_ORDER = {
    "batch_size": "data.batch_size",
    "processes": "processes (trainer.devices × trainer.num_nodes)",
    "seed": "seed",
    "train_samples": "training samples",
    "labels_checksum": "training labels' checksum",
}
