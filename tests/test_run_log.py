"""A run's log file holds what its console showed, so a failed run leaves something to diagnose from."""

from pathlib import Path

from tests.helpers import check_ok, run_module


def test_train_log_holds_lightnings_messages_warnings_and_the_results_table(tmp_path: Path):
    result = check_ok(run_module("project.train", "logger=none", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path))
    log = (tmp_path / "run" / "train.log").read_text()
    assert "GPU available: False" in log and "GPU available: False" in result.stderr, "Lightning's own messages"
    assert "Results" in log and "run dir" in log, "the results table"
    assert "seed: 123" in log, "the config as printed"
    assert result.stderr.count("GPU available") == 1, "each message shown once on the console"


def test_a_bad_value_is_checked_before_the_config_is_printed_and_stays_in_the_log(tmp_path: Path):
    result = run_module("project.train", "seed=-1", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert result.returncode == 2
    assert "Config" not in result.stdout, "nothing but the error line to read"
    line = "error: seed must be an integer from 0 to 2**32 - 1, got -1"
    assert result.stderr.strip().splitlines()[-1] == line
    assert line in (tmp_path / "run" / "train.log").read_text()
    assert (tmp_path / "run" / ".hydra" / "config.yaml").is_file(), "the config is kept in the run dir either way"
