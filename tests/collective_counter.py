"""Test-only callback: the collectives each rank issues between two training steps of one epoch, by process group.

It wraps the methods of torch's `ProcessGroup` through which every Python-issued collective goes (`dist.all_reduce`,
`dist.broadcast`, FSDP2's all-gathers and reduce-scatters, ...). DDP's gradient all-reduce is issued by its C++
reducer, beside these, so it is not counted: under DDP the count of the training group is what Lightning and the
project add per step.
"""

import json
from collections import Counter
from pathlib import Path

import lightning as L
import torch.distributed as dist

COLLECTIVES = [
    name
    for name in dir(dist.ProcessGroup)
    if not name.startswith("__")
    and any(word in name for word in ("all", "broadcast", "reduce", "barrier", "scatter", "gather", "send", "recv"))
]


class CollectivesPerStep(L.Callback):
    """Writes `<run_dir>/collectives.rank<N>.json`: for each step after an epoch's first, {group: {method: count}}.

    The groups: `training` (the default group, and FSDP's data-parallel mesh group), `agreement` (the strategy's
    SIGTERM agreement group) and `other`.
    """

    def __init__(self, run_dir: str) -> None:
        self.run_dir = Path(run_dir)
        self.steps: list[dict[str, Counter]] = []
        self.current: dict[str, Counter] | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        for name in COLLECTIVES:
            original = getattr(dist.ProcessGroup, name)

            def counted(group, *args, _original=original, _name=name, **kwargs):
                if self.current is not None:
                    self.current.setdefault(self.label(trainer, group), Counter())[_name] += 1
                return _original(group, *args, **kwargs)

            setattr(dist.ProcessGroup, name, counted)

    @staticmethod
    def label(trainer: L.Trainer, group: dist.ProcessGroup) -> str:
        strategy = trainer.strategy
        training = [dist.group.WORLD]
        if hasattr(strategy, "device_mesh"):
            training.append(strategy.device_mesh["data_parallel"].get_group())
        if any(group is other for other in training):
            return "training"
        agreement = getattr(strategy, "sigterm_agreement", None)
        return "agreement" if agreement is not None and group is agreement.group else "other"

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.current is not None and batch_idx > 0:
            self.steps.append({group: dict(counts) for group, counts in self.current.items()})
        self.current = {}

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.current = None  # what runs between epochs (validation, checkpoints) is not a step's

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        path = self.run_dir / f"collectives.rank{trainer.global_rank}.json"
        path.write_text(json.dumps(self.steps))


def count_collectives(run_dir: Path) -> list[str]:
    """The overrides that add `CollectivesPerStep` to a run writing into `run_dir`."""
    return [
        "+callbacks.count._target_=tests.collective_counter.CollectivesPerStep",
        f"+callbacks.count.run_dir={run_dir}",
    ]
