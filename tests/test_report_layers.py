"""The report package flows one way: collected runs -> statistics -> headline -> tables ->
figures -> text. A module imports only from its own layer or a lower one, so a statistic never
depends on how it is drawn or worded (the layers: :mod:`lmablate.report`'s docstring)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPORT = Path(__file__).resolve().parents[1] / "src" / "lmablate" / "report"

# lowest first; a module not named here is in the layer of its subpackage
LAYERS = [
    {"lmablate.report.run_files", "lmablate.report.collect", "lmablate.report.families",
     "lmablate.report.curves", "lmablate.report.staging", "lmablate.report.captions"},
    {"lmablate.report.stats"},
    {"lmablate.report.headline"},
    {"lmablate.report.tables"},
    {"lmablate.report.figures"},
    {"lmablate.report.text"},
]


def layer(module: str) -> int:
    """The layer of ``module`` (a dotted name under lmablate.report): its own or its
    subpackage's."""
    for name in (module, module.rsplit(".", 1)[0]):
        for i, members in enumerate(LAYERS):
            if name in members:
                return i
    raise KeyError(f"{module} is in no layer of LAYERS")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPORT.parents[1]).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def report_imports(path: Path) -> list[str]:
    """The lmablate.report modules ``path`` imports, at any depth of its code (an import
    inside a function counts too)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and \
                node.module.startswith("lmablate.report"):
            if node.module in ("lmablate.report", "lmablate.report.stats",
                               "lmablate.report.figures", "lmablate.report.text"):
                out += [f"{node.module}.{a.name}" for a in node.names]
            else:
                out.append(node.module)
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.startswith("lmablate.report.")]
    return out


MODULES = sorted(p for p in REPORT.rglob("*.py") if p.name != "__init__.py")


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_a_report_module_imports_nothing_from_a_layer_above_its_own(path):
    here = module_name(path)
    upward = [m for m in report_imports(path) if layer(m) > layer(here)]
    assert not upward, f"{here} (layer {layer(here)}) imports {upward} from above"


def test_the_layer_check_sees_an_upward_import(tmp_path):
    """The check itself: a statistics module that imports a text module is caught."""
    stats = tmp_path / "lmablate" / "report" / "stats"
    stats.mkdir(parents=True)
    bad = stats / "bad.py"
    bad.write_text("from lmablate.report.text import findings\n"
                   "def f():\n    from lmablate.report.figures.losses import plot\n")
    imported = report_imports(bad)
    assert imported == ["lmablate.report.text.findings", "lmablate.report.figures.losses"]
    assert [layer(m) > layer("lmablate.report.stats.bad") for m in imported] == [True, True]


def test_every_report_module_has_a_layer():
    for path in MODULES:
        layer(module_name(path))
