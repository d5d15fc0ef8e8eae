"""The metric both paths count with: sample-weighted loss, accuracy, reset, and the sum over DDP processes."""

import os

import pytest
import torch
import torch.distributed as dist
from torch import nn

from project.example.metrics import ClassificationTotals
from tests.helpers import results_of_two_ranks


def batches(seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Three batches of unequal size (5, 3, 8), so a plain mean of batch means would differ from the true mean."""
    generator = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(size, 4, generator=generator), torch.randint(0, 4, (size,), generator=generator))
        for size in (5, 3, 8)
    ]


def expected(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[float, float]:
    logits = torch.cat([logits for logits, _ in parts])
    labels = torch.cat([labels for _, labels in parts])
    return nn.functional.cross_entropy(logits, labels).item(), (logits.argmax(dim=1) == labels).float().mean().item()


def count(metric: ClassificationTotals, parts: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    for logits, labels in parts:
        metric.update(logits, labels, nn.functional.cross_entropy(logits, labels))


def test_loss_is_the_per_sample_mean_and_accuracy_the_share_correct():
    metric = ClassificationTotals()
    count(metric, batches())
    result = metric.compute()
    loss, accuracy = expected(batches())
    assert result["loss"].item() == pytest.approx(loss, abs=1e-6)
    assert result["acc"].item() == pytest.approx(accuracy, abs=1e-7)
    assert metric.count.item() == 16


def test_reset_starts_a_new_epoch():
    metric = ClassificationTotals()
    count(metric, batches(seed=1))
    metric.compute()
    metric.reset()
    count(metric, batches(seed=2))
    assert metric.compute()["loss"].item() == pytest.approx(expected(batches(seed=2))[0], abs=1e-6)


def test_half_precision_modules_keep_exact_counts_and_a_float32_loss_sum():
    """Lightning's `bf16-true` casts the whole LightningModule with `.to(dtype)`; the states must not follow."""
    metric = ClassificationTotals().to(dtype=torch.bfloat16)
    assert (metric.loss_sum.dtype, metric.correct.dtype, metric.count.dtype) == (
        torch.float32,
        torch.int64,
        torch.int64,
    )
    count(metric, batches() * 400)  # 6400 samples: a bfloat16 count would already be off
    assert metric.count.item() == 6400
    metric.reset()
    assert metric.loss_sum.dtype == torch.float32


def count_on_rank(rank: int, port: int, results: dict) -> None:
    """Rank r counts every other batch, starting at r; `compute()` must cover both ranks' batches. Then rank 0
    alone computes a `sync_on_compute=False` metric, as the reference's evaluation does: it must not wait for
    rank 1."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        metric = ClassificationTotals()
        count(metric, batches()[rank::2])
        local = int(metric.count.item())
        values = metric.compute()
        results[rank] = (local, values["loss"].item(), values["acc"].item(), int(metric.count.item()))
        if rank == 0:
            alone = ClassificationTotals(sync_on_compute=False)
            count(alone, batches())
            results["rank 0 alone"] = alone.compute()["loss"].item()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_compute_sums_over_ddp_processes_on_every_rank():
    results = results_of_two_ranks(count_on_rank)
    loss, accuracy = expected(batches())
    assert results["rank 0 alone"] == pytest.approx(loss, abs=1e-6)
    assert (results[0][0], results[1][0]) == (13, 3), "each rank counted its own batches"
    for rank in (0, 1):
        _, rank_loss, rank_accuracy, local_after = results[rank]
        assert rank_loss == pytest.approx(loss, abs=1e-6)
        assert rank_accuracy == pytest.approx(accuracy, abs=1e-7)
        assert local_after == results[rank][0], "compute() leaves this rank's own totals for the next update"
