"""Per-rank model state under DDP and under FSDP, 2 processes: the bytes each rank holds for the weights, their
gradients and the optimizer's state (Adam: two moments per weight), counted from those tensors (a sharded DTensor
counts its own shard): the gradients as the optimizer steps, the rest once training ends. The network is the
recipe's MLP made wide (2048 hidden features, about 10 million weights), so that the model state, not the data, is
what a rank holds; 3 training steps suffice, the state's size does not change with the step. This is the figure
`trainer=fsdp` exists for: under DDP every rank holds all of it, under FSDP 1/N.
"""

import json
import subprocess
import sys
from pathlib import Path

import lightning as L
import torch
from torch.distributed.tensor import DTensor

from bench.settings import Settings

REPO = Path(__file__).resolve().parents[1]
WIDE = ["model.network.num_hidden_features=2048"]
SHORT = [
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=3",
    "trainer.limit_val_batches=1",
    "trainer.limit_test_batches=1",
]


def local_bytes(tensor: torch.Tensor) -> int:
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.numel() * local.element_size()


class ModelStateBytes(L.Callback):
    """Writes `<out>/rank<N>.json`: this rank's bytes of weights, gradients and optimizer state as training ends."""

    def __init__(self, out: str) -> None:
        self.out = Path(out)
        self.gradients = 0

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        self.gradients = sum(local_bytes(p.grad) for p in pl_module.parameters() if p.grad is not None)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        parameters = list(pl_module.parameters())
        optimizer_state = [value for state in trainer.optimizers[0].state.values() for value in state.values()]
        held = {
            "weights": sum(local_bytes(p) for p in parameters),
            "gradients": self.gradients,
            "optimizer": sum(local_bytes(value) for value in optimizer_state if isinstance(value, torch.Tensor)),
        }
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(held))


def run(settings: Settings, recipe: list[str], scratch: Path) -> dict:
    per_rank = {}
    for strategy in ("ddp", "fsdp"):
        out = scratch / strategy
        probe = [f"+callbacks.model_state._target_={__name__}.ModelStateBytes", f"+callbacks.model_state.out={out}"]
        overrides = [*recipe, *WIDE, *SHORT, f"trainer={strategy}", "trainer.devices=2", "logger=none", *probe]
        command = [sys.executable, "-m", "project.train", *overrides, f"hydra.run.dir={out / 'run'}"]
        with (scratch / f"{strategy}.log").open("w") as log:
            if subprocess.run(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT).returncode != 0:
                raise RuntimeError(f"trainer={strategy} failed: {(scratch / f'{strategy}.log').read_text()[-500:]}")
        per_rank[strategy] = [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    return {"overrides": [*WIDE, *SHORT, "trainer.devices=2"], "bytes_per_rank": per_rank}
