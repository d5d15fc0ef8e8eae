"""`trainer=dp` on a module of the user's own: it names the attribute that holds its network."""

from pathlib import Path

import pytest

from tests.helpers import REGRESSION, check_ok, read_json, train_own


@pytest.mark.slow
def test_dataparallel_replicates_the_network_attribute_it_is_told(user_dir: Path, tmp_path: Path):
    """The classifier's is `network`; a module of your own names its own, or is refused in one line."""
    refused = train_own(user_dir, *REGRESSION, "trainer=dp", f"hydra.run.dir={tmp_path}/a")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "set trainer.strategy.module_attribute=<the attribute that holds its network>" in refused.stderr
    check_ok(
        train_own(
            user_dir,
            *REGRESSION,
            "trainer=dp",
            "trainer.strategy.module_attribute=layers",
            "trainer.max_epochs=1",
            "logger=none",
            f"hydra.run.dir={tmp_path}/b",
        )
    )
    assert read_json(tmp_path / "b" / "results.json")["epochs"] == 1
