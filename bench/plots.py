"""The bench's PNGs: throughput per path, loss against time (Lightning and reference), DDP scaling."""

import statistics
from pathlib import Path

from matplotlib.figure import Figure


def bars(axes, labels: list[str], samples: list[list[float]], title: str, xlabel: str) -> None:
    """Horizontal bars at the median, whiskers over the range."""
    medians = [statistics.median(values) for values in samples]
    low = [median - min(values) for median, values in zip(medians, samples, strict=True)]
    high = [max(values) - median for median, values in zip(medians, samples, strict=True)]
    axes.barh(labels, medians, xerr=[low, high], capsize=3, color="tab:blue", alpha=0.8)
    axes.invert_yaxis()
    axes.set(title=title, xlabel=xlabel)


def throughput(suites: dict, path: Path) -> Path | None:
    """Left: the data paths (training steps only); right: the training paths (whole epochs, validation included)."""
    data = suites.get("data_path", {})
    training = {}  # label -> (steps per epoch, epoch seconds)
    for suite, prefix in (("lightning_overhead", ""), ("gpu", "GPU ")):
        result = suites.get(suite, {})
        for name, seconds in result.get("epoch_seconds", {}).items():
            label = name if name == "reference" else f"{prefix}Lightning {name}"
            training.setdefault(label, (result["steps_per_epoch"], seconds["samples"]))
    if "samples_per_second" not in data and not training:
        return None
    figure = Figure(figsize=(12, 4.5), layout="constrained")
    left, right = figure.subplots(1, 2)
    if "samples_per_second" in data:
        rates = data["samples_per_second"]
        bars(left, list(rates), list(rates.values()), "Data paths: one training epoch", "samples / s")
    if training:
        rates = [[steps / seconds for seconds in times] for steps, times in training.values()]
        bars(right, list(training), rates, "Training paths: epochs with validation", "training steps / s")
    figure.savefig(path)
    return path


def loss_against_time(suites: dict, path: Path) -> Path | None:
    curves = (suites.get("lightning_overhead") or suites.get("gpu") or {}).get("loss_curves")
    if not curves or not curves["lightning"]["loss"]:
        return None
    figure = Figure(figsize=(7, 4), layout="constrained")
    axes = figure.subplots()
    axes.plot(curves["lightning"]["seconds"], curves["lightning"]["loss"], label="Lightning (default)", alpha=0.7)
    axes.plot(curves["reference"]["seconds"], curves["reference"]["loss"], label="reference loop", alpha=0.7)
    axes.set(xlabel="seconds since training started", ylabel="training loss per step", title="Same steps, two paths")
    axes.legend()
    figure.savefig(path)
    return path


def ddp_scaling(suites: dict, path: Path) -> Path | None:
    rates = suites.get("ddp_scaling", {}).get("samples_per_second")
    if not rates:
        return None
    figure = Figure(figsize=(7, 3.5), layout="constrained")
    axes = figure.subplots()
    bars(axes, list(rates), list(rates.values()), "gloo DDP on the CPU (one epoch)", "samples / s (all ranks)")
    axes.axvline(2 * statistics.median(rates["1 process"]), color="grey", linestyle="--", label="2 × one process")
    axes.legend(loc="lower right")
    figure.savefig(path)
    return path


def draw_all(suites: dict, out: Path, stem: str) -> list[Path]:
    drawn = [
        throughput(suites, out / f"{stem}-throughput.png"),
        loss_against_time(suites, out / f"{stem}-loss-vs-time.png"),
        ddp_scaling(suites, out / f"{stem}-ddp-scaling.png"),
    ]
    return [path for path in drawn if path is not None]
