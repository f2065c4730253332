"""dvc.yaml's deps are exactly what each stage's command imports and reads.

A stage's code is the closure of project modules its command imports: ``lmablate.cli`` (and
what it imports) plus the stage module that ``cli.STAGES`` names, followed through every
``import`` statement, at module level or inside a function. Its data are the paths the command
declares as read (``cli.STAGES[...].reads``); what it declares as written must be an output.
If dvc.yaml misses a module, an edit to that module leaves the stage "up to date" over stale
results; if it lists one too many, an edit re-runs work for nothing.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

from lmablate import cli

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = "lmablate"


def module_file(name: str) -> Path | None:
    """The file of project module ``name`` (a package's ``__init__.py``), or None if ``name``
    is not a project module."""
    base = SRC.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def imported_modules(name: str) -> set[str]:
    """Project modules that module ``name``'s import statements name (relative ones resolved;
    ``from pkg import mod`` counts ``pkg.mod`` when that is a module)."""
    path = module_file(name)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                root = ".".join(base + ([node.module] if node.module else []))
            else:
                root = node.module or ""
            targets = [root] + [f"{root}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            if target.split(".")[0] == PACKAGE and module_file(target):
                found.add(target)
    return found


def import_closure(*names: str) -> set[str]:
    """``names`` and every project module they import, transitively, with the packages on the
    way (importing ``a.b.c`` runs ``a/__init__.py`` and ``a/b/__init__.py``)."""
    todo, seen = list(names), set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        todo += imported_modules(name)
    return seen


def dep_unit(path: Path) -> str:
    """What dvc.yaml names for module file ``path``: its subpackage's folder
    (``src/lmablate/model``, ``src/lmablate/report``), or the file itself for the package's
    top-level modules and the stage modules (each stage depends on its own stage module only)."""
    parts = path.relative_to(SRC / PACKAGE).parts
    if len(parts) > 1 and parts[0] != "stages":
        return (SRC / PACKAGE / parts[0]).relative_to(ROOT).as_posix()
    return path.relative_to(ROOT).as_posix()


def code_deps(command: str) -> set[str]:
    """The repository paths (subpackage folders and files, :func:`dep_unit`) of the modules
    ``lmablate <command>`` runs."""
    modules = import_closure("lmablate.cli", cli.STAGES[command].module)
    return {dep_unit(module_file(m)) for m in modules}


def dvc_stages() -> dict[str, dict]:
    return yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]


def option_values(cmd: str) -> dict[str, str]:
    """``--name value`` pairs of a stage's command (values keep their ``${...}`` templates)."""
    return dict(re.findall(r"--([\w-]+)\s+(\S+)", cmd))


def entries(stage: dict, key: str) -> set[str]:
    """Paths under ``deps``/``outs``/``metrics``/``plots`` (plain or with options)."""
    return {next(iter(e)) if isinstance(e, dict) else e for e in stage.get(key, [])}


STAGE_NAMES = list(dvc_stages())


def test_every_cli_command_is_a_dvc_stage_and_back():
    commands = {re.search(r"lmablate (\w+)", s["do"]["cmd"] if "do" in s else s["cmd"]).group(1)
                for s in dvc_stages().values()}
    assert commands == set(cli.STAGES)


@pytest.mark.parametrize("name", STAGE_NAMES)
def test_stage_depends_on_exactly_the_modules_its_command_imports(name):
    stage = dvc_stages()[name]
    body = stage.get("do", stage)
    command = re.search(r"lmablate (\w+)", body["cmd"]).group(1)
    listed = {d for d in entries(body, "deps") if d.startswith("src/")}
    expected = code_deps(command)
    missing, extra = sorted(expected - listed), sorted(listed - expected)
    assert not missing and not extra, (
        f"dvc.yaml stage {name!r} (lmablate {command}): missing deps {missing}, "
        f"deps its command does not import {extra}")


@pytest.mark.parametrize("name", STAGE_NAMES)
def test_stage_depends_on_what_it_reads_and_outputs_what_it_writes(name):
    stage = dvc_stages()[name]
    body = stage.get("do", stage)
    command = re.search(r"lmablate (\w+)", body["cmd"]).group(1)
    values = option_values(body["cmd"])
    declared = cli.STAGES[command]
    if declared.replicate:  # a number, not a path
        values.pop("replicate", None)
    assert set(values) == set(declared.reads) | set(declared.writes), body["cmd"]
    deps = entries(body, "deps")
    outs = entries(body, "outs") | entries(body, "metrics") | entries(body, "plots")
    for opt in declared.reads:
        assert values[opt] in deps, (
            f"stage {name!r} reads --{opt} {values[opt]} but does not depend on it")
    for opt in declared.writes:  # a written folder may be declared by the files it holds
        written = values[opt]
        assert written in outs or any(o.startswith(f"{written}/") for o in outs), (
            f"stage {name!r} writes --{opt} {written} but does not output it")


def test_the_closure_follows_imports_inside_functions_and_packages(tmp_path, monkeypatch):
    """The rule on a made-up package: a module imported only inside a function counts, a
    relative import resolves, the packages on the way count, other packages do not."""
    pkg = tmp_path / PACKAGE
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("import json\n\ndef f():\n    from . import b\n")
    (pkg / "b.py").write_text("from .sub.c import g\nfrom lmablate import fileio_missing\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "c.py").write_text("from .. import a\ndef g():\n    pass\n")
    (pkg / "d.py").write_text("")
    monkeypatch.setattr(__import__(__name__), "SRC", tmp_path)
    assert import_closure("lmablate.a") == {"lmablate", "lmablate.a", "lmablate.b",
                                            "lmablate.sub", "lmablate.sub.c"}


def test_a_module_is_named_by_its_subpackage_and_a_stage_by_its_own_file():
    package = SRC / PACKAGE
    assert dep_unit(package / "report" / "stats" / "statistics.py") == "src/lmablate/report"
    assert dep_unit(package / "model" / "__init__.py") == "src/lmablate/model"
    assert dep_unit(package / "stages" / "train.py") == "src/lmablate/stages/train.py"
    assert dep_unit(package / "cli.py") == "src/lmablate/cli.py"
    train = code_deps("train")
    assert "src/lmablate/stages/train.py" in train and "src/lmablate/stages/tune.py" not in train


def test_the_report_loads_models_but_never_trains():
    closure = import_closure("lmablate.cli", cli.STAGES["report"].module)
    assert "lmablate.model.gpt" in closure  # attention maps and embeddings from checkpoints
    assert "lmablate.train.training" not in closure and "lmablate.tune.tuning" not in closure


def test_a_removed_dep_is_reported_by_name(monkeypatch):
    """Deleting one dep from dvc.yaml makes the check fail with the module's path."""
    stages = dvc_stages()
    body = stages["evaluate"]
    body["deps"] = [d for d in body["deps"] if d != "src/lmablate/model"]
    monkeypatch.setattr(__import__(__name__), "dvc_stages", lambda: stages)
    with pytest.raises(AssertionError, match=r"missing deps \['src/lmablate/model'\]"):
        test_stage_depends_on_exactly_the_modules_its_command_imports("evaluate")


@pytest.mark.parametrize("name", STAGE_NAMES)
def test_every_stage_depends_on_the_lock(name):
    """Other package versions compute other results: an edit of requirements.lock re-runs the
    study."""
    stage = dvc_stages()[name]
    assert "requirements.lock" in entries(stage.get("do", stage), "deps")


VARIANT_STAGES = ["tune", "train", "evaluate", "tune-replicate", "train-replicate",
                  "evaluate-replicate"]


def test_a_variant_s_stages_depend_on_its_component_record_and_nothing_else_on_components():
    """The check stage reads components/ and writes one record per variant
    (data/components/<variant>.txt); each stage that builds a variant's model depends on that
    variant's record alone, so an edit of a component file re-runs the variants that name it.
    No other stage sees components/: generate, tokenize and the report stay as they are (the
    report follows through the runs it reads)."""
    stages = dvc_stages()
    check = stages["check"]
    assert "components" in entries(check, "deps")
    assert "data/components" in entries(check, "outs")
    assert option_values(check["cmd"])["components"] == "data/components"
    assert next(o["data/components"] for o in check["outs"]
                if isinstance(o, dict) and "data/components" in o) == {"cache": False}
    for name, stage in stages.items():
        body = stage.get("do", stage)
        deps = entries(body, "deps")
        records = {d for d in deps if d.startswith("data/components")}
        if name in VARIANT_STAGES:
            assert records == {"data/components/${item.variant}.txt"}, name
        else:
            assert not records, name
        if name != "check":
            assert "components" not in deps, name
    assert set(VARIANT_STAGES) <= set(stages)
