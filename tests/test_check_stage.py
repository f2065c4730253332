"""The check stage (lmablate.stages.check): what it refuses before any other stage runs, and
that its file is the same bytes whatever the (valid) params. Its place in dvc repro is in
test_pipeline.py (a bad param stops dvc repro there with every output kept)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from lmablate.config import params
from lmablate.core.validation import OutputError
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
