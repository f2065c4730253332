"""The check stage (lmablate.stages.check): what it refuses before any other stage runs, and
that its file is the same bytes whatever the (valid) params. Its place in dvc repro is in
test_pipeline.py (a bad param stops dvc repro there with every output kept)."""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lmablate.config import params
from lmablate.core.validation import ConfigError, OutputError
from lmablate.stages import check

from conftest import tiny_params


def _cfg(tmp_path: Path, **tracking):
    cfg = params.parse(tiny_params())
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    return dataclasses.replace(cfg, tracking=dataclasses.replace(
        cfg.tracking, enabled=True, uri=uri, **tracking))


def test_the_checked_file_is_the_same_bytes_for_any_valid_params(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = _cfg(tmp_path)
    check.run(cfg, tmp_path / "a.txt", root=tmp_path)
    other = dataclasses.replace(cfg, seeds=(7, 8), train=dataclasses.replace(cfg.train, lr=0.5))
    check.run(other, tmp_path / "b.txt", root=tmp_path)
    assert (tmp_path / "a.txt").read_text() == (tmp_path / "b.txt").read_text() == check.CHECKED


def test_an_emptied_mlflow_store_is_refused_where_the_study_recorded_runs(tmp_path,
                                                                        monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = _cfg(tmp_path)
    store = tmp_path / "mlflow.db"
    store.write_bytes(b"")
    check.check_tracking_store(cfg, tmp_path / "runs")  # no results yet: a new store is fine
    result = tmp_path / "runs" / "arithmetic" / "baseline" / "metrics.json"
    result.parent.mkdir(parents=True)
    result.write_text(json.dumps({"runs": {}}))
    with pytest.raises(OutputError) as err:
        check.run(cfg, tmp_path / "checked.txt", root=tmp_path)
    assert str(err.value) == (
        f"tracking.uri (MLFLOW_TRACKING_URI): {store} is empty (0 bytes) though "
        f"{tmp_path / 'runs'}/ holds results it recorded ({result}); restore it from a backup, "
        "or move it away and run dvc repro -f to record every run again")
    assert not (tmp_path / "checked.txt").exists()
    check.check_tracking_store(dataclasses.replace(
        cfg, tracking=dataclasses.replace(cfg.tracking, enabled=False)), tmp_path / "runs")


def test_a_store_that_is_no_database_is_refused_before_the_file_is_written(tmp_path,
                                                                         monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = _cfg(tmp_path)
    (tmp_path / "mlflow.db").write_bytes(b"not a database at all, but not empty either" * 100)
    with pytest.raises(OutputError, match=r"^tracking.uri \(MLFLOW_TRACKING_URI\): .*mlflow.db "
                                          r"fails SQLite's integrity check"):
        check.run(cfg, tmp_path / "checked.txt", root=tmp_path)
    assert not (tmp_path / "checked.txt").exists()


def _temp_copy(project: Path, name: str, lock: str | None) -> Path:
    """A folder as ``dvc exp run --temp`` leaves it under the project, its DVC repo lock
    holding ``lock`` (None: no lock file yet)."""
    copy = project / check.TEMP_RUNS / name
    (copy / ".dvc" / "tmp").mkdir(parents=True)
    if lock is not None:
        (copy / ".dvc" / "tmp" / "lock").write_text(lock)
    return copy


def _dead_pid() -> int:
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    return done.pid


def test_a_killed_temp_run_s_copy_is_stale_and_a_live_or_preparing_one_is_not(tmp_path):
    dead = _temp_copy(tmp_path, "tmpdead", f" {_dead_pid()}\n")
    garbled = _temp_copy(tmp_path, "tmpgarbled", "not a pid")
    _temp_copy(tmp_path, "tmplive", f" {os.getpid()}\n")
    _temp_copy(tmp_path, "tmppreparing", None)
    held = _temp_copy(tmp_path, "tmpheld", f" {_dead_pid()}\n")
    with open(held / ".dvc" / "tmp" / "lock", "rb") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)  # held by a live process: this one
        assert check.stale_temp_runs(tmp_path) == [dead, garbled]
        # seen from inside a copy (a --temp run's own check stage): the same, never itself
        assert check.stale_temp_runs(held) == [dead, garbled]
        assert check.stale_temp_runs(dead) == [garbled]
    assert check.stale_temp_runs(tmp_path) == [dead, garbled, held]
    assert (held / ".dvc" / "tmp" / "lock").read_text().strip() != str(os.getpid())


def test_the_check_stage_removes_killed_temp_copies_and_keeps_the_rest(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    dead = _temp_copy(tmp_path, "tmpdead", f" {_dead_pid()}\n")
    (dead / "runs").mkdir()
    live = _temp_copy(tmp_path, "tmplive", f" {os.getpid()}\n")
    assert check.run(_cfg(tmp_path), tmp_path / "checked.txt", root=tmp_path) == [dead]
    assert not dead.exists() and live.is_dir()
    assert check.stale_temp_runs(tmp_path) == []


def _component_cfg(tmp_path: Path):
    """The tiny study with variants ``sq`` (ffn components.sq:Sq) and ``both`` (ffn and norm
    from components/), beside the built-in baseline and swiglu; ``tmp_path/components`` holds
    their files."""
    raw = tiny_params({"variants": {"sq": {"ffn": "components.sq:Sq"},
                                    "both": {"ffn": "components.sq:Sq", "norm": "components.n:N"}},
                       "study": {"variants": ["baseline", "swiglu", "sq", "both"]}})
    (tmp_path / "components").mkdir()
    (tmp_path / "components" / "sq.py").write_text("# Sq\n")
    (tmp_path / "components" / "n.py").write_text("# N\n")
    return _cfg_of(raw, tmp_path)


def _cfg_of(raw: dict, tmp_path: Path):
    cfg = params.parse(raw)
    return dataclasses.replace(cfg, tracking=dataclasses.replace(cfg.tracking, enabled=False))


def test_each_variant_s_record_changes_exactly_when_a_component_file_it_names_changes(tmp_path):
    cfg = _component_cfg(tmp_path)
    records = tmp_path / "data" / "components"
    check.run(cfg, tmp_path / "checked.txt", root=tmp_path, components=records)
    before = {p.name: p.read_text() for p in records.iterdir()}
    assert sorted(before) == ["baseline.txt", "both.txt", "sq.txt", "swiglu.txt"]
    assert before["baseline.txt"] == before["swiglu.txt"] == "no component of components/\n"
    sq = hashlib.sha256(b"# Sq\n").hexdigest()
    assert before["sq.txt"] == f"ffn components.sq:Sq components/sq.py sha256 {sq}\n"
    assert before["both.txt"].splitlines()[1].startswith("norm components.n:N components/n.py ")
    (tmp_path / "components" / "n.py").write_text("# N, edited\n")
    check.run(cfg, tmp_path / "checked.txt", root=tmp_path, components=records)
    after = {p.name: p.read_text() for p in records.iterdir()}
    assert [name for name in before if before[name] != after[name]] == ["both.txt"]
    # a variant the study no longer runs loses its record (its stages are gone from dvc.yaml)
    fewer = dataclasses.replace(cfg, study_variants=("baseline", "sq"))
    check.run(fewer, tmp_path / "checked.txt", root=tmp_path, components=records)
    assert sorted(p.name for p in records.iterdir()) == ["baseline.txt", "sq.txt"]


def test_a_variant_naming_a_missing_component_file_stops_the_check_with_nothing_written(
        tmp_path):
    cfg = _component_cfg(tmp_path)
    (tmp_path / "components" / "n.py").unlink()
    with pytest.raises(ConfigError) as err:
        check.run(cfg, tmp_path / "checked.txt", root=tmp_path,
                  components=tmp_path / "data" / "components")
    assert str(err.value) == (f"params: variants.both: norm components.n:N: "
                              f"{tmp_path / 'components' / 'n.py'} does not exist; write the "
                              "file or name a built-in")
    assert not (tmp_path / "checked.txt").exists()
    assert not (tmp_path / "data" / "components").exists()
