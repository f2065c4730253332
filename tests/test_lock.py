"""requirements.lock, the locked install of the README: it pins every dependency of
pyproject.toml (every extra) exactly, within pyproject's ranges, and the environment the tests run
in was installed from it."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PIN = re.compile(r"([A-Za-z0-9_.\-]+)==([^\s;]+)")


def pins() -> dict[str, str]:
    """The lock's pins, ``{canonical name: version}``; every requirement line must be one."""
    out = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = PIN.fullmatch(line.strip())
        assert match, f"requirements.lock: not an exact pin: {line!r}"
        out[canonicalize_name(match[1])] = match[2]
    return out


def declared() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = [r for group in project["optional-dependencies"].values() for r in group]
    return [Requirement(r) for r in [*project["dependencies"], *extras]]


@pytest.mark.parametrize("requirement", declared(), ids=str)
def test_the_lock_pins_every_declared_dependency_within_its_range(requirement):
    locked = pins().get(canonicalize_name(requirement.name))
    assert locked is not None, f"{requirement.name} is not in requirements.lock: run " \
                               "scripts/update_lock.sh"
    assert requirement.specifier.contains(Version(locked), prereleases=True), (
        f"requirements.lock pins {requirement.name}=={locked}, outside pyproject.toml's "
        f"{requirement}: run scripts/update_lock.sh")


def test_the_lock_names_torch_s_release_not_a_local_build():
    """torch==2.13.0 takes the local CPU build where there is one and PyPI's wheel elsewhere;
    ==2.13.0+cpu would exist only here."""
    assert "+" not in pins()["torch"]


def test_the_installed_packages_are_the_lock_s_versions():
    """The README installs with -c requirements.lock: a package of another version here means
    an install that did not (its results may differ from the README's)."""
    other = {}
    for name, version in pins().items():
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # an extra not installed (docs, cluster, dashboard)
        if Version(installed).public != Version(version).public:
            other[name] = (installed, version)
    assert not other, f"installed (left) differs from requirements.lock (right): {other}"


def test_every_install_command_of_the_docs_takes_the_lock():
    texts = {p.relative_to(ROOT).as_posix(): p.read_text()
             for p in [ROOT / "README.md", ROOT / ".ci" / "run", *(ROOT / "docs").glob("*.md")]}
    installs = [(name, line) for name, text in texts.items() for line in text.splitlines()
                if re.search(r"pip install \S.* -e |pip install -e ", line)]
    assert len(installs) >= 5
    assert [i for i in installs if "-c requirements.lock" not in i[1]] == []
