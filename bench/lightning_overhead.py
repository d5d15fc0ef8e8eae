"""The default Lightning path against the reference loop on the same data, and what each part of Lightning costs.

Candidates, each a full `trainer.fit` of the same config, interleaved with the reference loop:

    default       this project's default path (epoch-level metric logging, step loss and learning rate on
                  logging steps, TensorBoard, checkpoints, progress bar, history)
    stock         the textbook module (metrics called and logged every step, step loss every step) with
                  Lightning's stock progress bar (redrawn every step): where the project started
    unfused Adam  `default` with `model.optimizer.fused=false`: what experiment=mnist's fused Adam is worth
    plain __setattr__  `default` without ClassifierModule's `__setattr__` shortcut: what the shortcut is worth
    bare          no logging, callbacks, logger or progress bar: Lightning's own loop, the floor

A profiled epoch of `default` names where its time goes (`profile_costs`). Lightning's cost is per step, so the
same comparison at batch 512 (a quarter of the steps) shows how much of it a larger batch hides.
"""

import re
import statistics
from pathlib import Path

import torch
from matplotlib.figure import Figure

from bench.plots import Panel
from bench.profile_costs import ProfileTraining
from bench.reference_runs import reference_fit
from bench.report import Row, ratio_cell
from bench.settings import Settings
from bench.timing import all_units, interleave, paired_ratio
from bench.training_runs import FitRecord, compose_config, lightning_fit, load_datamodule

LARGER_BATCH = 512
VARIANTS = {
    # The bar a terminal shows, wherever the bench's own output goes (a pipe would get plain progress lines).
    "default": ["callbacks.progress_bar.lines=false"],
    "stock": [
        "model._target_=bench.lightning_variants.PerStepLoggingModule",
        "callbacks.progress_bar.lines=false",
        "callbacks.progress_bar.refresh_rate=1",
    ],
    "unfused Adam": ["model.optimizer.fused=false"],
    "plain __setattr__": ["model._target_=bench.lightning_variants.PlainSetattrModule"],
    "bare": [
        "model._target_=bench.lightning_variants.UnloggedModule",
        "callbacks=none",
        "logger=none",
        "++trainer.enable_progress_bar=false",
        "++trainer.enable_checkpointing=false",
        "++trainer.enable_model_summary=false",
    ],
}


def loss_curve(record: FitRecord) -> dict[str, list[float]]:
    """Training loss against seconds since the first epoch started."""
    start = record.clock.epoch_starts[0]
    return {"seconds": [end - start for end in record.clock.step_ends], "loss": record.step_losses}


def compare_to_reference(settings: Settings, base: list[str], variants: dict[str, list[str]], scratch: Path) -> dict:
    """Epoch times of the reference loop and of each Lightning variant (`base` + its overrides), interleaved.

    Every variant names its trainer config itself (`trainer=...` may be given once only). Returns the times, each
    variant's throughput relative to the reference (paired per repeat), its extra time per training step, and the
    last loss curves of the reference and of the first variant.
    """
    device = torch.device(settings.device)
    base = [*base, f"trainer.max_epochs={settings.epochs}"]
    datamodule = load_datamodule(compose_config(base, scratch), device if settings.resident else None)
    last: dict[str, FitRecord] = {}

    def reference() -> list[float]:
        last["reference"] = reference_fit(compose_config(base, scratch / "reference"), datamodule, device)
        return last["reference"].clock.epoch_seconds()

    def variant(name: str):
        def fit() -> list[float]:
            cfg = compose_config([*base, *variants[name]], scratch / re.sub(r"[^\w.-]+", "_", name))
            last[name], _ = lightning_fit(cfg, datamodule)
            return last[name].clock.epoch_seconds()

        return fit

    seconds = interleave({"reference": reference} | {name: variant(name) for name in variants}, settings.repeats)
    steps = len(datamodule.train_dataloader())
    reference_step = statistics.median(all_units(seconds["reference"]).samples) / steps
    ratios = {name: paired_ratio(seconds["reference"], seconds[name]) for name in variants}
    first = next(iter(variants))
    # What the template's own callbacks and logging cost on top of Lightning's floor (goal: within 5 %).
    own_cost = (
        {"default_vs_bare": paired_ratio(seconds["bare"], seconds["default"]).as_dict()} if "bare" in seconds else {}
    )
    return own_cost | {
        "overrides": base,
        "steps_per_epoch": steps,
        "epoch_seconds": {name: all_units(times).as_dict() for name, times in seconds.items()},
        "throughput_vs_reference": {name: ratio.as_dict() for name, ratio in ratios.items()},
        # The time per step that the (paired, median) ratio implies on top of the reference's median step: a
        # difference of the two medians would mix slow spells of the machine into it.
        "extra_ms_per_step": {name: reference_step * (1 / ratio.median - 1) * 1000 for name, ratio in ratios.items()},
        "loss_curves": {"lightning": loss_curve(last[first]), "reference": loss_curve(last["reference"])},
    }


def run(settings: Settings, recipe: list[str], scratch: Path) -> dict:
    """The three variants against the reference, `default` again at batch 512, and a profiled epoch of `default`."""
    trainer = settings.trainer_override()
    result = compare_to_reference(
        settings, recipe, {name: [trainer, *overrides] for name, overrides in VARIANTS.items()}, scratch
    )
    larger = compare_to_reference(
        settings,
        [*recipe, f"data.batch_size={LARGER_BATCH}"],
        {"default": [trainer, *VARIANTS["default"]]},
        scratch / "larger_batch",
    )
    result[f"batch_{LARGER_BATCH}"] = {key: larger[key] for key in ("steps_per_epoch", "throughput_vs_reference")}
    profiler = ProfileTraining()
    cfg = compose_config([*recipe, trainer, *VARIANTS["default"], "trainer.max_epochs=1"], scratch / "profiled")
    datamodule = load_datamodule(cfg, torch.device(settings.device) if settings.resident else None)
    profiled, _ = lightning_fit(cfg, datamodule, [profiler])
    steps = len(profiled.clock.step_ends)
    return result | {
        "profile_ms_per_step": profiler.milliseconds_per_step(steps),
        "hook_calls_per_step": profiler.hook_calls_per_step(steps),
    }


def comparison_rows(result: dict, label: str) -> list[Row]:
    """The rows of `compare_to_reference`'s result, each variant's named `<label> <variant>`."""
    table = []
    for variant, spread in result["throughput_vs_reference"].items():
        goal = ", goal >= 0.90" if variant == "default" else ""
        note = f"{result['extra_ms_per_step'][variant]:+.2f} ms per step{goal}"
        table.append((f"{label} {variant} / reference", ratio_cell(spread), note))
    if "default_vs_bare" in result:
        table.append((f"{label} default / bare", ratio_cell(result["default_vs_bare"]), "goal >= 0.95"))
    for key, larger in result.items():
        if key.startswith("batch_"):
            note = f"{larger['steps_per_epoch']} steps per epoch"
            spread = larger["throughput_vs_reference"]["default"]
            table.append((f"{label} default / reference, {key.replace('_', ' ')}", ratio_cell(spread), note))
    return table


def comparison_panel(result: dict, label: str, title: str) -> Panel:
    """The throughput figure's panel of `compare_to_reference`'s result: training steps/s of whole epochs."""
    steps = result["steps_per_epoch"]
    rates = {
        name if name == "reference" else f"{label} {name}": [steps / seconds for seconds in times["samples"]]
        for name, times in result["epoch_seconds"].items()
    }
    return Panel(title, "training steps / s", rates)


def rows(result: dict) -> list[Row]:
    return comparison_rows(result, "Lightning")


def details(result: dict) -> list[str]:
    """Under the table: the profiled epoch's self time per training step, part by part, and the hooks per step."""
    costs = result["profile_ms_per_step"]
    total = sum(costs.values())
    lines = ["Lightning default, one profiled epoch, self time per training step (cProfile):"]
    lines += [f"  {part:<54}{ms:6.2f} ms  {ms / total:4.0%}" for part, ms in costs.items()]
    lines += [f"  calls per step: {label} {count:.1f}" for label, count in result["hook_calls_per_step"].items()]
    return lines


def panels(result: dict) -> list[Panel]:
    return [comparison_panel(result, "Lightning", "Training paths: epochs with validation")]


def draw(result: dict, out: Path, stem: str) -> list[Path]:
    """`<stem>-loss-vs-time.png`: the training loss of Lightning's default path and of the reference loop."""
    curves = result["loss_curves"]
    if not curves["lightning"]["loss"]:
        return []
    figure = Figure(figsize=(7, 4), layout="constrained")
    axes = figure.subplots()
    axes.plot(curves["lightning"]["seconds"], curves["lightning"]["loss"], label="Lightning (default)", alpha=0.7)
    axes.plot(curves["reference"]["seconds"], curves["reference"]["loss"], label="reference loop", alpha=0.7)
    axes.set(xlabel="seconds since training started", ylabel="training loss per step", title="Same steps, two paths")
    axes.legend()
    path = out / f"{stem}-loss-vs-time.png"
    figure.savefig(path)
    return [path]
