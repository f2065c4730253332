"""Stage ``check``: the whole study checked before any other stage runs (``lmablate check
--out data/checked.txt``).

Every other stage of ``dvc.yaml`` depends on the file it writes, and it depends on every
section of params.yaml that a stage reads, so DVC runs it first whenever a param changes. A
bad param, a broken store or an unwritable output folder then stops ``dvc repro`` here,
before DVC removes any other stage's finished outputs. The file's text does not depend on the
params: while they are valid it is the same bytes, so no other stage re-runs because of it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lmablate.config.study import StudyConfig
from lmablate.core import fileio
from lmablate.core.validation import OutputError

CHECKED = ("params.yaml, the stores and the output folders passed lmablate check; every other "
           "stage runs after it\n")
# the folders the study's stages write (dvc.yaml), relative to the project
OUTPUT_FOLDERS = ("data", "runs", "reports")


def check_tracking_store(cfg: StudyConfig, runs_dir: Path) -> None:
    """Refuse an MLflow store (``tracking.uri``) emptied after it recorded the study: a
    0-byte SQLite file while ``runs_dir`` holds results (``*/*/metrics.json``), which MLflow
    would silently take for a new, empty store.

    Raises:
        OutputError: naming the key, the file and what to do.
    """
    uri = cfg.tracking.tracking_uri
    if not (cfg.tracking.enabled and uri.startswith("sqlite:///")):
        return
    path = Path(uri.removeprefix("sqlite:///").split("?", 1)[0])
    recorded = next(Path(runs_dir).glob("*/*/metrics.json"), None)
    if path.is_file() and path.stat().st_size == 0 and recorded is not None:
        raise OutputError(
            f"tracking.uri (MLFLOW_TRACKING_URI): {path} is empty (0 bytes) though "
            f"{Path(runs_dir)}/ holds results it recorded ({recorded}); restore it from a "
            "backup, or move it away and run dvc repro -f to record every run again")


def run(cfg: StudyConfig, out: Path, root: Path = Path(".")) -> None:
    """Check the stores (:func:`lmablate.core.fileio.check_sqlite_store`,
    :func:`check_tracking_store`) and the output folders (:data:`OUTPUT_FOLDERS` under
    ``root``, :func:`lmablate.core.fileio.check_writable`), then write :data:`CHECKED` to
    ``out``. The params were checked as they were read.

    Raises:
        OutputError: a store or folder that fails, naming it.
    """
    fileio.check_sqlite_store(cfg.tune.storage_url, "tune.storage (LMABLATE_OPTUNA_STORAGE)")
    if cfg.tracking.enabled:
        fileio.check_sqlite_store(cfg.tracking.tracking_uri,
                                  "tracking.uri (MLFLOW_TRACKING_URI)")
    check_tracking_store(cfg, root / "runs")
    for folder in OUTPUT_FOLDERS:
        fileio.check_writable(root / folder)
    fileio.write_text(out, CHECKED)


def main(cfg: StudyConfig, args: argparse.Namespace) -> str:
    """``lmablate check --out FILE``; returns the summary line's ending."""
    run(cfg, args.out)
    return "params, stores and output folders valid"
