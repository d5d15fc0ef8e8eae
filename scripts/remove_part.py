"""`make remove-part PART=<name>`: delete an optional part, every path project/optional/parts.yaml lists for it, and
the entry points of pyproject.toml that name its code; then say which packages of pyproject.toml it alone needed.

In a git checkout the paths go with `git rm` (so the removal is one commit away); elsewhere they are deleted. A path
that another part still lists (the reference's FSDP script goes with either part) is deleted with the first of them.
The part's entry stays in parts.yaml, saying what was there: the tests skip what needs a part whose files are gone,
and the docs' commands that name it.
"""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
PARTS_FILE = REPO / "project" / "optional" / "parts.yaml"
PYPROJECT = REPO / "pyproject.toml"


def tracked(path: Path) -> bool:
    listed = subprocess.run(["git", "ls-files", "--error-unmatch", str(path)], cwd=REPO, capture_output=True)
    return listed.returncode == 0


def delete(path: Path) -> None:
    if tracked(path):
        subprocess.run(["git", "rm", "-r", "-q", str(path)], cwd=REPO, check=True)
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def without_entry_points(pyproject: str, modules: list[str]) -> str:
    """`pyproject`'s text without the entry points that name one of `modules` (the Optuna sweeper's, by which Hydra
    1.4 finds it), and without a section of entry points left empty, with the comment above it."""
    lines = pyproject.splitlines(keepends=True)
    kept: list[str] = []
    for line in lines:
        value = line.split("=", 1)[1].strip().strip('"') if "=" in line and not line.startswith("[") else ""
        if not any(value == module or value.startswith((f"{module}.", f"{module}:")) for module in modules):
            kept.append(line)
    text = "".join(kept)
    empty = re.compile(r'(?:#[^\n]*\n)*\[project\.entry-points\."[^"]+"\]\n(?=\n|\[|\Z)')
    return re.sub(r"\n{3,}", "\n\n", empty.sub("", text))


def main(argv: list[str]) -> int:
    parts = yaml.safe_load(PARTS_FILE.read_text())
    if len(argv) != 1 or argv[0] not in parts:
        print(f"error: name one optional part: make remove-part PART=<{' | '.join(parts)}>", file=sys.stderr)
        return 2
    name = argv[0]
    for relative in parts[name]["paths"]:
        path = REPO / relative
        if path.exists():
            delete(path)
            print(f"removed {relative}")
    modules = [path.removesuffix(".py").replace("/", ".") for path in parts[name]["paths"]]
    pyproject = PYPROJECT.read_text()
    if without_entry_points(pyproject, modules) != pyproject:
        PYPROJECT.write_text(without_entry_points(pyproject, modules))
        print("pyproject.toml: its entry points removed (reinstalled by the next make)")
    if parts[name]["packages"]:
        print(f"pyproject.toml: {', '.join(parts[name]['packages'])} may go from its dependencies now")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
