"""No release known to be bad can be installed through pyproject.toml, and none is installed.

The list is kept here, each entry with its advisory; a new advisory is one more line, and the test then fails until
the pin in pyproject.toml excludes it.
"""

import importlib.metadata
import sys

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from tests.helpers import REPO

if sys.version_info >= (3, 11):
    import tomllib
else:  # the dev extra installs it there
    import tomli as tomllib

# (distribution, the releases it names, the advisory). Lightning ships as `lightning` and as `pytorch-lightning`.
KNOWN_BAD = [
    (name, SpecifierSet(releases), advisory)
    for name in ("lightning", "pytorch-lightning")
    for releases, advisory in (
        ("==2.6.2", "GHSA-w37p-236h-pfx3: a malicious upload that stole credentials as it was imported"),
        ("==2.6.3", "GHSA-w37p-236h-pfx3: a malicious upload that stole credentials as it was imported"),
        ("<2.6.6", "GHSA-qqmf-gpg7-g8gw: loading a checkpoint runs the code its hyperparameters name"),
    )
]
# Releases to try each range with: every x.y.z up to 3.9.19 (a range admits a bad release if it admits one of these).
CANDIDATES = [Version(f"{major}.{minor}.{patch}") for major in (1, 2, 3) for minor in range(10) for patch in range(20)]


def requirements() -> dict[str, Requirement]:
    """pyproject.toml's requirements, the dev extra's included, by distribution name."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    listed = [*project["dependencies"], *project.get("optional-dependencies", {}).get("dev", [])]
    return {Requirement(line).name.lower(): Requirement(line) for line in listed}


def test_the_pin_admits_no_release_known_to_be_bad():
    required = requirements()
    admitted = [
        f"{required[name]} admits {version} ({advisory})"
        for name, bad, advisory in KNOWN_BAD
        if name in required
        for version in CANDIDATES
        if version in required[name].specifier and version in bad
    ]
    assert admitted == [], "pyproject.toml: " + "; ".join(sorted(set(admitted)))


@pytest.mark.parametrize(("name", "bad", "advisory"), KNOWN_BAD, ids=[f"{n}{s}" for n, s, _ in KNOWN_BAD])
def test_no_installed_release_is_known_to_be_bad(name: str, bad: SpecifierSet, advisory: str):
    try:
        installed = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{name} is not installed")
    assert Version(installed) not in bad, f"{name} {installed} is installed: {advisory}; reinstall with make"


def test_lightning_is_pinned():
    """The pin the tests above read: were it gone, nothing would keep a bad release out."""
    assert requirements()["lightning"].specifier, "pyproject.toml names lightning without a version range"
