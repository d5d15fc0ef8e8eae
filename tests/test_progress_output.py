"""What a log file holds of a run (a Slurm `.out`, CI, a pipe: standard output and error in one file): progress as
plain lines, no carriage-return redraws, and a failed run's `error:` line on a line of its own, last."""

import math
import re
import subprocess
from pathlib import Path

import lightning as L
import pytest
from lightning.pytorch.demos.boring_classes import BoringModel

from project.engine.reports import ProgressLines, format_results_table
from tests.faults import USER_ERROR
from tests.helpers import environment, python

DIVERGES = "model.optimizer.lr=3e7"  # the toy's loss is NaN at step 3, its second epoch's first step


def run_into_one_file(tmp_path: Path, *overrides: str, module: str = "project.train") -> tuple[int, str]:
    """A toy run on the CPU (or `module`'s, given the overrides it needs) with its standard output and error in one
    pipe, as `sbatch` writes its `.out` file: its exit status and that output, carriage returns kept (text mode would
    read them as line ends)."""
    on_cpu = ("trainer=cpu", f"hydra.run.dir={tmp_path / 'run'}") if module == "project.train" else ()
    command = [python(), "-m", module, *on_cpu, *overrides]
    result = subprocess.run(
        command, cwd=tmp_path, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300
    )
    return result.returncode, result.stdout.decode()


@pytest.mark.slow
def test_a_run_into_a_file_shows_progress_as_plain_lines_and_ends_with_its_error_line(tmp_path: Path):
    status, output = run_into_one_file(tmp_path, DIVERGES)

    assert status == USER_ERROR, output[-2000:]
    assert "\r" not in output
    progress = [line for line in output.split("\n") if re.match(r"epoch \d+ (step \d+/2|validated)", line)]
    assert [line.split(":")[0] for line in progress] == ["epoch 0 step 1/2", "epoch 0 step 2/2", "epoch 0 validated"]
    assert progress[0].startswith("epoch 0 step 1/2: train/step_loss ")
    last = output.rstrip("\n").split("\n")[-1]
    assert last.startswith("error: training diverged at step 3 "), output[-2000:]
    log_file = (tmp_path / "run" / "train.log").read_text()
    assert "epoch 0 step 2/2: train/step_loss " in log_file


@pytest.mark.slow
def test_a_bar_is_closed_before_the_error_line_and_not_drawn_again_as_the_next_job_starts(tmp_path: Path):
    """Lightning's bar, as a terminal shows it (here in a pipe, redrawn at every step): closed when the run fails,
    so its error line starts a line of its own and nothing of the bar is drawn after it. Left open, a failed sweep
    job's bar would be drawn again below its error line as the next job starts."""
    bar = ("callbacks.progress_bar.lines=false", "callbacks.progress_bar.refresh_rate=1")
    sweep = (f"hydra.sweep.dir={tmp_path / 'sweep'}", "logger=none", "model.optimizer.lr=3e7,0.1", "-m")
    status, output = run_into_one_file(tmp_path, *bar, *sweep)

    assert status == 1, output[-2000:]
    assert "\rEpoch 1: " in output, "the bar was drawn"
    rest = output.split("\nerror: training diverged at step 3 ", 1)[1]
    assert "\r" not in rest.split("[HYDRA]", 1)[0], repr(rest[:600])
    last = output.rstrip("\n").split("\n")[-1]
    assert last.startswith("error: 1 of 2 sweep jobs failed (job 0)"), repr(output[-600:])


@pytest.mark.slow
def test_a_warning_line_during_training_starts_below_the_bar(tmp_path: Path):
    """A `warning:` printed while the bar is drawn (here: the optimized metric is not logged, said at the first
    epoch's checkpoint) starts on a line of its own; the bar goes on below it."""
    bar = ("callbacks.progress_bar.lines=false", "callbacks.progress_bar.refresh_rate=1")
    status, output = run_into_one_file(tmp_path, "optimized_metric=val/nothing", *bar)

    assert status == 0, output[-2000:]
    [warning] = [line for line in output.split("\n") if "warning:" in line]
    assert warning.startswith("warning: optimized_metric=val/nothing is not logged by ClassifierModule"), warning


@pytest.mark.slow
def test_no_callbacks_draw_no_bar(tmp_path: Path):
    """`callbacks=none` means no progress either: Lightning, left to itself, would add its own bar, redraws and all."""
    status, output = run_into_one_file(tmp_path, "callbacks=none", "logger=none")

    assert status == 0, output[-2000:]
    assert "\r" not in output and "Epoch 0" not in output, repr(output[-600:])
    assert "\nepochs      3\n" in output, "the run reported its results, and the epochs it trained"


@pytest.mark.slow
def test_evaluate_and_predict_into_a_file_show_progress_as_plain_lines(tmp_path: Path):
    """As a training run does: no redraws, a line as the test or prediction goes, and evaluate's metrics with the
    results table's 4 decimals."""
    status, output = run_into_one_file(tmp_path, "logger=none")
    assert status == 0, output[-2000:]
    checkpoint = f"ckpt_path={tmp_path / 'run' / 'checkpoints' / 'last.ckpt'}"

    status, evaluated = run_into_one_file(
        tmp_path, checkpoint, f"hydra.run.dir={tmp_path / 'e'}", module="project.evaluate"
    )
    assert status == 0 and "\r" not in evaluated, repr(evaluated[-600:])
    assert re.search(r"^test step 1/1\b", evaluated, flags=re.MULTILINE), evaluated[-2000:]
    assert re.search(r"^test/loss\s+\d+\.\d{4}$", evaluated, flags=re.MULTILINE), evaluated[-2000:]

    status, predicted = run_into_one_file(
        tmp_path, checkpoint, f"hydra.run.dir={tmp_path / 'p'}", module="project.predict"
    )
    assert status == 0 and "\r" not in predicted, repr(predicted[-600:])
    assert re.search(r"^predict step 1/1\b", predicted, flags=re.MULTILINE), predicted[-2000:]


def test_progress_lines_switched_off_print_nothing_until_switched_on_again(capsys):
    """Lightning's tuners (`Tuner.lr_find`, `scale_batch_size`) switch the progress bar off for their trial steps and
    on again for the training after them."""
    lines = ProgressLines(lines_per_epoch=1)
    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_model_summary=False, callbacks=[lines])
    lines.disable()
    lines.step_line("epoch 0", 4, 4, trainer, BoringModel())
    lines.on_validation_end(trainer, BoringModel())
    assert capsys.readouterr().out == ""
    lines.enable()
    lines.step_line("epoch 0", 4, 4, trainer, BoringModel())
    lines.on_validation_end(trainer, BoringModel())
    assert capsys.readouterr().out.splitlines() == ["epoch 0 step 4/4", "epoch 0 validated"]


def test_a_metric_named_with_a_prefix_that_is_no_stage_has_its_own_line_in_the_results_table():
    """LearningRateMonitor's `lr-Adam/pg1`, a GAN's `gan/d_loss`: not a row of `-` under train, val and test."""
    run = {"epochs": 1, "world_size": 1, "fit_seconds": 1.0, "samples_per_second": 10.0, "run_dir": "/runs/0"}
    table = format_results_table({"val/acc": 0.75, "lr-Adam/pg1": 0.01, "gan/d_loss": 0.5, **run})
    rows = {line.split()[0]: line.split()[1:] for line in table.splitlines() if line[:1] not in ("-", " ")}
    assert (rows["acc"], rows["lr-Adam/pg1"], rows["gan/d_loss"]) == (["-", "0.7500", "-"], ["0.0100"], ["0.5000"])
    assert "pg1" not in rows and "d_loss" not in rows


def test_the_results_tables_columns_line_up_under_a_long_metric_name():
    """The names' column is as wide as the longest name and two spaces, at least 10: each value right-aligned in 10
    characters after it, in every row and the header, a metric of no stage's too."""
    run = {"epochs": 1, "world_size": 1, "fit_seconds": 1.0, "samples_per_second": 10.0, "run_dir": "/runs/0"}
    table = format_results_table({"val/reconstruction_loss": 0.25, "test/acc": 1.0, "lr-Adam": 0.01, **run})
    assert table.splitlines()[:7] == [
        "-" * 51,
        "Results",
        "-" * 51,
        " " * 21 + "     train       val      test",
        "reconstruction_loss           -    0.2500         -",
        "acc                           -         -    1.0000",
        "lr-Adam                  0.0100",
    ]
    short = format_results_table({"val/acc": 0.5, **run}).splitlines()
    assert short[:5] == [
        "-" * 48,
        "Results",
        "-" * 48,
        " " * 10 + "     train       val      test",
        "acc" + " " * 16 + "-    0.5000         -",
    ]


@pytest.mark.parametrize("stage", ["test", "predict"])
def test_a_test_or_prediction_prints_a_line_at_each_of_its_steps_counted_from_one(stage: str, capsys):
    """Four lines an epoch over four batches: steps 1/4 to 4/4, whichever dataloader's count (`test step 3/4`)."""
    lines = ProgressLines(lines_per_epoch=4)
    trainer = L.Trainer(
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=[lines],
        limit_test_batches=4,
        limit_predict_batches=4,
    )
    getattr(trainer, stage)(BoringModel())
    printed = [line.split(":")[0] for line in capsys.readouterr().out.splitlines() if line.startswith(stage)]
    assert printed == [f"{stage} step {step}/4" for step in (1, 2, 3, 4)]


def test_an_epoch_of_ten_steps_in_four_lines_prints_every_third_step_and_its_last(capsys):
    """`lines_per_epoch` lines at most, at every ceil(steps / lines)-th step, and the epoch's last; an epoch of no known
    length (an iterable dataset) at every 100th step, with no total."""
    lines = ProgressLines(lines_per_epoch=4)
    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_model_summary=False, callbacks=[lines])
    for step in range(1, 11):
        lines.step_line("epoch 0", step, 10, trainer, BoringModel())
    for step in range(1, 201):
        lines.step_line("epoch 1", step, math.inf, trainer, BoringModel())
    for step in range(1, 1002):  # a count Python does not keep one object of (above 256): still the last step
        lines.step_line("epoch 2", step, int("1001"), trainer, BoringModel())
    assert capsys.readouterr().out.splitlines() == [
        "epoch 0 step 3/10",
        "epoch 0 step 6/10",
        "epoch 0 step 9/10",
        "epoch 0 step 10/10",
        "epoch 1 step 100",
        "epoch 1 step 200",
        "epoch 2 step 251/1001",
        "epoch 2 step 502/1001",
        "epoch 2 step 753/1001",
        "epoch 2 step 1001/1001",
    ]


def test_a_run_that_logged_nothing_and_kept_no_history_says_so_in_its_results_table():
    """No metric, no header row; no speed (no history kept) and no wall time: said, not a number made up."""
    run = {"epochs": 0, "world_size": 2, "fit_seconds": math.nan, "samples_per_second": None, "run_dir": "/runs/0"}
    assert format_results_table(run).splitlines()[3:-1] == [
        "metrics     none logged (self.log in the module's steps puts them here)",
        "epochs      0",
        "processes   2",
        "wall time   - (fit: train + validation)",
        "samples/s   - (not known: no history was kept, or a batch's size could not be read)",
        "weights     last (val and test)",
        "run dir     /runs/0",
    ]


def test_a_progress_line_shows_every_metric_but_lightnings_version_number_floats_in_four_digits(capsys):
    """Ten lines an epoch by default; each with what the module logs to the bar, in its order."""
    lines = ProgressLines()
    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_model_summary=False, callbacks=[lines])
    shown = {"v_num": 3, "val/acc": 0.123456, "a": 1.0, "x_count": 7}
    lines.get_metrics = lambda trainer, module: shown
    for step in range(1, 201):
        lines.step_line("epoch 0", step, 200, trainer, BoringModel())
    printed = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in printed] == [f"epoch 0 step {step}/200" for step in range(20, 201, 20)]
    assert printed[0] == "epoch 0 step 20/200: val/acc 0.1235, a 1, x_count 7"
