"""A `-m` sweep (a grid, an Optuna search) as a whole: the table at its end, and carrying on one that stopped.

The table, printed at the end of every sweep (`SweepSummaryCallback`): one line per job, its overrides, its metric,
its dir; below it, where the sweep repeats configurations (seeds, folds), their summary
(`project.engine.sweep_summary`). It reads what each job left in its directory (`results.json`, `error.txt`,
`.hydra/overrides.yaml`) rather than what the jobs returned, so it works the same whichever launcher ran them (in this
process, or as Slurm jobs via submitit). A job that failed shows its error line instead of a metric, and the sweep
then ends with exit status 1, after every other job has run.

A sweep that stopped part-way (SIGTERM, Ctrl-C, a node lost) is carried on by the same command with its
`hydra.sweep.dir`, which its stop names (`continue_hint`):
- a job that finished there (its results.json) is not run again: its results stand as they were;
- the job that stopped resumes from its own checkpoints/last.ckpt (`project.engine.checkpoints.resume_path`);
- the jobs it had not reached run afresh.
Job N of the same sweep is the same job (the same overrides in the same order), so a sweep dir whose sweep had other
overrides is refused before any job runs (`check_same_sweep`). A search whose sweeper numbers its trials on by
itself never meets its finished jobs again.
"""

import json
import sys
from pathlib import Path
from typing import Any, NamedTuple

import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from project.engine.results import format_value
from project.engine.run_log import report
from project.engine.sweep_summary import format_summary, save_summary, summarise, summary_title

SWEEP_FAILED_STATUS = 1
# A failed job's error line, in its directory (`project.engine.errors` writes it).
ERROR_FILE = "error.txt"
# What Hydra's sweepers write into the sweep dir as the sweep starts: its config, the command's overrides included.
SWEEP_CONFIG = "multirun.yaml"
# A job stopped with its search, run again by the search's continuation (a sweeper that carries searches on).
INTERRUPTED_FILE = "interrupted.txt"
# A trial its search's pruner stopped early: its results are those of a short run.
PRUNED_FILE = "pruned.txt"
# Hydra's grid sweeper (`hydra/sweeper=basic`, what `-m` runs by default), which ignores what its jobs return.
GRID_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def in_a_search() -> bool:
    """Whether this run is a job of a search: a sweeper that optimises the `optimized_metric` its jobs return (an
    Optuna search; any sweeper but Hydra's grid). Read from the composed config, so a DDP rank that rank 0 started for
    a search's job (a single run of that job) answers as rank 0 does; a single run is refused a search's sweeper
    (`project.engine.checks`)."""
    return HydraConfig.initialized() and HydraConfig.get().sweeper.get("_target_") != GRID_SWEEPER


class JobRow(NamedTuple):
    job: str
    overrides: str
    value: float | None  # None (or NaN) where the job failed or its module logged no such metric
    directory: str
    error: str | None  # the job's error line, if it failed
    interrupted: bool = False  # stopped with its search and run again (INTERRUPTED_FILE)
    pruned: bool = False  # stopped early by its search's pruner (PRUNED_FILE)
    saved_overrides: tuple[str, ...] | None = None  # .hydra/overrides.yaml's list; None where it was not saved
    results: dict | None = None  # its results.json, where it left one


def job_rows(sweep_dir: Path, metric: str) -> list[JobRow]:
    """One row for each job directory of the sweep, in job order."""
    rows = []

    def is_job(path: Path) -> bool:  # an interrupted job may have been killed before Hydra saved its overrides
        return (path / ".hydra" / "overrides.yaml").is_file() or (path / INTERRUPTED_FILE).is_file()

    for job_dir in sorted(filter(is_job, sweep_dir.iterdir()), key=lambda path: (len(path.name), path.name)):
        overrides_file = job_dir / ".hydra" / "overrides.yaml"
        saved = tuple(yaml.safe_load(overrides_file.read_text()) or ()) if overrides_file.is_file() else None
        overrides = "(not saved)" if saved is None else " ".join(saved)
        results_file, error_file = job_dir / "results.json", job_dir / ERROR_FILE
        results = json.loads(results_file.read_text()) if results_file.is_file() else None
        value = None if results is None else results.get(metric)
        error = error_file.read_text().strip() if error_file.is_file() else None
        interrupted = (job_dir / INTERRUPTED_FILE).is_file()
        if error is None and not results_file.is_file() and not interrupted:
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


class SweepSummaryCallback(Callback):
    """Prints the sweep's table once all its jobs have ended (Hydra calls it in the launching process).

    Not where the sweep ends by an exception (a stop, SIGTERM or Ctrl-C, or a sweeper's fault): Hydra 1.4 calls this
    hook on the way out (1.3 does not), and the stop's line, which says how to carry the sweep on, stays the last
    word, with the stop's exit status (a fault keeps its traceback)."""

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        """A job that failed in an earlier run of its sweep starts without that failure's line: the sweep carried
        on runs it again, and its table shows this run's outcome."""
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
            report(format_summary(summary, summary_title(rows)))
            save_summary(summary, sweep_dir)
        failed = [row.job for row in rows if row.error]
        if failed:
            report(
                f"error: {len(failed)} of {len(rows)} sweep jobs failed (job {', '.join(failed)}): their errors are "
                "listed above and in error.txt in their directories",
                sys.stderr,
            )
            sys.exit(SWEEP_FAILED_STATUS)


def check_same_sweep(config: DictConfig) -> None:
    """Before the first job: a sweep dir that holds an earlier sweep holds this one; otherwise the sweep ends in one
    line. (An Optuna search's sweeper checks its own database.)"""
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


def refuse(line: str) -> None:
    """End the sweep in one line before any job (in a Hydra callback or sweeper, where an exception would be Hydra's
    traceback)."""
    print(f"error: {line}", file=sys.stderr, flush=True)
    sys.exit(2)


def finished_results(run_dir: str | Path) -> dict | None:
    """The results this sweep job left when an earlier run of its sweep finished it, if it did."""
    results_file = Path(run_dir) / "results.json"
    return json.loads(results_file.read_text()) if results_file.is_file() else None


def continue_hint() -> str:
    """How to carry on the sweep this job belongs to."""
    hydra = HydraConfig.get()
    given = any(override.startswith("hydra.sweep.dir=") for override in hydra.overrides.hydra)
    where = "" if given else f" plus hydra.sweep.dir={Path(hydra.sweep.dir).resolve()}"
    return f"carry the sweep on with the same command{where} (its finished jobs are not run again)"
