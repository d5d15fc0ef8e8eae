"""K-fold cross-validation's split: `data.folds=K data.fold=i` validates on fold i of the pooled training and
validation samples and trains on the other K-1 folds; the test set is never in a fold.

The folds are stratified by class and fixed by the data's seed: each class's samples, in a seeded random order, are
dealt round-robin to the folds (each class going on from the fold the previous one stopped at), so a class's count in
two folds differs by at most one, and so does the folds' size. `-m data.folds=5 'data.fold=range(5)'` then trains on
every split once, and the sweep ends with the summary over its folds (`project.engine.sweeps`).
"""

import torch
from torch import Tensor

from project.engine.errors import UserError


def check_fold_choice(folds: int | None, fold: int) -> None:
    """Refuse, in one line, a number of folds or a fold that cannot be (checked as the data module is built)."""
    if folds is None:
        if fold != 0:
            raise UserError(
                f"data.fold={fold} picks a fold, but data.folds is null (no cross-validation): give data.folds=K "
                "as well, e.g. data.folds=5 'data.fold=range(5)' under -m"
            )
        return
    if not isinstance(folds, int) or isinstance(folds, bool) or folds < 2:
        raise UserError(
            f"data.folds={folds!r}: k-fold cross-validation needs a whole number of folds >= 2 "
            "(data.folds=null trains on the usual training set)"
        )
    if not isinstance(fold, int) or isinstance(fold, bool) or not 0 <= fold < folds:
        raise UserError(f"data.fold={fold!r} is not one of the {folds} folds: give 0 <= data.fold < {folds}")


def fold_of_each_sample(targets: Tensor, folds: int, seed: int, class_names: tuple[str, ...]) -> Tensor:
    """The fold (0 to `folds`-1) of each sample whose label is in `targets`; a class with fewer samples than folds
    (one that some fold would not hold) is refused in one line."""
    outside = targets[(targets < 0) | (targets >= len(class_names))]
    if len(outside):
        raise UserError(
            f"data.folds: a label {int(outside[0])} is not one of the {len(class_names)} classes "
            f"({', '.join(class_names)}): the data module's labels must be 0 to {len(class_names) - 1}"
        )
    counts = torch.bincount(targets.long(), minlength=len(class_names))
    for label, count in enumerate(counts.tolist()):
        if 0 < count < folds:
            raise UserError(
                f"data.folds={folds} needs at least {folds} samples of each class to put one in every fold; class "
                f"{class_names[label]!r} has {count}: use data.folds <= {count}, or data.folds=null"
            )
    generator = torch.Generator().manual_seed(seed)
    fold_of = torch.full((len(targets),), -1, dtype=torch.long)
    start = 0
    for label in range(len(class_names)):
        members = torch.nonzero(targets == label).flatten()
        members = members[torch.randperm(len(members), generator=generator)]
        fold_of[members] = (start + torch.arange(len(members))) % folds
        start = (start + len(members)) % folds
    return fold_of


def fold_split(
    targets: Tensor, folds: int, fold: int, seed: int, class_names: tuple[str, ...]
) -> tuple[Tensor, Tensor]:
    """(training indices, validation indices) into the pooled samples whose labels are `targets`: fold `fold` is
    validation, the rest trains; each in the samples' own order."""
    fold_of = fold_of_each_sample(targets, folds, seed, class_names)
    return torch.nonzero(fold_of != fold).flatten(), torch.nonzero(fold_of == fold).flatten()
