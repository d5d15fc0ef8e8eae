"""What a set of predictions shows, written into a run dir: `project.predict` makes them, this writes them.

- `predictions.csv`: one row per sample, in the split's order: index, label, predicted class, its probability;
- `per_class.csv` and the table `per_class_table` prints: samples, correct and accuracy of every class;
- `confusion_matrix.png`: how often each true class (rows) was predicted as each class (columns);
- `most_confident_mistakes.png` (image data only): the wrong predictions the network was surest of, with label and
  prediction, which is where mislabelled samples and the network's blind spots show.
"""

import csv
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from matplotlib.figure import Figure  # no pyplot: files only, no display needed (a cluster node has none)
from torch import Tensor

MISTAKES_SHOWN = 16


@dataclass
class Predictions:
    """Every sample of a split once, in the split's order."""

    labels: Tensor  # [N] true classes
    probabilities: Tensor  # [N, classes]
    class_names: tuple[str, ...]

    @property
    def predicted(self) -> Tensor:
        return self.probabilities.argmax(dim=1)

    @property
    def confidence(self) -> Tensor:
        return self.probabilities.max(dim=1).values

    @property
    def accuracy(self) -> float:
        return (self.predicted == self.labels).float().mean().item()

    def confusion(self) -> Tensor:
        """[true class, predicted class] counts."""
        classes = len(self.class_names)
        pairs = self.labels * classes + self.predicted
        return torch.bincount(pairs, minlength=classes * classes).reshape(classes, classes)

    def per_class(self) -> list[tuple[str, int, int, float]]:
        """(class, samples, correct, accuracy) for every class; a class without samples has accuracy NaN."""
        confusion = self.confusion()
        rows = []
        for label, name in enumerate(self.class_names):
            samples, correct = int(confusion[label].sum()), int(confusion[label, label])
            rows.append((name, samples, correct, correct / samples if samples else float("nan")))
        return rows


def write_csv(predictions: Predictions, path: Path) -> None:
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["index", "label", "predicted", "confidence"])
        columns = (predictions.labels.tolist(), predictions.predicted.tolist(), predictions.confidence.tolist())
        rows = zip(*columns, strict=True)
        for index, (label, predicted, confidence) in enumerate(rows):
            writer.writerow([index, label, predicted, f"{confidence:.6f}"])


def write_per_class(predictions: Predictions, path: Path) -> None:
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["class", "samples", "correct", "accuracy"])
        for name, samples, correct, accuracy in predictions.per_class():
            writer.writerow([name, samples, correct, f"{accuracy:.6f}"])


def per_class_table(predictions: Predictions) -> str:
    width = max(len("class"), *(len(name) for name in predictions.class_names))
    lines = [f"{'class':<{width}}  samples  correct  accuracy"]
    for name, samples, correct, accuracy in predictions.per_class():
        lines.append(f"{name:<{width}}  {samples:>7}  {correct:>7}  {accuracy:>8.4f}")
    total = len(predictions.labels)
    correct = int((predictions.predicted == predictions.labels).sum())
    lines.append(f"{'all':<{width}}  {total:>7}  {correct:>7}  {predictions.accuracy:>8.4f}")
    return "\n".join(lines)


def plot_confusion_matrix(predictions: Predictions, path: Path) -> None:
    confusion = predictions.confusion()
    classes = len(predictions.class_names)
    figure = Figure(figsize=(2 + 0.6 * classes, 1.5 + 0.6 * classes))
    axes = figure.subplots()
    axes.imshow(confusion, cmap="Blues")
    axes.set_xticks(range(classes), predictions.class_names, rotation=45, ha="right")
    axes.set_yticks(range(classes), predictions.class_names)
    axes.set_xlabel("predicted")
    axes.set_ylabel("label")
    axes.set_title(f"accuracy {predictions.accuracy:.4f} on {len(predictions.labels)} samples")
    for row in range(classes):
        for column in range(classes):
            count = int(confusion[row, column])
            dark = count > confusion.max() / 2
            axes.text(column, row, str(count), ha="center", va="center", color="white" if dark else "black")
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def plot_confident_mistakes(predictions: Predictions, images: Callable[[int], Tensor], path: Path) -> int:
    """A grid of the wrong predictions made with the highest probability; how many it shows (0: no file).

    `images(index)` is the sample's image, `[channels, height, width]` in [0, 1] (grey or RGB).
    """
    wrong = (predictions.predicted != predictions.labels).nonzero().flatten()
    shown = wrong[predictions.confidence[wrong].argsort(descending=True)][:MISTAKES_SHOWN]
    if len(shown) == 0:
        return 0
    columns = min(4, len(shown))
    rows = -(-len(shown) // columns)
    figure = Figure(figsize=(2.2 * columns, 2.5 * rows))
    grid = figure.subplots(rows, columns, squeeze=False)
    names = predictions.class_names
    for axes in grid.flat:
        axes.axis("off")
    for axes, index in zip(grid.flat, shown.tolist(), strict=False):
        axes.imshow(images(index).permute(1, 2, 0).squeeze(-1), cmap="gray")  # the colour map is for grey only
        label, predicted = names[predictions.labels[index]], names[predictions.predicted[index]]
        confidence = predictions.confidence[index].item()
        axes.set_title(f"#{index}: {label}\nas {predicted} ({confidence:.2f})", fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    return len(shown)
