"""The summary a sweep ends with where it repeats a configuration (seeds, folds, a search's repeated points): its
numbers, printed and in summary.json, are the mean, sample std, min, max and n of the jobs' results.json; a sweep that
repeats nothing has none."""

import json
import re
import statistics
from pathlib import Path

import pytest
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import OmegaConf

from project.engine.errors import ERROR_FILE
from project.engine.sweeps import (
    INTERRUPTED_FILE,
    PRUNED_FILE,
    SUMMARY_FILE,
    SWEEP_CONFIG,
    SweepSummaryCallback,
    check_same_sweep,
    in_a_search,
)
from project.engine.upstream import GRID_SWEEPER
from tests.faults import ENV
from tests.helpers import check_ok, read_json, run_module

PRINTED = 5e-5  # the summary prints 4 decimals
# Searches: one of Hydra's plugins, and a user's own (their names sort after and before the grid sweeper's).
NEVERGRAD = "hydra_plugins.hydra_nevergrad_sweeper.nevergrad_sweeper.NevergradSweeper"
USERS_OWN = "acme.sweepers.BayesSweeper"
CELL = re.compile(r"^(?P<mean>[-\d.]+)(?: ± (?P<std>[\d.]+) \((?P<min>[-\d.]+)–(?P<max>[-\d.]+)\))?(?: \[n=\d+\])?$")


def write_job(sweep: Path, job: int, overrides: list[str], results: dict | None = None, mark: str | None = None):
    """A job dir as a job leaves it: its overrides, its results.json (unless it failed), a mark file if any."""
    job_dir = sweep / str(job)
    (job_dir / ".hydra").mkdir(parents=True)
    (job_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {override}\n" for override in overrides))
    if results is not None:
        (job_dir / "results.json").write_text(json.dumps({**results, "epochs": 2, "run_dir": str(job_dir)}))
    if mark is not None:
        (job_dir / mark).write_text(f"{mark}: ...\n")


def end_sweep(sweep: Path, capsys: pytest.CaptureFixture, metric: str = "val/acc") -> str:
    """What the sweep prints as it ends (`SweepSummaryCallback`), as the launching process calls it."""
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}, "optimized_metric": metric})
    SweepSummaryCallback().on_multirun_end(config)
    return capsys.readouterr().out


def printed_summary(output: str) -> dict[str, tuple[int, dict[str, str], str]]:
    """overrides → (n, metric → cell, what follows the cells) of each line of the printed summary."""
    lines = output.splitlines()
    title = next(index for index, line in enumerate(lines) if line.startswith("Over "))
    header = re.split(r"\s{2,}", lines[title + 2])
    assert header[:2] == ["overrides", "n"], header
    rows = {}
    for line in lines[title + 3 :]:
        if line.startswith("---"):
            break
        cells = re.split(r"\s{2,}", line)
        rows[cells[0]] = (int(cells[1]), dict(zip(header[2:], cells[2:], strict=False)), cells[len(header) :])
    return rows


def stored_summary(sweep: Path) -> list[dict]:
    return json.loads((sweep / SUMMARY_FILE).read_text())


def expected(values: list[float]) -> dict:
    std = statistics.stdev(values) if len(values) > 1 else None
    return {"mean": statistics.fmean(values), "std": std, "min": min(values), "max": max(values), "n": len(values)}


def assert_cell_shows(cell: str, numbers: dict) -> None:
    shown = CELL.match(cell)
    assert shown, cell
    for key in ("mean", "std", "min", "max"):
        if numbers["n"] > 1 or key == "mean":
            assert abs(float(shown[key]) - numbers[key]) <= PRINTED, (cell, numbers)
        else:
            assert shown[key] is None, f"{cell}: one job, no spread"


def assert_summary_matches_the_jobs(sweep: Path, output: str, metric: str, groups: dict[str, list[str]]) -> None:
    """Each configuration's numbers, printed and in summary.json, from the results.json of its jobs (`groups`)."""
    stored = {" ".join(entry["overrides"]): entry for entry in stored_summary(sweep)}
    printed = printed_summary(output)
    assert set(stored) == set(printed) == set(groups)
    for overrides, jobs in groups.items():
        results = [read_json(sweep / job / "results.json") for job in jobs]
        names = [metric, *(name for name in results[0] if name.startswith("test/"))]
        n, cells, _ = printed[overrides]
        assert n == stored[overrides]["n"] == len(jobs) and stored[overrides]["jobs"] == jobs
        assert list(stored[overrides]["metrics"]) == names
        for name in names:
            numbers = expected([result[name] for result in results])
            assert stored[overrides]["metrics"][name] == pytest.approx(numbers), name
            assert_cell_shows(cells[name], numbers)


def jobs_table(output: str, sweep: Path) -> list[str]:
    """The jobs table a sweep's output begins with, its rules (as long as its longest line) written RULE and the
    sweep's dir SWEEP."""
    lines = output.splitlines()
    lines = lines[: lines.index(lines[0], 3) + 1]  # up to its third rule
    rule = "-" * max(len(line) for line in lines)
    return ["RULE" if line == rule else line.replace(str(sweep), "SWEEP") for line in lines]


def test_the_jobs_table_lines_its_columns_up_under_their_names(tmp_path: Path, capsys):
    """Each job a line: the overrides padded to the longest of them and two spaces, the metric right-aligned under its
    name, then the job's dir; rules as long as the longest line."""
    write_job(tmp_path, 0, ["model.optimizer.lr=0.25", "seed=1"], {"val/acc": 0.91})
    write_job(tmp_path, 1, ["seed=2"], {"val/acc": 0.875})
    assert jobs_table(end_sweep(tmp_path, capsys), tmp_path) == [
        "RULE",
        "Sweep: 2 job(s)",
        "RULE",
        "job  overrides                            val/acc  dir",
        "0    model.optimizer.lr=0.25 seed=1        0.9100  SWEEP/0",
        "1    seed=2                                0.8750  SWEEP/1",
        "RULE",
    ]


def test_the_jobs_table_says_what_kept_a_job_from_its_value_and_its_title_counts_them(tmp_path: Path, capsys):
    """A pruned, a failed and an interrupted job (stopped before Hydra saved its overrides) each say so in the value
    column; the title counts the failed and the pruned; the failed job's error follows the lines of the jobs."""
    write_job(tmp_path, 0, ["seed=1"], {"val/acc": 0.91})
    write_job(tmp_path, 1, ["seed=2"], {"val/acc": 0.5}, mark=PRUNED_FILE)
    write_job(tmp_path, 2, ["seed=3"], mark=ERROR_FILE)
    (tmp_path / "3").mkdir()
    (tmp_path / "3" / INTERRUPTED_FILE).write_text("interrupted")
    with pytest.raises(SystemExit):
        end_sweep(tmp_path, capsys)
    assert jobs_table(capsys.readouterr().out, tmp_path) == [
        "RULE",
        "Sweep: 4 job(s), 1 failed, 1 pruned",
        "RULE",
        "job  overrides         val/acc  dir",
        "0    seed=1             0.9100  SWEEP/0",
        "1    seed=2             pruned  SWEEP/1",
        "2    seed=3             failed  SWEEP/2",
        "3    (not saved)   interrupted  SWEEP/3",
        "job 2 error.txt: ...",
        "RULE",
    ]


def test_a_seed_sweep_ends_with_each_configurations_mean_std_min_max_and_n(tmp_path: Path, capsys):
    """`-m model.optimizer.lr=0.1,0.5 seed=1,2,3`: one line per lr, over its three seeds."""
    for job, (lr, seed) in enumerate((lr, seed) for lr in ("0.1", "0.5") for seed in (1, 2, 3)):
        accuracy = 0.9 + 0.013 * job + 0.002 * seed**2
        results = {"val/acc": accuracy, "train/loss": 0.4, "test/loss": 1.1 - accuracy, "test/acc": accuracy - 0.01}
        write_job(tmp_path, job, [f"model.optimizer.lr={lr}", f"seed={seed}", "trainer.max_epochs=2"], results)
    output = end_sweep(tmp_path, capsys)
    assert "\nOver seed: " in output
    groups = {"model.optimizer.lr=0.1 trainer.max_epochs=2": ["0", "1", "2"]}
    groups["model.optimizer.lr=0.5 trainer.max_epochs=2"] = ["3", "4", "5"]
    assert_summary_matches_the_jobs(tmp_path, output, "val/acc", groups)


def test_failed_interrupted_and_pruned_jobs_are_left_out_and_counted(tmp_path: Path, capsys):
    """Only the finished job counts (n=1: its value, no spread), also where the others left results (the failed job
    wrote them before it failed, the interrupted one in an earlier run); the sweep still ends with exit 1 for the
    failure."""
    write_job(tmp_path, 0, ["seed=1"], {"val/acc": 0.75, "test/acc": 0.5})
    write_job(tmp_path, 1, ["seed=2"], {"val/acc": 0.125, "test/acc": 0.125}, mark=ERROR_FILE)
    write_job(tmp_path, 2, ["seed=3"], {"val/acc": 0.25, "test/acc": 0.25}, mark=PRUNED_FILE)
    write_job(tmp_path, 3, ["seed=4"], {"val/acc": 0.375, "test/acc": 0.375}, mark=INTERRUPTED_FILE)
    with pytest.raises(SystemExit) as ended:
        end_sweep(tmp_path, capsys)
    assert ended.value.code == 1
    output = capsys.readouterr().out
    assert printed_summary(output) == {"(none)": (1, {"val/acc": "0.7500", "test/acc": "0.5000"}, ["(3 left out)"])}
    [entry] = stored_summary(tmp_path)
    assert (entry["n"], entry["left_out"], entry["jobs"]) == (1, 3, ["0"])
    assert entry["metrics"]["val/acc"] == {"mean": 0.75, "std": None, "min": 0.75, "max": 0.75, "n": 1}


def test_folds_and_seeds_together_are_one_configuration_of_n_jobs(tmp_path: Path, capsys):
    """`-m seed=1,2 data.folds=3 'data.fold=range(3)'`: n = 6; `data.folds=3` stays in the configuration."""
    for job in range(6):
        seed, fold = 1 + job // 3, job % 3
        results = {"val/acc": 0.8 + 0.03 * fold - 0.01 * seed, "test/loss": 0.3 + 0.02 * job}
        write_job(tmp_path, job, [f"seed={seed}", "data.folds=3", f"data.fold={fold}"], results)
    output = end_sweep(tmp_path, capsys)
    assert "\nOver seed and data.fold: " in output
    assert_summary_matches_the_jobs(tmp_path, output, "val/acc", {"data.folds=3": [str(job) for job in range(6)]})


def test_a_search_that_meets_a_point_twice_summarises_it_and_a_metric_nobody_logged_is_a_dash(tmp_path: Path, capsys):
    """Identical overrides group without any seed; a module that logs no optimized_metric still has its n and its
    test metrics."""
    write_job(tmp_path, 0, ["model.optimizer.lr=0.1"], {"test/loss": 0.5})
    write_job(tmp_path, 1, ["model.optimizer.lr=0.2"], {"test/loss": 0.25})
    write_job(tmp_path, 2, ["model.optimizer.lr=0.1"], {"test/loss": 0.75})
    output = end_sweep(tmp_path, capsys)
    assert "\nOver repeated configurations: " in output
    printed = printed_summary(output)
    assert printed["model.optimizer.lr=0.1"][:2] == (
        2,
        {"val/acc": "-", "test/loss": "0.6250 ± 0.1768 (0.5000–0.7500)"},
    )
    assert printed["model.optimizer.lr=0.2"][:2] == (1, {"val/acc": "-", "test/loss": "0.2500"})
    stored = stored_summary(tmp_path)
    assert stored[0]["metrics"]["val/acc"] == {"mean": None, "std": None, "min": None, "max": None, "n": 0}
    assert stored[0]["metrics"]["test/loss"]["std"] == pytest.approx(statistics.stdev([0.5, 0.75]))


def test_a_metric_some_jobs_did_not_log_shows_its_own_n_in_a_sweep_of_hundreds(tmp_path: Path, capsys):
    """A cell whose metric fewer jobs logged than the configuration counts says how many did (`[n=...]`); one all its
    jobs logged says nothing more, also past 256 jobs (an Optuna search of 300 trials, seeds by the hundred)."""
    for seed in range(257):
        tested = {"test/acc": 0.5} if seed else {}
        write_job(tmp_path, seed, [f"seed={seed}"], {"val/acc": 0.75, **tested})
    printed = printed_summary(end_sweep(tmp_path, capsys))
    assert printed["(none)"][:2] == (
        257,
        {"val/acc": "0.7500 ± 0.0000 (0.7500–0.7500)", "test/acc": "0.5000 ± 0.0000 (0.5000–0.5000) [n=256]"},
    )


def test_a_job_is_in_a_search_under_any_sweeper_but_hydras_grid(monkeypatch):
    """A search optimises what its jobs return (a job that logs no objective fails its trial); Hydra's grid sweeper,
    and a plain run, only run them."""
    hydra = HydraConfig.instance()
    monkeypatch.setattr(hydra, "cfg", None)
    assert not in_a_search(), "a plain run"
    for sweeper, searching in [(GRID_SWEEPER, False), (NEVERGRAD, True), (USERS_OWN, True)]:
        # Read from YAML, as Hydra reads a config: a string of its own, not this module's constant.
        monkeypatch.setattr(hydra, "cfg", OmegaConf.create(f"hydra: {{sweeper: {{_target_: {sweeper}}}}}"))
        assert in_a_search() == searching, sweeper


@pytest.mark.parametrize(
    ("theirs", "mine", "named"),
    [
        (["seed=1,2"], ["seed=3,4"], "(seed=1,2; this one: seed=3,4)"),
        (["seed=3,4"], ["seed=1,2"], "(seed=3,4; this one: seed=1,2)"),
        ([], ["seed=1"], "(no overrides; this one: seed=1)"),
        (["seed=1"], [], "(seed=1; this one: no overrides)"),
    ],
)
def test_a_sweep_dir_holding_another_sweep_is_refused_whichever_sorts_first(
    tmp_path: Path, capsys, theirs, mine, named
):
    """Job N of the sweep there is not job N of this one: refused before any job, in one line, whatever the two
    sweeps' overrides are; the same sweep is carried on."""
    OmegaConf.save({"hydra": {"overrides": {"task": theirs}}}, tmp_path / SWEEP_CONFIG)
    for overrides, refused in [(mine, True), (theirs, False)]:
        config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}, "overrides": {"task": overrides}}})
        if refused:
            with pytest.raises(SystemExit) as ended:
                check_same_sweep(config)
            assert ended.value.code == 2
            [line] = capsys.readouterr().err.splitlines()
            assert line.startswith(f"error: hydra.sweep.dir={tmp_path} holds another sweep {named}, whose"), line
        else:
            check_same_sweep(config)
            assert (
                capsys.readouterr().out
                == f"carrying on the sweep in {tmp_path}: its finished jobs are not run again, a stopped one resumes\n"
            )


@pytest.mark.parametrize(
    "overrides",
    [
        [["model.optimizer.lr=0.1"], ["model.optimizer.lr=0.5"]],
        [["model.optimizer.lr=0.1", "seed=7"], ["model.optimizer.lr=0.5", "seed=7"]],
    ],
    ids=["grid", "grid-of-one-seed"],
)
def test_a_grid_that_repeats_nothing_prints_no_summary(tmp_path: Path, capsys, overrides: list[list[str]]):
    for job, job_overrides in enumerate(overrides):
        write_job(tmp_path, job, job_overrides, {"val/acc": 0.5 + job / 10, "test/acc": 0.5})
    output = end_sweep(tmp_path, capsys)
    assert "Sweep: 2 job(s)" in output and "Over " not in output and "±" not in output
    assert not (tmp_path / SUMMARY_FILE).exists()


@pytest.mark.slow
def test_a_toy_sweep_over_seeds_and_folds_ends_with_its_summary_of_four_jobs(tmp_path: Path):
    """`-m seed=1,2 data.folds=2 'data.fold=range(2)'`: both folds of each seed's folds, summarised as one."""
    sweep = tmp_path / "sweep"
    overrides = ("seed=1,2", "data.folds=2", "data.fold=range(2)", "trainer.max_epochs=2", "logger=none")
    result = check_ok(run_module("project.train", "-m", *overrides, f"hydra.sweep.dir={sweep}", cwd=tmp_path, env=ENV))
    assert "\nOver seed and data.fold: " in result.stdout
    configuration = "data.folds=2 trainer.max_epochs=2 logger=none"
    assert_summary_matches_the_jobs(sweep, result.stdout, "val/acc", {configuration: ["0", "1", "2", "3"]})
    assert stored_summary(sweep)[0]["n"] == 4


def test_a_job_run_again_by_the_sweep_carried_on_starts_without_its_earlier_failures_line(tmp_path: Path):
    """Under any launcher: the job's start (Hydra's `on_job_start`, in whichever process runs it) removes the
    error.txt an earlier run of the sweep left, so the table shows this run's outcome; a single run's is left alone."""
    job_dir = tmp_path / "0"
    job_dir.mkdir()
    (job_dir / ERROR_FILE).write_text("error: the earlier failure\n")
    for mode, kept in ((RunMode.RUN, True), (RunMode.MULTIRUN, False), (RunMode.MULTIRUN, False)):
        config = OmegaConf.create({"hydra": {"mode": mode, "runtime": {"output_dir": str(job_dir)}}})
        # The last: a job with no earlier failure (Hydra would print a callback's exception as a warning each job).
        SweepSummaryCallback().on_job_start(config)
        assert (job_dir / ERROR_FILE).is_file() == kept, mode


def test_a_job_that_left_neither_results_nor_an_error_is_a_failure_saying_it_may_have_been_killed(
    tmp_path: Path, capsys
):
    """A job killed from outside (out of memory, `kill -9`) writes nothing more; the sweep still counts it."""
    write_job(tmp_path, 0, ["seed=1"], {"val/acc": 0.75})
    write_job(tmp_path, 1, ["seed=2"])
    with pytest.raises(SystemExit) as ended:
        end_sweep(tmp_path, capsys)
    assert ended.value.code == 1
    captured = capsys.readouterr()
    killed = "error: the job left no results.json (killed?): see its log in that directory"
    assert f"job 1 {killed}" in captured.out.splitlines()
    assert "1 of 2 sweep jobs failed (job 1)" in captured.err


def test_a_sweep_that_ends_by_an_exception_or_made_no_directory_prints_no_table(tmp_path: Path, capsys):
    """The exception's own line (how to carry the sweep on) stays the last one printed."""
    write_job(tmp_path, 0, ["seed=1"], {"val/acc": 0.5})
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt:
        assert end_sweep(tmp_path, capsys) == ""
    assert end_sweep(tmp_path / "never-made", capsys) == ""
    assert "Sweep: 1 job(s)" in end_sweep(tmp_path, capsys), "the same sweep ended without an exception: its table"
