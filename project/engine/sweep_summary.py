"""The summary a sweep ends with where it repeats a configuration: over seeds (`seed=1,2,3`), over the folds of a
k-fold cross-validation (`data.fold=range(5)`), or over the trials of a search that met the same point twice.

A job's configuration is its overrides less `seed=` and `data.fold=`. For each configuration, the `optimized_metric`
and each numeric `test/...` metric of its jobs' `results.json` are summarised: mean ± sample standard deviation (n-1;
none for one job), min, max and n. A job that failed, was interrupted or was pruned is left out, and counted as left
out. The summary is printed below the sweep's table (`project.engine.sweeps.SweepSummaryCallback`) and written to
`<sweep dir>/summary.json`; a sweep that varies neither `seed` nor `data.fold` and repeats no configuration (a plain
grid) has none. Like the table, it reads only what the jobs left in their dirs, so it is the same whichever launcher
ran them, and whatever module they trained (a metric no job logged is `-`).
"""

import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from project.engine.run_config import overridden_key

if TYPE_CHECKING:
    from project.engine.sweeps import JobRow

# The overrides whose values repeat a configuration rather than make another one.
REPEATS = ("seed", "data.fold")
SUMMARY_FILE = "summary.json"


def configuration(overrides: Sequence[str]) -> tuple[str, ...]:
    """The overrides that make a job's configuration: all but the repeats'."""
    return tuple(override for override in overrides if overridden_key(override) not in REPEATS)


def described(values: list[float]) -> dict:
    """Mean, sample standard deviation (None for fewer than two values), min, max and n of `values`."""
    if not values:
        return {"mean": None, "std": None, "min": None, "max": None, "n": 0}
    std = statistics.stdev(values) if len(values) > 1 else None
    return {"mean": statistics.fmean(values), "std": std, "min": min(values), "max": max(values), "n": len(values)}


def is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_tested(name: str, value: object) -> bool:
    """A test metric: a number logged as `test/...`."""
    return name.startswith("test/") and is_number(value)


def varied_repeats(rows: Sequence["JobRow"]) -> list[str]:
    """The repeats (`seed`, `data.fold`) that take more than one value over the sweep's jobs."""
    seen: dict[str, set[str]] = {key: set() for key in REPEATS}
    for row in rows:
        for override in row.saved_overrides or ():
            if overridden_key(override) in seen:
                seen[overridden_key(override)].add(override)
    return [key for key, values in seen.items() if len(values) > 1]


def counted_out(row: "JobRow") -> bool:
    """A job whose numbers do not count: it failed, was interrupted, or its search's pruner stopped it early."""
    return bool(row.error) or row.interrupted or row.pruned or row.results is None


def summarise(rows: Sequence["JobRow"], metric: str) -> list[dict] | None:
    """One entry per configuration, in the order of its first job: its overrides, n (the jobs that count), how many
    were left out, which jobs count, and `metric` and each test metric described; None where the sweep repeats
    nothing."""
    groups: dict[tuple[str, ...], list[JobRow]] = {}
    for row in rows:
        if row.saved_overrides is not None:  # an interrupted job may have been killed before it saved them
            groups.setdefault(configuration(row.saved_overrides), []).append(row)
    if not varied_repeats(rows) and all(len(members) == 1 for members in groups.values()):
        return None
    summary = []
    for overrides, members in groups.items():
        counted = [row for row in members if not counted_out(row)]
        tests = [name for row in counted for name, value in row.results.items() if is_tested(name, value)]
        metrics = {
            name: described([row.results[name] for row in counted if is_number(row.results.get(name))])
            for name in dict.fromkeys([metric, *tests])
        }
        summary.append(
            {
                "overrides": list(overrides),
                "n": len(counted),
                "left_out": len(members) - len(counted),
                "jobs": [row.job for row in counted],
                "metrics": metrics,
            }
        )
    return summary


def summary_title(rows: Sequence["JobRow"]) -> str:
    """What the summary is over: the repeats that vary, or the configurations that the sweep met more than once."""
    over = " and ".join(varied_repeats(rows)) or "repeated configurations"
    return f"Over {over}: per configuration, mean ± std (min–max) of the jobs that finished"


def cell(stats: dict, n: int) -> str:
    """`mean ± std (min–max)`; the mean alone for one value, `-` for none, and the metric's n where it is not the
    configuration's (a job that did not log it)."""
    if stats["n"] == 0:
        return "-"
    text = f"{stats['mean']:.4f}"
    if stats["n"] > 1:
        text += f" ± {stats['std']:.4f} ({stats['min']:.4f}–{stats['max']:.4f})"
    return text if stats["n"] == n else f"{text} [n={stats['n']}]"


def format_summary(summary: list[dict], title: str) -> str:
    """A line per configuration: its overrides, n, then a column per metric."""
    names = list(dict.fromkeys(name for entry in summary for name in entry["metrics"]))
    rows = [["overrides", "n", *names]]
    for entry in summary:
        cells = [cell(entry["metrics"][name], entry["n"]) if name in entry["metrics"] else "-" for name in names]
        rows.append([" ".join(entry["overrides"]) or "(none)", str(entry["n"]), *cells])
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    lines = ["  ".join(text.ljust(width) for text, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    for line_index, entry in enumerate(summary, start=1):
        if entry["left_out"]:
            lines[line_index] += f"  ({entry['left_out']} left out)"
    rule = "-" * max(len(line) for line in [title, *lines])
    return "\n".join([rule, title, rule, *lines, rule])


def save_summary(summary: list[dict], sweep_dir: Path) -> Path:
    path = sweep_dir / SUMMARY_FILE
    path.write_text(json.dumps(summary, indent=1))
    return path
