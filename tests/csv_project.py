"""A project as a researcher brings it to the template (issue 54's user): written the plain way, with no helper of the
template, and run through the project's entry points (with `PYTHONPATH` at the repository, its YAML files in
tests/foreign_conf/).

- `CsvImageData`: PNG files listed in a `labels.csv` (`file,label`, labels by name), split by a seeded
  `random_split`, served by plain `DataLoader`s, the training one with `shuffle=True`; no `state_dict`.
- `BackboneClassifier`: a small backbone whose constructor loads pretrained weights from a file (a `.pth` a user
  points to), and a linear head; it logs `train/loss`, `val/loss`, `val/acc`, `test/loss`, `test/acc`.

`write_png_dataset` and `write_backbone` make the files these read, as a test needs them.
"""

import csv
from pathlib import Path

import lightning as L
import numpy as np
import torch
from PIL import Image
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, random_split

SIDE = 8  # images are SIDE × SIDE, grey


def write_png_dataset(root: Path, count: int, classes: tuple[str, ...] = ("circle", "stripe", "dot"), seed: int = 0):
    """`count` PNGs and their `labels.csv` in `root`: class k's images are bright in band k of the image, over noise,
    so a small network learns them in a few epochs. Returns `root`."""
    root.mkdir(parents=True, exist_ok=True)
    generator = np.random.default_rng(seed)
    band = SIDE // len(classes)
    with open(root / "labels.csv", "w", newline="") as labels:
        writer = csv.writer(labels)
        writer.writerow(["file", "label"])
        for index in range(count):
            label = index % len(classes)
            pixels = generator.integers(0, 96, size=(SIDE, SIDE), dtype=np.uint8)
            pixels[label * band : (label + 1) * band] += 40
            name = f"{index:04d}.png"
            Image.fromarray(pixels, mode="L").save(root / name)
            writer.writerow([name, classes[label]])
    return root


def write_backbone(path: Path, seed: int = 7) -> Path:
    """A "pretrained" backbone's weights (`torch.save` of its `state_dict`), as a user's `.pth` would be."""
    torch.manual_seed(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(backbone().state_dict(), path)
    return path


class PngFiles(Dataset):
    """(image, label) pairs read from `root` as `labels.csv` lists them; `classes` are the labels' names, sorted."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        with open(self.root / "labels.csv", newline="") as labels:
            self.rows = [(row["file"], row["label"]) for row in csv.DictReader(labels)]
        self.classes = sorted({label for _, label in self.rows})

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        name, label = self.rows[index]
        pixels = np.asarray(Image.open(self.root / name), dtype=np.float32) / 255.0
        return torch.from_numpy(pixels).unsqueeze(0), self.classes.index(label)


class CsvImageData(L.LightningDataModule):
    """Images from a CSV: `val_fraction` of them validate, as many test, the rest train (split by `seed`)."""

    def __init__(self, root: str, batch_size: int = 8, seed: int = 0, val_fraction: float = 0.25) -> None:
        super().__init__()
        self.root, self.batch_size, self.seed, self.val_fraction = root, batch_size, seed, val_fraction

    def setup(self, stage: str) -> None:
        files = PngFiles(self.root)
        self.classes = files.classes
        held_out = int(len(files) * self.val_fraction)
        sizes = [len(files) - 2 * held_out, held_out, held_out]
        generator = torch.Generator().manual_seed(self.seed)
        self.train_set, self.val_set, self.test_set = random_split(files, sizes, generator=generator)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.batch_size)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.test_set, batch_size=self.batch_size)

    def predict_dataloader(self) -> DataLoader:
        return self.test_dataloader()


def backbone() -> nn.Sequential:
    return nn.Sequential(nn.Flatten(), nn.Linear(SIDE * SIDE, 16), nn.ReLU())


class BackboneClassifier(L.LightningModule):
    """A pretrained backbone (`backbone_weights`: a file its constructor reads; None: random) and a head of
    `num_classes`; plain SGD at `lr`."""

    def __init__(self, num_classes: int = 3, lr: float = 0.2, backbone_weights: str | None = None) -> None:
        super().__init__()
        self.lr = lr
        self.backbone = backbone()
        if backbone_weights is not None:
            self.backbone.load_state_dict(torch.load(backbone_weights, weights_only=True))
        self.head = nn.Linear(16, num_classes)

    def forward(self, images: Tensor) -> Tensor:
        return self.head(self.backbone(images))

    def _step(self, batch: tuple[Tensor, Tensor], stage: str) -> Tensor:
        images, labels = batch
        logits = self(images)
        loss = nn.functional.cross_entropy(logits, labels)
        self.log(f"{stage}/loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        if stage != "train":
            accuracy = (logits.argmax(dim=1) == labels).float().mean()
            self.log(f"{stage}/acc", accuracy, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._step(batch, "val")

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._step(batch, "test")

    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return self(batch[0]).argmax(dim=1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)
