"""The number of samples in a batch of any structure: a tensor, a tuple or list, a dict, a dataclass of them.

History and the results table count training samples with it (samples per second), for the classifier's
`(inputs, labels)` and a user's own batches alike.
"""

import dataclasses
from collections.abc import Iterator, Mapping, Sequence

from torch import Tensor


def batch_size_of(batch: object) -> int | None:
    """The first dimension shared by every tensor in `batch`, or None where there is none or they disagree."""
    sizes = set(first_dimensions(batch))
    return sizes.pop() if len(sizes) == 1 else None


def first_dimensions(batch: object) -> Iterator[int]:
    if isinstance(batch, Tensor):
        if batch.ndim > 0:
            yield batch.shape[0]
    elif isinstance(batch, Mapping):
        for value in batch.values():
            yield from first_dimensions(value)
    elif isinstance(batch, Sequence) and not isinstance(batch, (str, bytes)):
        for value in batch:
            yield from first_dimensions(value)
    elif dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        for field in dataclasses.fields(batch):
            yield from first_dimensions(getattr(batch, field.name))
