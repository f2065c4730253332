"""Docstrings that name the package's modules and objects name ones that exist, and a list of a
package's modules lists all of them."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import lmablate.analysis

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "lmablate"
# a Sphinx role naming a qualified object of this package; a target may be broken over two
# lines after a dot (":mod:`lmablate.analysis.\n    tuning_figure`")
ROLE = re.compile(r":(?:mod|func|class|meth|attr|data|exc):`~?(lmablate(?:\.\s*\w+)*)`")


def test_analysis_docstring_lists_every_module_once():
    listed = re.findall(r"^\* :mod:`~lmablate\.analysis\.(\w+)`", lmablate.analysis.__doc__,
                        flags=re.MULTILINE)
    modules = sorted(p.stem for p in (PACKAGE / "analysis").glob("*.py")
                     if p.name != "__init__.py")
    assert sorted(listed) == modules


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
