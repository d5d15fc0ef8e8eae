"""The results table every run ends with, and `results.json`, its machine-readable twin in the run dir."""

import json
from pathlib import Path

METRICS = ("loss", "acc")
STAGES = ("train", "val", "test")


def format_results_table(results: dict) -> str:
    """Loss and accuracy per stage as rows, then the run's size, speed and place."""
    lines = [f"{'':<10}{'train':>10}{'val':>10}{'test':>10}"]
    for metric in METRICS:
        cells = "".join(f"{results.get(f'{stage}/{metric}', float('nan')):>10.4f}" for stage in STAGES)
        lines.append(f"{metric:<10}{cells}")
    lines += [
        f"epochs      {results['epochs']}",
        f"processes   {results['world_size']}",
        f"wall time   {results['fit_seconds']:.2f} s (fit: train + validation)",
        f"samples/s   {results['samples_per_second']:.0f} (training samples, all processes)",
        f"weights     {results.get('weights', 'last')} (val and test)",
        f"run dir     {results['run_dir']}",
    ]
    width = max(len(line) for line in lines)
    rule = "-" * width
    return "\n".join([rule, "Results", rule, *lines, rule])


def save_results(results: dict, run_dir: str | Path) -> Path:
    path = Path(run_dir) / "results.json"
    path.write_text(json.dumps(results, indent=1))
    return path
