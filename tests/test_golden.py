"""Golden curves (tests/golden_curves.py, docs/testing.md): each shipped recipe trains the per-step losses recorded in
tests/golden/, bitwise under the key they were recorded under and within a stated tolerance of the closest key
elsewhere; `make golden`'s report says what moved, against which key, from which step."""

import copy
import warnings
from pathlib import Path

import pytest

from scripts import golden
from tests import golden_curves
from tests.golden_curves import RECIPES, curves_of, drift, judged, key_of, recorded, train
from tests.helpers import requires

KEY = {
    "device": "Intel(R) Xeon(R) Processor",
    "cpuid": "GenuineIntel 6/167/1",
    "cpu_features": "fc7df03f53a7",
    "isa_level": "x86-64-v4",
    "cpu_capability": "AVX512",
    "threads": 1,
    "python": "3.11",
    "torch": "2.14.1",
    "torchvision": "0.29.1",
    "lightning": "2.6.6",
    "numpy": "2.4.6",
}
LOSSES = [[0.75, 0.5, 0.25], [0.7, 0.4, 0.2]]


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", [pytest.param(name, marks=[requires(r.part)] if r.part else []) for name, r in RECIPES.items()]
)
def test_a_shipped_recipe_trains_its_golden_curve(name: str, tmp_path: Path):
    run_dir = train(name, tmp_path)
    same, comparison = judged(recorded(name), key_of(run_dir), curves_of(run_dir))
    assert same, f"{name}: {comparison}; where the change is meant, `make golden` records the new curve"
    if "this very key" not in comparison:
        warnings.warn(f"golden curve of {name}: {comparison}", stacklevel=1)


def test_under_the_recorded_key_one_step_off_in_its_last_bit_is_a_change_named_by_its_step():
    moved = copy.deepcopy(LOSSES)
    moved[1][0] = 0.7000000000000001
    same, comparison = judged([{"key": KEY, "losses": LOSSES}], KEY, moved)
    assert not same
    assert comparison == "against the curve recorded under this very key: max relative difference 1.6e-16 from step 4"


def test_under_another_key_the_closest_is_compared_within_the_tolerance_and_named():
    newer = {**KEY, "torch": "2.15.0"}
    other_cpu = {**KEY, "device": "AMD EPYC", "cpuid": "AuthenticAMD 25/1/1", "cpu_capability": "AVX2"}
    entries = [{"key": other_cpu, "losses": [[9.0] * 3] * 2}, {"key": KEY, "losses": LOSSES}]
    close = [[0.75, 0.5, 0.25], [0.7, 0.40000004, 0.2]]
    same, comparison = judged(entries, newer, close)
    assert same
    assert comparison == (
        "no curve is recorded under this key; against the closest key recorded (torch 2.14.1 → 2.15.0): "
        "max relative difference 1.0e-07 from step 5, tolerance 0.0001"
    )
    assert not judged(entries, newer, [[0.75, 0.5, 0.25], [0.7, 0.4001, 0.2]])[0]


def test_another_number_of_steps_is_no_curve_within_any_tolerance():
    found = drift(LOSSES, [LOSSES[0], LOSSES[1][:2]])
    assert not found.within_tolerance and str(found) == "another number of steps per rank: [3, 2]"


def test_make_golden_reports_what_moved_and_keeps_the_report_in_the_testing_page(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(golden_curves, "GOLDEN_DIR", tmp_path / "golden")
    assert golden.recipe_line("toy", KEY, LOSSES) == "toy: first recorded (6 steps)"
    golden_curves.record("toy", KEY, LOSSES)
    newer = {**KEY, "torch": "2.15.0"}
    moved = [[0.75, 0.5, 0.25], [0.7, 0.4, 0.20000002]]
    assert golden.recipe_line("toy", newer, moved) == (
        "toy: torch 2.14.1 → 2.15.0: max relative difference 1.0e-07 from step 6 (6 steps)"
    )
    golden_curves.record("toy", newer, moved)
    assert [entry["key"]["torch"] for entry in recorded("toy")] == ["2.14.1", "2.15.0"]
    assert golden.recipe_line("toy", newer, moved) == "toy: exact (6 steps)"

    page = tmp_path / "testing.md"
    page.write_text(f"before\n{golden.REPORT_START}\nold report\n{golden.REPORT_END}\nafter\n")
    monkeypatch.setattr(golden, "TESTING_PAGE", page)
    golden.keep_in_page(["make golden, today", "  toy: exact (6 steps)"])
    assert page.read_text() == (
        f"before\n{golden.REPORT_START}\n```text\nmake golden, today\n  toy: exact (6 steps)\n```\n"
        f"{golden.REPORT_END}\nafter\n"
    )
