"""Real Fashion-MNIST (Debian's dataset-fashion-mnist), where this machine has it."""

from pathlib import Path

import pytest

from tests.helpers import FASHION_MNIST_DEBIAN, check_ok, read_json, run_module

pytestmark = [pytest.mark.slow, pytest.mark.realdata]


def link_fashion_mnist(root: Path) -> Path:
    raw = root / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for packed in FASHION_MNIST_DEBIAN.glob("*.gz"):
        (raw / packed.name).symlink_to(packed)
    return root


def test_mnist_recipe_reaches_83_percent_on_fashion_mnist_in_two_epochs(tmp_path: Path):
    root = link_fashion_mnist(tmp_path / "data")
    check_ok(
        run_module(
            "project.train",
            "experiment=mnist",
            "data=fashion_mnist",
            f"data.root={root}",
            "data.download=false",
            "trainer.max_epochs=2",
            "logger=none",
            f"hydra.run.dir={tmp_path / 'run'}",
            cwd=tmp_path,
        )
    )
    results = read_json(tmp_path / "run" / "results.json")
    print(f"Fashion-MNIST, 2 epochs: test accuracy {results['test/acc']:.4f}")
    assert results["test/acc"] >= 0.83
    assert results["epochs"] == 2
