"""What a classifier's predictions show, written into `project.predict`'s run dir (`ClassifierModule`'s
`write_predictions`):

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

import lightning as L
import torch
from matplotlib.figure import Figure  # no pyplot: files only, no display needed (a cluster node has none)
from torch import Tensor

from project.engine.run_log import report
from project.engine.trained_run import Outputs, write_table

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


def class_scores(outputs: Outputs) -> tuple[Tensor, Tensor] | None:
    """(probabilities [N, classes], labels [N]): `predict_step`'s `(probabilities, labels)`, or a dict with
    `probabilities` and `labels` (a float `[N, classes]` and an integer `[N]`); None for outputs of another kind."""
    for scores, labels in (("0", "1"), ("probabilities", "labels")):
        if set(outputs) != {scores, labels}:
            continue
        probabilities, targets = outputs[scores], outputs[labels]
        if (
            probabilities.ndim == 2
            and probabilities.is_floating_point()
            and targets.ndim == 1
            and not targets.is_floating_point()
            and len(targets) == len(probabilities)
        ):
            return probabilities, targets
    return None


def write_class_predictions(outputs: Outputs, datamodule: L.LightningDataModule, directory: Path) -> list[str]:
    """The files above for `predict_step`'s class scores and labels, in `directory`, and the per-class table printed;
    their names. Outputs of another kind get the engine's table of them."""
    scores = class_scores(outputs)
    if scores is None:
        return ["predictions.csv"] if write_table(outputs, directory / "predictions.csv") else []
    probabilities, labels = scores
    predictions = Predictions(labels, probabilities, class_names(datamodule, probabilities.shape[1]))
    write_csv(predictions, directory / "predictions.csv")
    write_per_class(predictions, directory / "per_class.csv")
    plot_confusion_matrix(predictions, directory / "confusion_matrix.png")
    written = ["predictions.csv", "per_class.csv", "confusion_matrix.png"]
    split = getattr(datamodule, "predict_split", "test")
    images = split_images(datamodule, split)
    if images is not None and plot_confident_mistakes(predictions, images, directory / "most_confident_mistakes.png"):
        written.append("most_confident_mistakes.png")
    report(f"{split} split\n{per_class_table(predictions)}")
    return written


def class_names(datamodule: L.LightningDataModule, classes: int) -> tuple[str, ...]:
    """The data module's names of its classes, or the labels as strings ("0", "1", ...) where it names none."""
    names = getattr(datamodule, "class_names", ())  # a user's own data module may not name its classes
    return tuple(str(name) for name in names) if names else tuple(str(label) for label in range(classes))


def split_images(datamodule: L.LightningDataModule, split: str) -> Callable[[int], Tensor] | None:
    """The split's image at an index, in [0, 1] for drawing (read when drawn: an image folder may not fit in
    memory), or None when the data are no images: the toy points, or a dataset without an `image` method (uint8
    `[channels, height, width]` at an index), as a user's own may be."""
    dataset = getattr(datamodule, f"{split}_set", None)
    image = getattr(dataset, "image", None)
    if image is None or image(0) is None:
        return None
    return lambda index: image(index).float() / 255
