"""A `-m` sweep as a whole: the table of its jobs at its end, the summary over its seeds, folds or repeated
configurations, and carrying on a sweep that stopped, by the same command in the same sweep dir."""

import json
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from project.engine.config import overridden_key
from project.engine.errors import ERROR_FILE, UserError, error_line, quoted, refuse
from project.engine.reports import format_value
from project.engine.run_log import printable, report
from project.engine.upstream import GRID_SWEEPER

# The overrides whose values repeat a configuration rather than make another one.
REPEATS = ("seed", "data.fold")
SUMMARY_FILE = "summary.json"
SWEEP_FAILED_STATUS = 1
# What Hydra's sweepers write into the sweep dir as the sweep starts: its config, the command's overrides included.
SWEEP_CONFIG = "multirun.yaml"
# A job stopped with its search, run again by the search's continuation (a sweeper that carries searches on).
INTERRUPTED_FILE = "interrupted.txt"
# A trial its search's pruner stopped early: its results are those of a short run.
PRUNED_FILE = "pruned.txt"


def in_a_search() -> bool:
    """Whether this run is a job of a search (any sweeper but Hydra's grid: one that optimises what its jobs return),
    read from the composed config so that a DDP rank that rank 0 started answers as rank 0 does."""
    return HydraConfig.initialized() and HydraConfig.get().sweeper.get("_target_") != GRID_SWEEPER


class JobRow(NamedTuple):
    job: str
    overrides: str
    value: float | None  # None (or NaN) where the job failed or its module logged no such metric
    directory: str
    error: str | None  # the job's error line, if it failed
    interrupted: bool  # stopped with its search and run again (INTERRUPTED_FILE)
    pruned: bool  # stopped early by its search's pruner (PRUNED_FILE)
    saved_overrides: tuple[str, ...] | None  # .hydra/overrides.yaml's list; None where it was not saved
    results: dict | None  # its results.json, where it left one


def job_rows(sweep_dir: Path, metric: str) -> list[JobRow]:
    """One row for each job directory of the sweep, in job order, from what the job left there: the same whichever
    launcher ran it (in this process, or a Slurm job)."""
    rows = []

    def is_job(path: Path) -> bool:  # an interrupted job may have been killed before Hydra saved its overrides
        return (path / ".hydra" / "overrides.yaml").is_file() or (path / INTERRUPTED_FILE).is_file()

    for job_dir in sorted(filter(is_job, sweep_dir.iterdir()), key=lambda path: (len(path.name), path.name)):
        overrides_file = job_dir / ".hydra" / "overrides.yaml"
        saved = tuple(yaml.safe_load(overrides_file.read_text()) or ()) if overrides_file.is_file() else None
        overrides = "(not saved)" if saved is None else printable(" ".join(saved))
        error_file = job_dir / ERROR_FILE
        error = printable(" ".join(error_file.read_text().split())) if error_file.is_file() else None
        try:
            results = finished_results(job_dir)
        except UserError as unreadable:
            results, error = None, error or error_line(unreadable)
        value = None if results is None else results.get(metric)
        interrupted = (job_dir / INTERRUPTED_FILE).is_file()
        if error is None and results is None and not interrupted:
            error = "error: the job left no results.json (killed?): see its log in that directory"
        pruned = (job_dir / PRUNED_FILE).is_file()
        rows.append(JobRow(job_dir.name, overrides, value, str(job_dir), error, interrupted, pruned, saved, results))
    return rows


def shown_value(row: JobRow) -> str:
    """The table's value column: the job's metric, or what kept it from one (a pruned job's is a short run's)."""
    if row.error:
        return "failed"
    if row.interrupted:
        return "interrupted"
    return "pruned" if row.pruned else format_value(row.value)


def format_sweep_table(rows: list[JobRow], metric: str) -> str:
    width = max([len("overrides"), *(len(row.overrides) for row in rows)])
    lines = [f"{'job':<5}{'overrides':<{width + 2}}{metric:>12}  dir"]
    for row in rows:
        lines.append(f"{row.job:<5}{row.overrides:<{width + 2}}{shown_value(row):>12}  {row.directory}")
    lines += [f"job {row.job} {row.error}" for row in rows if row.error]
    rule = "-" * max(len(line) for line in lines)
    failed = sum(1 for row in rows if row.error)
    pruned = sum(1 for row in rows if row.pruned and not row.error)
    title = f"Sweep: {len(rows)} job(s)" + (f", {failed} failed" if failed else "")
    title += f", {pruned} pruned" if pruned else ""
    return "\n".join([rule, title, rule, *lines, rule])


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


def varied_repeats(rows: Sequence[JobRow]) -> list[str]:
    """The repeats (`seed`, `data.fold`) that take more than one value over the sweep's jobs."""
    seen: dict[str, set[str]] = {key: set() for key in REPEATS}
    for row in rows:
        for override in row.saved_overrides or ():
            if overridden_key(override) in seen:
                seen[overridden_key(override)].add(override)
    return [key for key, values in seen.items() if len(values) > 1]


def counted_out(row: JobRow) -> bool:
    """A job whose numbers do not count: it failed, was interrupted, or its search's pruner stopped it early."""
    return bool(row.error) or row.interrupted or row.pruned or row.results is None


def summarise(rows: Sequence[JobRow], metric: str) -> list[dict] | None:
    """One entry per configuration, in its first job's order: overrides, n and left_out, the jobs that count, and
    `metric` and each test metric described; None where the sweep repeats nothing (a plain grid)."""
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
        entry = {"overrides": list(overrides), "n": len(counted), "left_out": len(members) - len(counted)}
        summary.append(entry | {"jobs": [row.job for row in counted], "metrics": metrics})
    return summary


def cell(stats: dict, n: int) -> str:
    """`mean ± std (min–max)`; the mean alone for one value, `-` for none, and the metric's n where it is not the
    configuration's (a job that did not log it)."""
    if stats["n"] == 0:
        return "-"
    text = f"{stats['mean']:.4f}"
    if stats["n"] > 1:
        text += f" ± {stats['std']:.4f} ({stats['min']:.4f}–{stats['max']:.4f})"
    return text if stats["n"] == n else f"{text} [n={stats['n']}]"


def format_summary(summary: list[dict], rows: Sequence[JobRow]) -> str:
    """What it is over (the repeats that vary, or the configurations met more than once), then a line per
    configuration: its overrides, n, then a column per metric."""
    over = " and ".join(varied_repeats(rows)) or "repeated configurations"
    title = f"Over {over}: per configuration, mean ± std (min–max) of the jobs that finished"
    names = list(dict.fromkeys(name for entry in summary for name in entry["metrics"]))
    table = [["overrides", "n", *names]]
    for entry in summary:
        cells = [cell(entry["metrics"][name], entry["n"]) if name in entry["metrics"] else "-" for name in names]
        table.append([" ".join(entry["overrides"]) or "(none)", str(entry["n"]), *cells])
    widths = [max(len(row[column]) for row in table) for column in range(len(table[0]))]
    lines = ["  ".join(text.ljust(width) for text, width in zip(row, widths, strict=True)).rstrip() for row in table]
    for line_index, entry in enumerate(summary, start=1):
        if entry["left_out"]:
            lines[line_index] += f"  ({entry['left_out']} left out)"
    rule = "-" * max(len(line) for line in [title, *lines])
    return "\n".join([rule, title, rule, *lines, rule])


class SweepSummaryCallback(Callback):
    """Prints the sweep's table and summary once all its jobs have ended, exit status 1 if any failed; not where the
    sweep ends by an exception (Hydra 1.4 calls it on the way out), whose line (how to carry it on) stays last."""

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        """A job that failed in an earlier run of its carried-on sweep starts without that failure's line."""
        if config.hydra.mode == RunMode.MULTIRUN:
            Path(config.hydra.runtime.output_dir, ERROR_FILE).unlink(missing_ok=True)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir() or sys.exc_info()[1] is not None:
            return
        rows = job_rows(sweep_dir, config.optimized_metric)
        report(format_sweep_table(rows, config.optimized_metric))
        summary = summarise(rows, config.optimized_metric)
        if summary is not None:
            report(format_summary(summary, rows))
            (sweep_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=1))
        failed = [row.job for row in rows if row.error]
        if failed:
            report(
                f"error: {len(failed)} of {len(rows)} sweep jobs failed (job {', '.join(failed)}): their errors are "
                "listed above and in error.txt in their directories",
                sys.stderr,
            )
            sys.exit(SWEEP_FAILED_STATUS)


def check_same_sweep(config: DictConfig) -> None:
    """Before the first job: refuse a sweep dir that holds another sweep (other overrides), whose job N would not be
    this one's job N. (An Optuna search's sweeper checks its own database.)"""
    sweep_dir = Path(config.hydra.sweep.dir)
    stored = sweep_dir / SWEEP_CONFIG
    if not stored.is_file():
        return
    theirs, mine = (OmegaConf.to_container(c.hydra.overrides.task) for c in (OmegaConf.load(stored), config))
    if theirs != mine:
        refuse(
            f"hydra.sweep.dir={sweep_dir} holds another sweep ({' '.join(theirs) or 'no overrides'}; this one: "
            f"{' '.join(mine) or 'no overrides'}), whose jobs this one would mix with its own: give a new "
            "hydra.sweep.dir, or carry that sweep on with its own command"
        )
    report(f"carrying on the sweep in {sweep_dir}: its finished jobs are not run again, a stopped one resumes")


def finished_results(run_dir: str | Path) -> dict | None:
    """The results this sweep job left when an earlier run of its sweep finished it, if it did; a results.json that
    is not a job's results (not JSON, or not a mapping of names to values: a file changed or handed over) is refused
    in one line, for the job to fail with, not to be taken for a finished job."""
    results_file = Path(run_dir) / "results.json"
    if not results_file.is_file():
        return None
    try:
        results = json.loads(results_file.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        problem = f"is not JSON ({error})"
    else:
        if isinstance(results, dict):
            return results
        problem = f"holds {quoted(results)}, not a job's results (a mapping of names to values)"
    raise UserError(f"{results_file} {problem}: delete it to run the job again, or give a new hydra.sweep.dir")


def continue_hint() -> str:
    """How to carry on the sweep this job belongs to."""
    hydra = HydraConfig.get()
    given = any(override.startswith("hydra.sweep.dir=") for override in hydra.overrides.hydra)
    where = "" if given else f" plus hydra.sweep.dir={Path(hydra.sweep.dir).resolve()}"
    return f"carry the sweep on with the same command{where} (its finished jobs are not run again)"
