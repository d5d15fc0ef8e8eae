"""The bench's one table, and the JSON record of the run (`<out>/<stem>.json`); each suite gives its own rows."""

import json
import os
import platform
from datetime import datetime
from pathlib import Path

import lightning
import torch

from project.engine.run_dir import cpu_facts


def machine() -> dict:
    """What the numbers were measured on."""
    return {
        "platform": platform.platform(),
        "cpu": cpu_facts()["model"],
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


def failed_rows(suites: dict) -> list[Row]:
    """A row for each suite that failed, saying why (the table puts them first)."""
    return [(f"{name}: FAILED", "", result["error"][:80]) for name, result in suites.items() if "error" in result]


def format_table(record: dict, rows: list[Row], details: list[str]) -> str:
    """The run's table: a title naming the machine, one line per row, then the suites' free-form `details`."""
    host = record["machine"]
    title = f"Bench {record['date']} ({record['mode']}) on {host['cpu']}, {host['cores']} cores"
    if host["gpu"]:
        title += f", {host['gpu']}"
    lines = [f"{what:<48}{cell:<22}{note}" for what, cell, note in rows]
    lines += details
    lines.append(f"{record['seconds']:.0f} s in all; ratios: median (low-high) of per-repeat ratios")
    rule = "-" * max(len(line) for line in [title, *lines])
    return "\n".join([rule, title, rule, *lines, rule])
