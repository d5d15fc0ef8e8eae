"""Per-rank memory and speed under DDP and under FSDP, 2 processes on the CPU (gloo). For each rank: the bytes of the
weights, their gradients and the optimizer's state (Adam: two moments per weight), counted from those tensors (a
sharded DTensor counts its own shard; the gradients as the optimizer steps, the rest once training ends); its peak
resident memory; and the samples per second of its training steps after a warm-up. Model state is what
`trainer=fsdp` exists for: under DDP every rank holds all of it, under FSDP 1/N, at the price of gathering each
layer's weights for every forward and backward.

Two models, each under `trainer=fsdp`'s default units:
- the recipe's MLP made wide: 4096 hidden features, 37 million weights, 562 MB of model state per rank under DDP, so
  that the model state is a visible share of a rank's resident memory, most of which on the CPU is Python and torch
  themselves;
- a GPT-style transformer as a user writes one (tests/optional/fsdp/transformer_modules.py, with its YAML files on
  the search path): 8 blocks of width 512, 25 million weights, each block an FSDP unit, on sequences of 64 tokens.
Bigger would make each CPU step, and so the suite, much longer; 6 steps suffice (the state's size does not change
with the step), the last 4 timed. `--quick` checks the code on narrow models, one step timed.
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
GPT_SHAPE = {"full": {"width": 512, "layers": 8}, "quick": {"width": 128, "layers": 2}}
GPT_LENGTH, GPT_BATCH = 64, 8  # tokens a sequence, sequences a batch on each rank
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


def gpt_overrides(size: str, steps: int) -> list[str]:
    """The transformer of tests/optional/fsdp/transformer_modules.py on its token data, `steps` batches a rank."""
    shape = GPT_SHAPE[size]
    conf = REPO / "tests" / "optional" / "fsdp" / "conf"
    return [
        f"hydra.searchpath=[file://{conf}]",
        "model=transformer",
        "data=tokens",
        f"+model.network.width={shape['width']}",
        f"+model.network.layers={shape['layers']}",
        f"+model.network.length={GPT_LENGTH}",
        f"data.length={GPT_LENGTH}",
        f"data.batch_size={GPT_BATCH}",
        f"data.train_sequences={2 * GPT_BATCH * steps}",
    ]


def measure(overrides: list[str], scratch: Path) -> dict:
    """Each rank's bytes under trainer=ddp and trainer=fsdp, both ranks' samples/s together, and each rank's losses
    step by step (the same global batches: the two should agree, as the tests check)."""
    bytes_per_rank, samples_per_second, losses = {}, {}, {}
    scratch.mkdir(parents=True, exist_ok=True)
    for strategy in ("ddp", "fsdp"):
        out = scratch / strategy
        probe = [
            f"+callbacks.rank_measurements._target_={__name__}.RankMeasurements",
            f"+callbacks.rank_measurements.out={out}",
            f"+callbacks.rank_measurements.warm_up_steps={WARM_UP_STEPS}",
        ]
        command = [
            *(sys.executable, "-m", "project.train", *overrides, f"trainer={strategy}", "logger=none", *probe),
            f"hydra.run.dir={out / 'run'}",
        ]
        with (scratch / f"{strategy}.log").open("w") as log:
            if subprocess.run(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT).returncode != 0:
                raise RuntimeError(f"trainer={strategy} failed: {(scratch / f'{strategy}.log').read_text()[-500:]}")
        ranks = [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]
        bytes_per_rank[strategy] = [rank["bytes"] for rank in ranks]
        samples_per_second[strategy] = sum(rank["samples_per_second"] for rank in ranks)
        losses[strategy] = [
            json.loads((out / "run" / f"history.rank{rank}.json").read_text())["step_losses"] for rank in (0, 1)
        ]
    gaps = [abs(a - b) for x, y in zip(losses["fsdp"], losses["ddp"], strict=True) for a, b in zip(x, y, strict=True)]
    return {
        "bytes_per_rank": bytes_per_rank,
        "samples_per_second": samples_per_second,
        "step_losses": losses,
        "largest_step_loss_gap": max(gaps),
    }


def run(settings: Settings, recipe: list[str], scratch: Path) -> dict:
    if settings.device != "cpu":
        raise RuntimeError("fsdp_memory measures 2 gloo processes on the CPU: run it with --device cpu")
    size = "quick" if settings.quick else "full"
    steps = [
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "trainer.max_epochs=1",
        f"trainer.limit_train_batches={STEPS[size]}",
        "trainer.limit_val_batches=1",
        "trainer.limit_test_batches=1",
    ]
    shape = [f"model.network.num_hidden_features={WIDTH[size]}", *steps]
    gpt = gpt_overrides(size, STEPS[size])
    return {
        "overrides": shape,
        "width": WIDTH[size],
        "timed_steps": STEPS[size] - WARM_UP_STEPS,
        **measure([*recipe, *shape], scratch / "mlp"),
        "transformer": {"overrides": gpt, **GPT_SHAPE[size], **measure([*gpt, *steps], scratch / "transformer")},
    }


def rows(result: dict) -> list[Row]:
    width, gpt = result["width"], result["transformer"]
    steps = result["timed_steps"]
    return [
        *model_rows(result, "", f"MLP 784-{width}-{width}-{width}-10", steps),
        *model_rows(gpt, " (GPT)", f"GPT of {gpt['layers']} blocks, width {gpt['width']}", steps),
    ]


def model_rows(measured: dict, label: str, model: str, timed_steps: int) -> list[Row]:
    """The table's rows for one model: fsdp against ddp, per-rank model state, peak memory and speed."""
    mb = {
        strategy: [{part: n / 2**20 for part, n in rank.items()} for rank in ranks]
        for strategy, ranks in measured["bytes_per_rank"].items()
    }
    table = []
    for part in ("weights", "gradients", "optimizer"):
        ddp, sharded = (mb[strategy][0][part] for strategy in ("ddp", "fsdp"))
        note = f"rank 0, 2 processes, {model}; ddp {ddp:.1f} MB"
        table.append((f"fsdp / ddp{label}: per-rank {part}", f"{sharded / ddp:.2f}", f"{sharded:.1f} MB; {note}"))
    peaks = {strategy: [rank["peak_resident"] for rank in ranks] for strategy, ranks in mb.items()}
    ddp, sharded = max(peaks["ddp"]), max(peaks["fsdp"])
    note = "ranks 0, 1: " + "; ".join(f"{s} {a:.0f}, {b:.0f} MB" for s, (a, b) in peaks.items()) + " (Linux VmHWM)"
    table.append((f"fsdp / ddp{label}: per-rank peak resident memory", f"{sharded / ddp:.2f}", note))
    rate = measured["samples_per_second"]
    timed = f"2 ranks, steps timed after warm-up: {timed_steps}"
    note = f"fsdp {rate['fsdp']:,.0f}, ddp {rate['ddp']:,.0f} samples/s; {timed}"
    table.append((f"fsdp / ddp{label}: training samples/s", f"{rate['fsdp'] / rate['ddp']:.2f}", note))
    steps = len(measured["step_losses"]["ddp"][0])
    gap = f"{measured['largest_step_loss_gap']:.1e}"
    table.append((f"fsdp - ddp{label}: largest step loss gap", gap, f"float32, {steps} steps on each of 2 ranks"))
    return table
