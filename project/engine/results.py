"""The results table every run ends with, and `results.json`, its machine-readable twin in the run dir.

The table shows what the module logged, whatever it is named: `<stage>/<name>` metrics (the classifier's
`train/loss`, `val/acc`, ...) as a row per name and a column per stage, "-" where a stage has none; any other
metric on a line of its own.
"""

import json
import math
from pathlib import Path

STAGES = ("train", "val", "test")
RUN_KEYS = ("epochs", "world_size", "fit_seconds", "samples_per_second", "run_dir", "weights")


def logged_metrics(results: dict) -> dict[str, float]:
    """The metrics in `results` (everything but the run's size, speed and place), in the order they were logged."""
    return {name: value for name, value in results.items() if name not in RUN_KEYS}


def format_value(value: object) -> str:
    """A metric's cell: 4 decimals for a number, "-" for a missing one."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.4f}" if isinstance(value, (int, float)) else str(value)


def metric_line(name: str, value: object, width: int) -> str:
    """A metric on a line of its own, as the table shows one (and `project.evaluate` each of its metrics): the name in
    `width` characters, then the value in a column of 10."""
    return f"{name:<{width}}{format_value(value):>10}"


def stage_of(metric: str) -> tuple[str, str] | None:
    """("val", "acc") for "val/acc"; None for a metric not named `<stage>/<name>`."""
    stage, slash, name = metric.partition("/")
    return (stage, name) if slash and stage in STAGES else None


def format_results_table(results: dict) -> str:
    """Logged metrics per stage as rows, the other metrics, then the run's size, speed and place."""
    metrics = logged_metrics(results)
    names = list(dict.fromkeys(staged[1] for staged in map(stage_of, metrics) if staged))
    width = max([10, *(len(name) + 2 for name in names)])
    lines = [f"{'':<{width}}{''.join(f'{stage:>10}' for stage in STAGES)}"] if names else []
    for name in names:
        cells = "".join(f"{format_value(metrics.get(f'{stage}/{name}')):>10}" for stage in STAGES)
        lines.append(f"{name:<{width}}{cells}")
    others = [name for name in metrics if stage_of(name) is None]
    lines += [metric_line(name, metrics[name], width) for name in others]
    if not metrics:
        lines.append("metrics     none logged (self.log in the module's steps puts them here)")
    speed = results["samples_per_second"]
    speed_of = "(training samples, all processes)"
    if speed is None:
        speed_of = "(not known: no history was kept, or a batch's size could not be read)"
    lines += [
        f"epochs      {results['epochs']}",
        f"processes   {results['world_size']}",
        f"wall time   {format_seconds(results['fit_seconds'])} (fit: train + validation)",
        f"samples/s   {'-' if speed is None else format(speed, '.0f')} {speed_of}",
        f"weights     {results.get('weights', 'last')} (val and test)",
        f"run dir     {results['run_dir']}",
    ]
    width = max(len(line) for line in lines)
    rule = "-" * width
    return "\n".join([rule, "Results", rule, *lines, rule])


def format_seconds(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds:.2f} s"


def save_results(results: dict, run_dir: str | Path) -> Path:
    path = Path(run_dir) / "results.json"
    path.write_text(json.dumps(results, indent=1))
    return path
