"""`make golden` (`python -m scripts.golden`): train every shipped recipe, record its per-step losses in tests/golden/
under this machine's and these versions' key, and report what moved against the closest key recorded before (`make
lock` runs it after a version bump). The report is printed and kept in docs/testing.md ("Golden curves"), dated, with
the key it was measured under. tests/golden_curves.py holds the recipes, the key and the comparison;
tests/test_golden.py checks them.
"""

import datetime
import re
import sys
import tempfile
from pathlib import Path

from tests.golden_curves import RECIPES, closest, curves_of, drift, key_changes, key_of, record, recorded, train
from tests.helpers import REPO, fresh_interpreters, part_present

TESTING_PAGE = REPO / "docs" / "testing.md"
REPORT_START = "<!-- make golden writes its last report here -->"
REPORT_END = "<!-- end of make golden's report -->"


def recipe_line(name: str, key: dict, losses: list[list[float]]) -> str:
    """What moved in one recipe against the closest curve recorded before: `exact`, or the keys' differences and the
    largest relative difference from its first step."""
    before = closest(recorded(name), key)
    steps = f"{sum(map(len, losses))} steps"
    if before is None:
        return f"{name}: first recorded ({steps})"
    changes = key_changes(before["key"], key)
    return f"{name}: {changes + ': ' if changes else ''}{drift(before['losses'], losses)} ({steps})"


def key_line(key: dict) -> str:
    versions = ", ".join(f"{name} {key[name]}" for name in ("python", "torch", "torchvision", "lightning", "numpy"))
    threads = f"{key['threads']} thread{'s' if key['threads'] != 1 else ''}"
    cpu = f"{key['cpuid']}, features {key['cpu_features']}, {key['isa_level']}, torch's {key['cpu_capability']}"
    return f"{key['device']} ({cpu}), {threads}; {versions}"


def keep_in_page(report: list[str]) -> None:
    """Put the report between the page's two markers, replacing the last one."""
    page = TESTING_PAGE.read_text()
    block = "\n".join([REPORT_START, "```text", *report, "```", REPORT_END])
    pattern = re.escape(REPORT_START) + r".*?" + re.escape(REPORT_END)
    TESTING_PAGE.write_text(re.sub(pattern, lambda _: block, page, count=1, flags=re.DOTALL))


def main() -> int:
    lines, key = [], None
    with tempfile.TemporaryDirectory(prefix="golden-") as scratch, fresh_interpreters():
        for name, recipe in RECIPES.items():
            if recipe.part and not part_present(recipe.part):
                lines.append(f"{name}: not run (the optional part {recipe.part} is deleted here)")
                continue
            directory = Path(scratch) / name
            directory.mkdir()
            run_dir = train(name, directory)
            key, losses = key_of(run_dir), curves_of(run_dir)
            lines.append(recipe_line(name, key, losses))
            record(name, key, losses)
            print(lines[-1], flush=True)
    report = [f"make golden, {datetime.date.today()}: {key_line(key)}", *(f"  {line}" for line in lines)]
    keep_in_page(report)
    print(f"{report[0]}\nrecorded in tests/golden/; this report in {TESTING_PAGE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
