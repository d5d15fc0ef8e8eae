"""Modules and data modules a user might bring, none of them the template's classifier: the tests run them through
the project's entry points (with `PYTHONPATH` at the repository) to prove the machinery assumes nothing of them.

- `RegressionModule` on `RegressionData`: `(inputs, targets)` float batches, its own `configure_optimizers`, its own
  metric names (`train/mse`, `val/mse`, `test/mse`, to be minimised), and a `predict_step` returning a tensor.
- `SelfShardingRegression`: the same, sharding itself for trainer=fsdp in `configure_model`.
- `DictBatchModule` on `DictBatchData`: batches that are dicts, and metrics without a `<stage>/` prefix.
- `PairForwardModule`: a regression whose `forward` takes inputs and targets apart, and that has no `predict_step`.
- `WikiTextData`: Lightning's demo dataset `WikiText2` from a local file, for its `LightningTransformer`.
Lightning's own `BoringModel` and `BoringDataModule` (which log no metric at all) and its `LightningTransformer` are
used as they are (tests/foreign_conf/).
"""

import random
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.demos.transformer import WikiText2
from torch import Tensor, nn
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset, WeightedRandomSampler

# Their YAML files (model/, data/, hparams_search/), to put on Hydra's search path.
FOREIGN_CONF = Path(__file__).parent / "foreign_conf"


def line_points(count: int, generator: torch.Generator) -> TensorDataset:
    """Points on y = 3x + 1 with a little noise."""
    inputs = torch.rand(count, 1, generator=generator) * 2 - 1
    return TensorDataset(inputs, 3 * inputs + 1 + 0.05 * torch.randn(count, 1, generator=generator))


class RegressionData(L.LightningDataModule):
    """`nan_at`: the index of a training point whose input is NaN (data gone bad), if any; `num_workers`: the
    training loader's worker processes; `weighted`: draw the training points with a sampler of its own (torch's
    `WeightedRandomSampler`, with replacement), whose place in an epoch the engine cannot keep."""

    def __init__(
        self,
        batch_size: int = 8,
        seed: int = 0,
        nan_at: int | None = None,
        num_workers: int = 0,
        weighted: bool = False,
    ) -> None:
        super().__init__()
        self.batch_size, self.seed, self.nan_at, self.num_workers = batch_size, seed, nan_at, num_workers
        self.weighted = weighted

    def setup(self, stage: str) -> None:
        generator = torch.Generator().manual_seed(self.seed)
        self.splits = {
            split: line_points(count, generator) for split, count in (("train", 48), ("val", 16), ("test", 16))
        }
        if self.nan_at is not None:
            self.splits["train"].tensors[0][self.nan_at] = float("nan")

    def train_dataloader(self) -> DataLoader:
        points = self.splits["train"]
        sampler = WeightedRandomSampler(torch.ones(len(points)), len(points)) if self.weighted else None
        return DataLoader(
            points,
            batch_size=self.batch_size,
            shuffle=None if self.weighted else True,
            sampler=sampler,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.splits["val"], batch_size=self.batch_size)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.splits["test"], batch_size=self.batch_size)

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(self.splits["test"], batch_size=self.batch_size)


class RegressionModule(L.LightningModule):
    """`scratch_elements`: floats each training step allocates beside its activations (a model too big for memory);
    `one_cycle`: a one-cycle schedule of its own, sized to the run."""

    def __init__(self, hidden: int = 8, lr: float = 0.05, scratch_elements: int = 0, one_cycle: bool = False) -> None:
        super().__init__()
        self.lr, self.scratch_elements, self.one_cycle = lr, scratch_elements, one_cycle
        self.layers = nn.Sequential(nn.Linear(1, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def _mse(self, batch: tuple[Tensor, Tensor], stage: str) -> Tensor:
        inputs, targets = batch
        loss = nn.functional.mse_loss(self.layers(inputs), targets)
        self.log(f"{stage}/mse", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        if self.scratch_elements:
            torch.empty(self.scratch_elements)
        return self._mse(batch, "train")

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._mse(batch, "val")

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._mse(batch, "test")

    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return self.layers(batch[0])

    def configure_optimizers(self) -> torch.optim.Optimizer | dict:
        optimizer = torch.optim.Adam(self.parameters(), lr=self.lr)
        if not self.one_cycle:
            return optimizer
        # Sized from the run, as Lightning's docs show: a resumed run gets the checkpoint's length back.
        total = self.trainer.estimated_stepping_batches
        schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=self.lr, total_steps=total)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


class PairForwardModule(RegressionModule):
    """`forward(inputs, targets)`, the loss, and no `predict_step` of its own: Lightning's default one, which calls
    `forward(batch)`, cannot call it."""

    predict_step = L.LightningModule.predict_step

    def forward(self, inputs: Tensor, targets: Tensor) -> Tensor:
        return nn.functional.mse_loss(self.layers(inputs), targets)


class SelfShardingRegression(RegressionModule):
    """`RegressionModule` sharding itself in `configure_model`, as Lightning documents for FSDP2: its network one
    FSDP unit as a whole. It fails its run if it finds other units as training starts (trainer=fsdp sharding each
    layer besides)."""

    def configure_model(self) -> None:
        if self.device_mesh is not None and not isinstance(self.layers, FSDPModule):
            fully_shard(self.layers, mesh=self.device_mesh["data_parallel"])

    def on_train_start(self) -> None:
        units = [name for name, module in self.named_modules() if isinstance(module, FSDPModule)]
        if units != ["layers"]:
            raise RuntimeError(f"FSDP units {units}, not the one configure_model made")


class PointsAsDicts(Dataset):
    """Three clusters of 2-D points, each sample `{"features": [2], "target": class}`."""

    def __init__(self, count: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.targets = torch.arange(count) % 3
        centres = torch.tensor([[0.0, 2.0], [2.0, -1.0], [-2.0, -1.0]])
        self.features = centres[self.targets] + 0.3 * torch.randn(count, 2, generator=generator)

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        return {"features": self.features[index], "target": self.targets[index]}


class DictBatchData(L.LightningDataModule):
    def __init__(self, batch_size: int = 6) -> None:
        super().__init__()
        self.batch_size = batch_size

    def train_dataloader(self) -> DataLoader:
        return DataLoader(PointsAsDicts(36, seed=1), batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(PointsAsDicts(12, seed=2), batch_size=self.batch_size)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(PointsAsDicts(12, seed=3), batch_size=self.batch_size)


class DictBatchModule(L.LightningModule):
    def __init__(self, lr: float = 0.1) -> None:
        super().__init__()
        self.lr = lr
        self.linear = nn.Linear(2, 3)

    def _loss(self, batch: dict[str, Tensor], prefix: str) -> Tensor:
        logits = self.linear(batch["features"])
        loss = nn.functional.cross_entropy(logits, batch["target"])
        hits = (logits.argmax(dim=1) == batch["target"]).float().mean()
        self.log_dict({f"{prefix}_loss": loss, f"{prefix}_hits": hits}, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        return self._loss(batch, "fit")

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._loss(batch, "holdout")

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._loss(batch, "final")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def write_wikitext(directory: Path) -> None:
    """data/wikitext-2.txt, as WikiTextData reads it, in WikiText-2's format, 24 lines of 7 words of 16: 192 tokens
    with the end-of-line ones, which WikiText2 cuts into 11 blocks of 16 (8 to train, 3 to predict)."""
    words = [f"word{number}" for number in range(16)]
    pick = random.Random(0).choice
    lines = [" ".join(pick(words) for _ in range(7)) for _ in range(24)]
    (directory / "data").mkdir()
    (directory / "data" / "wikitext-2.txt").write_text("\n".join(lines) + "\n")


class WikiTextData(L.LightningDataModule):
    """Lightning's `WikiText2` read from `<data_dir>/wikitext-2.txt`, never downloaded (the tests write a small file
    in its format): blocks of `block_size` tokens, each with the block one token on as its target. The first three
    quarters train; the rest is predicted. Its `LightningTransformer` has no validation or test step, so the data
    serves neither."""

    def __init__(self, data_dir: str = "data", block_size: int = 16, batch_size: int = 2) -> None:
        super().__init__()
        self.data_dir, self.block_size, self.batch_size = Path(data_dir), block_size, batch_size

    def setup(self, stage: str) -> None:
        blocks = WikiText2(self.data_dir, self.block_size, download=False)
        cut = len(blocks) * 3 // 4
        self.train_set, self.predict_set = Subset(blocks, range(cut)), Subset(blocks, range(cut, len(blocks)))

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(self.predict_set, batch_size=self.batch_size)
