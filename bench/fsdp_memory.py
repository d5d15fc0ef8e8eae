"""Per-rank memory and speed under DDP and under FSDP, 2 processes on the CPU (gloo). For each rank: the bytes of the
weights, their gradients and the optimizer's state (Adam: two moments per weight), counted from those tensors (a
sharded DTensor counts its own shard; the gradients as the optimizer steps, the rest once training ends); its peak
resident memory; and the samples per second of its training steps after a warm-up. Model state is what
`trainer=fsdp` exists for: under DDP every rank holds all of it, under FSDP 1/N, at the price of gathering each
layer's weights for every forward and backward.

The network is the recipe's MLP made wide: 4096 hidden features, 37 million weights, 562 MB of model state per rank
under DDP, so that the model state is a visible share of a rank's resident memory, most of which on the CPU is Python
and torch themselves. Wider would make each CPU step, and so the suite, much longer; 6 steps suffice (the state's
size does not change with the step), the last 4 timed. `--quick` checks the code on a narrow MLP, one step timed.
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import torch
from torch.distributed.tensor import DTensor

from bench.report import Row
from bench.settings import Settings

REPO = Path(__file__).resolve().parents[1]
WIDTH = {"full": 4096, "quick": 512}
WARM_UP_STEPS = 2
STEPS = {"full": 6, "quick": 3}  # warm-up included


def local_bytes(tensor: torch.Tensor) -> int:
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.numel() * local.element_size()


def peak_resident_bytes() -> int:
    """This process's peak resident memory: `VmHWM` of /proc/self/status, so Linux only.

    Not `ru_maxrss`: Linux keeps in it the peak of the process this one was forked from, across exec, and a rank
    is forked from a large Python (the bench's, or rank 0's). `VmHWM` belongs to the address space exec made.
    """
    status = Path("/proc/self/status")
    if not status.is_file():
        raise RuntimeError("fsdp_memory reads peak resident memory from /proc/self/status: it runs on Linux only")
    [line] = [line for line in status.read_text().splitlines() if line.startswith("VmHWM:")]
    return int(line.split()[1]) * 1024  # kB


class RankMeasurements(L.Callback):
    """Writes `<out>/rank<N>.json` as training ends: this rank's bytes of weights, gradients and optimizer state, its
    peak resident memory, and the samples per second of its training steps after the first `warm_up_steps`.

    A step is timed from batch start to batch end (forward, backward, the collectives and the optimizer step; not
    the loading of the batch).
    """

    def __init__(self, out: str, warm_up_steps: int) -> None:
        self.out = Path(out)
        self.warm_up_steps = warm_up_steps
        self.gradients = 0
        self.step_started = 0.0
        self.timed_samples = 0
        self.timed_seconds = 0.0

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        self.step_started = time.perf_counter()

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        self.gradients = sum(local_bytes(p.grad) for p in pl_module.parameters() if p.grad is not None)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int):
        seconds = time.perf_counter() - self.step_started
        if batch_idx >= self.warm_up_steps:
            self.timed_samples += len(batch[0])
            self.timed_seconds += seconds

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        parameters = list(pl_module.parameters())
        optimizer_state = [value for state in trainer.optimizers[0].state.values() for value in state.values()]
        held = {
            "weights": sum(local_bytes(p) for p in parameters),
            "gradients": self.gradients,
            "optimizer": sum(local_bytes(value) for value in optimizer_state if isinstance(value, torch.Tensor)),
            "peak_resident": peak_resident_bytes(),
        }
        speed = {"samples_per_second": self.timed_samples / self.timed_seconds}
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps({"bytes": held} | speed))


def run(settings: Settings, recipe: list[str], scratch: Path) -> dict:
    if settings.device != "cpu":
        raise RuntimeError("fsdp_memory measures 2 gloo processes on the CPU: run it with --device cpu")
    size = "quick" if settings.quick else "full"
    shape = [
        f"model.network.num_hidden_features={WIDTH[size]}",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "trainer.max_epochs=1",
        f"trainer.limit_train_batches={STEPS[size]}",
        "trainer.limit_val_batches=1",
        "trainer.limit_test_batches=1",
    ]
    bytes_per_rank, samples_per_second = {}, {}
    for strategy in ("ddp", "fsdp"):
        out = scratch / strategy
        probe = [
            f"+callbacks.rank_measurements._target_={__name__}.RankMeasurements",
            f"+callbacks.rank_measurements.out={out}",
            f"+callbacks.rank_measurements.warm_up_steps={WARM_UP_STEPS}",
        ]
        overrides = [*recipe, *shape, f"trainer={strategy}", "logger=none", *probe]
        command = [sys.executable, "-m", "project.train", *overrides, f"hydra.run.dir={out / 'run'}"]
        with (scratch / f"{strategy}.log").open("w") as log:
            if subprocess.run(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT).returncode != 0:
                raise RuntimeError(f"trainer={strategy} failed: {(scratch / f'{strategy}.log').read_text()[-500:]}")
        ranks = [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]
        bytes_per_rank[strategy] = [rank["bytes"] for rank in ranks]
        samples_per_second[strategy] = sum(rank["samples_per_second"] for rank in ranks)
    return {
        "overrides": shape,
        "width": WIDTH[size],
        "timed_steps": STEPS[size] - WARM_UP_STEPS,
        "bytes_per_rank": bytes_per_rank,
        "samples_per_second": samples_per_second,
    }


def rows(result: dict) -> list[Row]:
    mb = {
        strategy: [{part: n / 2**20 for part, n in rank.items()} for rank in ranks]
        for strategy, ranks in result["bytes_per_rank"].items()
    }
    width = result["width"]
    table = []
    for part in ("weights", "gradients", "optimizer"):
        ddp, sharded = (mb[strategy][0][part] for strategy in ("ddp", "fsdp"))
        note = f"rank 0, 2 processes, MLP 784-{width}-{width}-{width}-10; ddp {ddp:.1f} MB"
        table.append((f"fsdp / ddp: per-rank {part}", f"{sharded / ddp:.2f}", f"{sharded:.1f} MB; {note}"))
    peaks = {strategy: [rank["peak_resident"] for rank in ranks] for strategy, ranks in mb.items()}
    ddp, sharded = max(peaks["ddp"]), max(peaks["fsdp"])
    note = "ranks 0, 1: " + "; ".join(f"{s} {a:.0f}, {b:.0f} MB" for s, (a, b) in peaks.items()) + " (Linux VmHWM)"
    table.append(("fsdp / ddp: per-rank peak resident memory", f"{sharded / ddp:.2f}", note))
    rate = result["samples_per_second"]
    steps = f"2 ranks, steps timed after warm-up: {result['timed_steps']}"
    note = f"fsdp {rate['fsdp']:,.0f}, ddp {rate['ddp']:,.0f} samples/s; {steps}"
    table.append(("fsdp / ddp: training samples/s", f"{rate['fsdp'] / rate['ddp']:.2f}", note))
    return table
