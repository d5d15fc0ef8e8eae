"""The bench's one table, and the JSON record of the run (`<out>/<stem>.json`)."""

import json
import os
import platform
import statistics
from datetime import datetime
from pathlib import Path

import lightning
import torch


def machine() -> dict:
    """What the numbers were measured on."""
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").is_file() else []
    cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo if "model name" in line), platform.processor())
    return {
        "platform": platform.platform(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "lightning": lightning.__version__,
    }


def today() -> str:
    return datetime.now().strftime("%Y-%m-%d")


def save(record: dict, out: Path, stem: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{stem}.json"
    path.write_text(json.dumps(record, indent=1))
    return path


Row = tuple[str, str, str]  # what, its value (median and range, or a percentage), a note


def ratio_cell(spread: dict) -> str:
    return f"{spread['median']:6.2f}  ({spread['low']:.2f}-{spread['high']:.2f})"


def data_rows(data: dict) -> list[Row]:
    rows = []
    for path, spread in data.get("throughput_vs_limit", {}).items():
        if path != "compute only":
            rate = statistics.median(data["samples_per_second"][path])
            goal = ", goal >= 0.90" if path.startswith("datamodule") else ""
            rows.append((f"data: {path} / compute-only limit", ratio_cell(spread), f"{rate:,.0f} samples/s{goal}"))
    return rows


def lightning_rows(result: dict, label: str) -> list[Row]:
    rows = []
    for variant, spread in result.get("throughput_vs_reference", {}).items():
        goal = ", goal >= 0.90" if variant == "default" else ""
        note = f"{result['extra_ms_per_step'][variant]:+.2f} ms per step{goal}"
        rows.append((f"{label} {variant} / reference", ratio_cell(spread), note))
    if "default_vs_bare" in result:
        rows.append((f"{label} default / bare", ratio_cell(result["default_vs_bare"]), "goal >= 0.95"))
    for key, larger in result.items():
        if key.startswith("batch_"):
            note = f"{larger['steps_per_epoch']} steps per epoch"
            spread = larger["throughput_vs_reference"]["default"]
            rows.append((f"{label} default / reference, {key.replace('_', ' ')}", ratio_cell(spread), note))
    return rows


def startup_rows(startup: dict) -> list[Row]:
    if "train_vs_imports" not in startup:
        return []
    seconds = startup["seconds"]
    note = f"train {seconds['train']['median']:.1f} s, imports {seconds['imports']['median']:.1f} s, goal <= 1.5"
    return [("start-up: project.train toy / bare imports", ratio_cell(startup["train_vs_imports"]), note)]


def ddp_rows(ddp: dict) -> list[Row]:
    return [
        (f"DDP: 2 processes / 1, {name}", ratio_cell(spread), "gloo, 1 thread per rank")
        for name, spread in ddp.get("two_vs_one", {}).items()
    ]


def preemption_rows(preemption: dict) -> list[Row]:
    if "stop_seconds" not in preemption:
        return []
    where = (
        f"step {preemption['stopped_after_step']}: epoch {preemption['epoch']}, batch {preemption['batches_done']} "
        f"of {preemption['steps_per_epoch']}; last.ckpt {preemption['checkpoint_mb']:.1f} MB"
    )
    again = preemption["steps_trained_again_with_epoch_end_checkpoints_only"]
    seconds = preemption["seconds_trained_again_with_epoch_end_checkpoints_only"]
    return [
        ("preemption: SIGTERM to exit, checkpoint written", f"{preemption['stop_seconds']:6.2f} s", where),
        (
            "preemption: steps the resumed run trains again",
            f"{preemption['steps_trained_again']:6d}",
            f"with epoch-end checkpoints only: {again} ({seconds:.1f} s)",
        ),
    ]


def memory_rows(memory: dict) -> list[Row]:
    if "peak_rss_mb" not in memory:
        return []
    peak, images = memory["peak_rss_mb"], memory["images_mb"]
    note = (
        f"{memory['samples_per_second']:,.0f} samples/s; bare imports {peak['imports']:.0f} MB; "
        f"{memory['images']:,} images held in {images['uint8']:.0f} MB (float32: {images['float32']:.0f} MB)"
    )
    return [("memory: peak RSS, recipe 1 epoch", f"{peak['train']:6.0f} MB", note)]


def fsdp_memory_rows(fsdp: dict) -> list[Row]:
    if "bytes_per_rank" not in fsdp:
        return []
    mb = {
        strategy: [{part: n / 2**20 for part, n in rank.items()} for rank in ranks]
        for strategy, ranks in fsdp["bytes_per_rank"].items()
    }
    width = fsdp["width"]
    rows = []
    for part in ("weights", "gradients", "optimizer"):
        ddp, sharded = (mb[strategy][0][part] for strategy in ("ddp", "fsdp"))
        note = f"rank 0, 2 processes, MLP 784-{width}-{width}-{width}-10; ddp {ddp:.1f} MB"
        rows.append((f"fsdp / ddp: per-rank {part}", f"{sharded / ddp:.2f}", f"{sharded:.1f} MB; {note}"))
    peaks = {strategy: [rank["peak_resident"] for rank in ranks] for strategy, ranks in mb.items()}
    ddp, sharded = max(peaks["ddp"]), max(peaks["fsdp"])
    note = "ranks 0, 1: " + "; ".join(f"{s} {a:.0f}, {b:.0f} MB" for s, (a, b) in peaks.items()) + " (Linux VmHWM)"
    rows.append(("fsdp / ddp: per-rank peak resident memory", f"{sharded / ddp:.2f}", note))
    rate = fsdp["samples_per_second"]
    steps = f"2 ranks, steps timed after warm-up: {fsdp['timed_steps']}"
    note = f"fsdp {rate['fsdp']:,.0f}, ddp {rate['ddp']:,.0f} samples/s; {steps}"
    rows.append(("fsdp / ddp: training samples/s", f"{rate['fsdp'] / rate['ddp']:.2f}", note))
    return rows


def image_folder_rows(folder: dict) -> list[Row]:
    if "loader_vs_training" not in folder:
        return []
    rate = {name: statistics.median(values) for name, values in folder["samples_per_second"].items()}
    workers = folder["workers"]
    training = f"training, {workers} workers"
    return [
        (
            f"image folder: data module / plain decode, {workers} workers",
            ratio_cell(folder["datamodule_vs_plain"]),
            f"{rate['data module']:,.0f} vs {rate['plain decode']:,.0f} samples/s",
        ),
        (
            f"image folder: loader / CNN training, {workers} workers",
            ratio_cell(folder["loader_vs_training"]),
            f"CNN trains {rate[training]:,.0f} samples/s; > 1: the loader keeps ahead",
        ),
        (
            f"image folder: CNN training, {workers} workers / 0",
            ratio_cell(folder["two_workers_vs_none"]),
            f"epoch's steps {folder['seconds'][training]['median']:.1f} s vs "
            f"{folder['seconds']['training, 0 workers']['median']:.1f} s ({folder['training_images']:,} images)",
        ),
    ]


def accuracy_rows(accuracy: dict) -> list[Row]:
    rows = []
    for key, what in (("to_85", "85 %"), ("to_88", "88 %"), ("best", "best")):
        if key in accuracy:
            point = accuracy[key]
            cell = "not reached" if point is None else f"{point['test_acc'] * 100:6.2f} %"
            note = "" if point is None else f"epoch {point['epoch']}, {point['seconds']:.1f} s of training"
            rows.append((f"accuracy: {what} (test, {accuracy['max_epochs']} epochs)", cell, note))
    return rows


def rows(suites: dict) -> list[Row]:
    """Every ratio the suites measured; failed suites first, saying why."""
    failed = [(f"{name}: FAILED", "", result["error"][:80]) for name, result in suites.items() if "error" in result]
    return [
        *failed,
        *data_rows(suites.get("data_path", {})),
        *lightning_rows(suites.get("lightning_overhead", {}), "Lightning"),
        *lightning_rows(suites.get("gpu", {}), "GPU Lightning"),
        *startup_rows(suites.get("startup", {})),
        *ddp_rows(suites.get("ddp_scaling", {})),
        *preemption_rows(suites.get("preemption", {})),
        *memory_rows(suites.get("memory", {})),
        *fsdp_memory_rows(suites.get("fsdp_memory", {})),
        *image_folder_rows(suites.get("image_folder", {})),
        *accuracy_rows(suites.get("time_to_accuracy", {})),
    ]


def format_table(record: dict) -> str:
    host = record["machine"]
    title = f"Bench {record['date']} ({record['mode']}) on {host['cpu']}, {host['cores']} cores"
    if host["gpu"]:
        title += f", {host['gpu']}"
    lines = [f"{what:<48}{cell:<22}{note}" for what, cell, note in rows(record["suites"])]
    costs = record["suites"].get("lightning_overhead", {}).get("profile_ms_per_step", {})
    if costs:
        total = sum(costs.values())
        lines.append("Lightning default, one profiled epoch, self time per training step (cProfile):")
        lines += [f"  {part:<54}{ms:6.2f} ms  {ms / total:4.0%}" for part, ms in costs.items()]
        calls = record["suites"]["lightning_overhead"].get("hook_calls_per_step", {})
        lines += [f"  calls per step: {label} {count:.1f}" for label, count in calls.items()]
    lines.append(f"{record['seconds']:.0f} s in all; ratios: median (low-high) of per-repeat ratios")
    rule = "-" * max(len(line) for line in [title, *lines])
    return "\n".join([rule, title, rule, *lines, rule])
