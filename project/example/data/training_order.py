"""Where a run stands in the training order: each process's share of a fresh seeded shuffle per epoch (the engine's
`SeededOrder`, which the classifier's data modules use as any data module's training loader gets it).

A checkpoint written part-way through an epoch (`project.optional.mid_epoch.checkpoint`) must resume with exactly the
batches an uninterrupted run would have trained next. The order depends on the seed, the epoch, the number of
processes and the data alone, so the position is two numbers, `epoch` and `batches_done`, saved beside the weights
(`TrainingPosition`), and `SeededOrder.start_part_way` starts the resumed epoch after them: both paths do this,
Lightning through the data module's `state_dict` (saved in every checkpoint, with the labels' checksum that tells two
data sets of one size apart), the reference loop by hand.

Why not the loader's own state (torchdata's `StatefulDataLoader`, which Lightning saves when the train loader has a
`state_dict`): Lightning fetches one batch ahead of the one it trains (`_PrefetchDataFetcher`), so a loader's count of
what it has handed out is one batch past what was trained when a checkpoint is written, and a resume would skip a
batch; the trained-batch count Lightning keeps (its batch progress) is the one that is right, and is what is saved.
"""

import zlib
from dataclasses import asdict, dataclass, fields

from torch import Tensor

from project.engine.checkpoints import WHAT_FIXES_THE_ORDER as ENGINES_ORDER
from project.engine.checkpoints import refuse_another_order
from project.engine.errors import UserError, quoted


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
        if self.batches_done:
            refuse_another_order(asdict(self), asdict(now), WHAT_FIXES_THE_ORDER)


# The fields that fix the order, as the user sets them: the engine's, and the labels' checksum.
WHAT_FIXES_THE_ORDER = ENGINES_ORDER | {"labels_checksum": "training labels' checksum"}
