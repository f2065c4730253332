"""Docstrings that name the package's modules and objects name ones that exist, and a list of a
package's modules lists all of them."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import lmablate.report

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "lmablate"
# a Sphinx role naming a qualified object of this package; a target may be broken over two
# lines after a dot (":mod:`lmablate.report.figures.\n    tuning_figure`")
ROLE = re.compile(r":(?:mod|func|class|meth|attr|data|exc):`~?(lmablate(?:\.\s*\w+)*)`")


def test_report_docstring_lists_every_module_of_the_report_package_once():
    listed = re.findall(r"^\* :mod:`~lmablate\.report\.([\w.]+)`", lmablate.report.__doc__,
                        flags=re.MULTILINE)
    root = PACKAGE / "report"
    modules = sorted(".".join(p.relative_to(root).with_suffix("").parts)
                     for p in root.rglob("*.py") if p.name != "__init__.py")
    assert sorted(listed) == modules


def test_every_package_says_in_its_docstring_what_it_holds():
    packages = sorted(p.parent for p in PACKAGE.rglob("__init__.py"))
    assert len(packages) > 10
    for package in packages:
        name = ".".join(package.relative_to(SRC).parts)
        doc = importlib.import_module(name).__doc__
        assert doc and len(doc.split()) >= 5, f"{name}: no docstring saying what it holds"


def _references() -> list[tuple[str, str]]:
    """(file, target) of every qualified ``lmablate`` object a role in the package names."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for m in ROLE.finditer(path.read_text(encoding="utf-8")):
            found.append((path.relative_to(SRC).as_posix(), re.sub(r"\s+", "", m.group(1))))
    return found


def _resolves(target: str) -> bool:
    """Whether ``target`` is a module of the package, or an attribute (a dataclass field, a
    class's annotated attribute) of one."""
    parts = target.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for name in parts[i:]:
            if hasattr(obj, name):
                obj = getattr(obj, name)
            elif name in getattr(obj, "__annotations__", {}):
                obj = None
            else:
                return False
        return True
    return False


def test_every_docstring_reference_exists():
    missing = sorted({f"{path}: {target}" for path, target in _references()
                      if not _resolves(target)})
    assert not missing, "named but not there:\n" + "\n".join(missing)
