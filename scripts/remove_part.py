"""`make remove-part PART=<name>`: delete an optional part, every path project/optional/parts.yaml lists for it; then
say which packages of pyproject.toml it alone needed.

In a git checkout the paths go with `git rm` (so the removal is one commit away); elsewhere they are deleted. A path
that another part still lists (the reference's FSDP script goes with either part) is deleted with the first of them.
The part's entry stays in parts.yaml, saying what was there: the tests skip what needs a part whose files are gone,
and the docs' commands that name it.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
PARTS_FILE = REPO / "project" / "optional" / "parts.yaml"


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
    if parts[name]["packages"]:
        print(f"pyproject.toml: {', '.join(parts[name]['packages'])} may go from its dependencies now")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
