"""compare, which re-implements the classifier only, refuses a module of the user's own before training."""

from pathlib import Path

import pytest

from tests.helpers import REGRESSION, error_lines, train_own


@pytest.mark.slow
def test_compare_refuses_a_module_of_your_own_before_training(user_dir: Path, tmp_path: Path):
    result = train_own(user_dir, *REGRESSION, f"hydra.run.dir={tmp_path}", module="project.optional.reference.compare")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert error_lines(result.stderr) == [
        "error: model=tests.foreign_modules.RegressionModule is not a ClassifierModule: the reference path "
        "(project/optional/reference/: its scripts and compare) re-implements the classifier example only; train your "
        "own model with python -m project.train, under any trainer="
    ]
    assert "log:" not in result.stdout, "neither side was started"
