"""The figures' shared parts: bars at the median with whiskers over the range, and `<stem>-throughput.png`, which
puts side by side the panel of every suite that gives one (`panels`: the data paths, the training paths). A suite's
other figures are its own (`draw`)."""

import statistics
from dataclasses import dataclass
from pathlib import Path

from matplotlib.figure import Figure


@dataclass
class Panel:
    """One panel of the throughput figure: per label, the rates measured (one per repeat, or per epoch)."""

    title: str
    xlabel: str
    rates: dict[str, list[float]]


def bars(axes, labels: list[str], samples: list[list[float]], title: str, xlabel: str) -> None:
    """Horizontal bars at the median, whiskers over the range."""
    medians = [statistics.median(values) for values in samples]
    low = [median - min(values) for median, values in zip(medians, samples, strict=True)]
    high = [max(values) - median for median, values in zip(medians, samples, strict=True)]
    axes.barh(labels, medians, xerr=[low, high], capsize=3, color="tab:blue", alpha=0.8)
    axes.invert_yaxis()
    axes.set(title=title, xlabel=xlabel)


def throughput(panels: list[Panel], path: Path) -> list[Path]:
    """The panels side by side, in the run's order; no figure where no suite gave one."""
    if not panels:
        return []
    figure = Figure(figsize=(6 * len(panels), 4.5), layout="constrained")
    for axes, panel in zip(figure.subplots(1, len(panels), squeeze=False)[0], panels, strict=True):
        bars(axes, list(panel.rates), list(panel.rates.values()), panel.title, panel.xlabel)
    figure.savefig(path)
    return [path]
