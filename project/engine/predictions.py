"""What any module's `predict_step` returns, gathered into one tensor per output and written as files.

`predict_step` may return a tensor, a tuple or list of tensors, or a dict of them, per batch; here each output is
named (`output`; `0`, `1`, ...; the dict's keys) and its batches are joined along the first dimension, so every
output has one row per sample of the split. `predictions.pt` holds them all; `predictions.csv` one row per sample
where every output is 1-D or 2-D (a column per value).
"""

import csv
from pathlib import Path

import torch
from torch import Tensor

from project.engine.errors import UserError

Outputs = dict[str, Tensor]


def named(batch_output: object) -> Outputs:
    """One batch's outputs by name."""
    if isinstance(batch_output, Tensor):
        outputs = {"output": batch_output}
    elif isinstance(batch_output, dict):
        outputs = {str(key): value for key, value in batch_output.items()}
    elif isinstance(batch_output, (tuple, list)):
        outputs = {str(index): value for index, value in enumerate(batch_output)}
    else:
        outputs = {"output": batch_output}
    for name, value in outputs.items():
        if not (isinstance(value, Tensor) and value.ndim > 0):
            raise UserError(
                f"predict_step returned {type(value).__name__} as its output {name!r}: project.predict writes "
                "tensors with a row per sample (a tensor, or a tuple, list or dict of them)"
            )
    return outputs


def joined(batches: list[object]) -> Outputs:
    """Every batch's outputs, joined along the samples."""
    per_batch = [named(batch) for batch in batches]
    if not per_batch:
        return {}
    return {name: torch.cat([outputs[name].detach().cpu() for outputs in per_batch]) for name in per_batch[0]}


def interleave(shares: list[Outputs]) -> Outputs:
    """The ranks' shares back in the split's order: rank r holds samples r, r + N, r + 2N, ..."""
    ranks = len(shares)
    result = {}
    for name, first in shares[0].items():
        total = sum(len(share[name]) for share in shares)
        joined_output = torch.empty((total, *first.shape[1:]), dtype=first.dtype)
        for rank, share in enumerate(shares):
            joined_output[rank::ranks] = share[name]
        result[name] = joined_output
    return result


def write_table(outputs: Outputs, path: Path) -> bool:
    """One CSV row per sample (`index`, then a column per value) where every output is 1-D or 2-D; whether it did."""
    if not outputs or any(output.ndim > 2 for output in outputs.values()):
        return False
    columns: list[str] = []
    values: list[Tensor] = []
    for name, output in outputs.items():
        matrix = output.reshape(len(output), -1)
        columns += [name] if matrix.shape[1] == 1 else [f"{name}_{index}" for index in range(matrix.shape[1])]
        values.append(matrix)
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["index", *columns])
        rows = zip(*(matrix.tolist() for matrix in values), strict=True)
        for index, parts in enumerate(rows):
            writer.writerow([index, *(value for part in parts for value in part)])
    return True
