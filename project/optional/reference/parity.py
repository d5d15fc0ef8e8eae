"""How far apart a Lightning run and a reference run are: per-step losses, final weights, the results table.

`compare` prints these for a user's own config; the parity tests assert them. Each side is read from what
its run dir holds (results.json, rank 0's history, the final network weights), so any two finished runs compare.
"""

import json
import math
import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from project.engine.checkpoints import is_sharded, plain_checkpoint
from project.engine.errors import UserError
from project.engine.history import TrainingHistory

LIGHTNING_PREFIX = "network."  # where ClassifierModule keeps the network in a checkpoint's state_dict
RESULT_ROWS = ("train/loss", "train/acc", "val/loss", "val/acc", "test/loss", "test/acc")


def network_weights(lightning_state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The network's tensors of a Lightning `state_dict`, named as in the bare network's own `state_dict`."""
    return {k.removeprefix(LIGHTNING_PREFIX): v for k, v in lightning_state.items() if k.startswith(LIGHTNING_PREFIX)}


def max_weight_difference(lightning: dict[str, Tensor], reference: dict[str, Tensor]) -> float:
    """The largest absolute difference over all tensors (a NaN anywhere counts as an infinite one); networks with
    different tensors are not comparable."""
    if lightning.keys() != reference.keys():
        only_lightning, only_reference = lightning.keys() - reference.keys(), reference.keys() - lightning.keys()
        raise ValueError(
            f"the networks hold different tensors: only lightning has {sorted(only_lightning)}, "
            f"only reference has {sorted(only_reference)}"
        )
    differences = ((lightning[k].double() - reference[k].double()).abs() for k in lightning)
    return max((torch.nan_to_num(d, nan=math.inf).max().item() for d in differences if d.numel()), default=0.0)


def max_loss_difference(lightning: Sequence[float], reference: Sequence[float]) -> float:
    """The largest absolute per-step loss difference (a NaN on either side counts as an infinite one, so that two
    diverged runs never agree); runs of different lengths are not comparable."""
    if len(lightning) != len(reference):
        raise ValueError(f"lightning took {len(lightning)} steps, the reference {len(reference)}")
    return max((step_difference(a, b) for a, b in zip(lightning, reference, strict=True)), default=0.0)


def step_difference(first: float, second: float) -> float:
    if first == second:  # also two equal infinities
        return 0.0
    difference = abs(first - second)
    return math.inf if math.isnan(difference) else difference


def load_checkpoint(path: Path) -> dict:
    """`weights_only` where the file allows it; both files are this run's own, so the fallback is safe. A sharded
    checkpoint (trainer=fsdp) is assembled into whole tensors."""
    if is_sharded(path):
        return plain_checkpoint(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:  # a type outside weights_only's allow-list, e.g. from a custom callback's state
        return torch.load(path, map_location="cpu", weights_only=False)


def optimizer_steps(history: TrainingHistory, accumulate_grad_batches: int) -> int:
    """The optimizer steps of a fresh run whose history records every batch: one per `accumulate_grad_batches`
    batches of each epoch, and one for any left over at its end (every epoch has as many batches)."""
    epochs, batches = len(history.epoch_losses), len(history.step_losses)
    if accumulate_grad_batches == 1 or not epochs:
        return batches
    return epochs * math.ceil(batches // epochs / accumulate_grad_batches)


@dataclass
class RunOutputs:
    """What compare reads from one side's run dir: results.json, rank 0's history, the final network weights."""

    results: dict
    history: TrainingHistory
    weights: dict[str, Tensor]

    @classmethod
    def read_lightning(cls, run_dir: Path) -> "RunOutputs":
        """Refuses a last.ckpt older than the run's last step: its weights would not be the final ones."""
        history = TrainingHistory.load(run_dir / "history.rank0.json")
        checkpoint = load_checkpoint(run_dir / "checkpoints" / "last.ckpt")
        accumulate = checkpoint.get("config", {}).get("trainer", {}).get("accumulate_grad_batches") or 1
        final_step = optimizer_steps(history, accumulate)
        if checkpoint["global_step"] != final_step:
            raise UserError(
                f"{run_dir}/checkpoints/last.ckpt holds step {checkpoint['global_step']}, not the final step "
                f"{final_step}: Lightning >= 2.6 rewrites last.ckpt only when it also saves a top-k "
                "checkpoint; save every epoch's weights with a ModelCheckpoint(monitor=None) in conf/callbacks/"
            )
        results = json.loads((run_dir / "results.json").read_text())
        return cls(results, history, network_weights(checkpoint["state_dict"]))

    @classmethod
    def read_reference(cls, run_dir: Path) -> "RunOutputs":
        history = TrainingHistory.load(run_dir / "history.rank0.json")
        results = json.loads((run_dir / "results.json").read_text())
        return cls(results, history, load_checkpoint(run_dir / "checkpoints" / "model.pt"))


def comparison_rows(lightning: RunOutputs, reference: RunOutputs) -> dict[str, tuple[float, float]]:
    """The table's rows, name -> (lightning, reference): per-epoch training loss, final metrics, speed."""
    epoch_losses = zip(lightning.history.epoch_losses, reference.history.epoch_losses, strict=True)
    rows = {f"epoch {n} train loss": pair for n, pair in enumerate(epoch_losses, start=1)}
    # A metric neither side measured (no validation within trainer.check_val_every_n_epoch) has no row; one that a
    # single side measured is NaN on the other.
    measured = [name for name in RESULT_ROWS if name in lightning.results or name in reference.results]
    rows |= {name: (lightning.results.get(name, math.nan), reference.results.get(name, math.nan)) for name in measured}
    rows["wall time (s)"] = (lightning.results["fit_seconds"], reference.results["fit_seconds"])
    rows["samples/s"] = (lightning.results["samples_per_second"], reference.results["samples_per_second"])
    return rows
