"""The bench's image_folder suite (bench/image_folder.py), `python -m bench --quick --only image_folder`: its JSON has
the keys the docs quote and its rows are in the table (tests/bench_runs.py runs it)."""

from pathlib import Path

import pytest

from bench import image_folder
from tests.bench_runs import one_thread, run_quick_bench  # noqa: F401  (one_thread: autouse)

pytestmark = [pytest.mark.slow, pytest.mark.realdata]


def test_image_folder_times_the_loader_against_decoding_and_training(tmp_path: Path, capsys):
    stdout, results = run_quick_bench(tmp_path, capsys, "--only", "image_folder")

    folder = results["image_folder"]
    passes = {"data module", "plain decode", "training, 0 workers", "training, 2 workers"}
    assert set(folder["samples_per_second"]) == passes
    assert folder["training_images"] == 10 * image_folder.PER_CLASS["quick"]  # Fashion-MNIST's 10 classes
    assert folder["loader_vs_training"]["median"] > 0
    assert "image folder: data module / plain decode" in stdout
    assert "image folder: loader / CNN training" in stdout
