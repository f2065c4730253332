"""Stage ``check``: the whole study checked before any other stage runs (``lmablate check
--out data/checked.txt --components data/components``).

Every other stage of ``dvc.yaml`` depends on the file it writes, and it depends on every
section of params.yaml that a stage reads, so DVC runs it first whenever a param changes. A
bad param, a broken store or an unwritable output folder then stops ``dvc repro`` here,
before DVC removes any other stage's finished outputs. The file's text does not depend on the
params: while they are valid it is the same bytes, so no other stage re-runs because of it.

It also writes one record per variant of the study, ``data/components/<variant>.txt``
(:func:`lmablate.core.component_files.variant_record`): the sha256 of each file of
``components/`` the variant names, or a fixed line for a variant that names none. A variant's
tune, train and evaluate stages depend on its record alone, so an edit of a component file
re-runs the stages of the variants that name it and no others.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
from pathlib import Path

from lmablate.config.study import ConfigError, StudyConfig
from lmablate.core import fileio
from lmablate.core.component_files import named_components, variant_record
from lmablate.core.validation import OutputError

CHECKED = ("params.yaml, the stores and the output folders passed lmablate check; every other "
           "stage runs after it\n")
# the folders the study's stages write (dvc.yaml), relative to the project
OUTPUT_FOLDERS = ("data", "runs", "reports")
# where `dvc exp run --temp` copies the project (dvc.repo.experiments.queue.tempdir), relative to
# the project; each run's copy is a mkdtemp folder ``tmp*`` in it, holding its own DVC repo lock
TEMP_RUNS = Path(".dvc", "tmp", "exps", "standalone")


def _lock_holder_alive(lock: Path) -> bool:
    """Whether a live process holds the DVC repo lock ``lock`` (DVC's ``dvc.lock.Lock``: an
    ``flock`` through zc.lockfile, which writes the holder's pid into the file) or is the pid
    written in it: the lock is free between a run's repro and its clean-up, while its ``dvc``
    process lives. Probed read-only, so the file keeps its pid."""
    with open(lock, "rb") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
        text = fh.read().decode("ascii", "replace")
    try:
        pid = int(text.split()[0])
    except (ValueError, IndexError):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        pass
    return True


def stale_temp_runs(root: Path) -> list[Path]:
    """The copies of ``dvc exp run --temp`` runs that were killed before DVC removed them:
    folders ``tmp*`` of :data:`TEMP_RUNS` (under ``root``, or the project whose copy ``root``
    is) whose DVC repo lock no live process holds or names. A copy without a lock file (DVC
    still preparing it) is never stale, nor is ``root`` itself. Sorted by path."""
    here = Path(root).resolve()
    parents = {here / TEMP_RUNS}
    if here.parent.parts[-len(TEMP_RUNS.parts):] == TEMP_RUNS.parts:
        parents.add(here.parent)
    stale = []
    for parent in parents:
        for copy in sorted(parent.glob("tmp*")) if parent.is_dir() else []:
            lock = copy / ".dvc" / "tmp" / "lock"
            if copy != here and copy.is_dir() and lock.is_file() \
                    and not _lock_holder_alive(lock):
                stale.append(copy)
    return sorted(stale)


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


def write_component_records(cfg: StudyConfig, folder: Path, root: Path = Path(".")) -> None:
    """Write ``<variant>.txt`` under ``folder`` for every variant of ``cfg.study_variants``
    (:func:`~lmablate.core.component_files.variant_record`, files under ``root``), and remove
    the records of variants the study no longer has. Every file is checked before any is written.

    Raises:
        ConfigError: a variant names a component whose file is missing (naming the variant,
            the kind, the name and the file).
    """
    records = {}
    for variant in cfg.study_variants:
        try:
            records[variant] = variant_record(
                named_components(cfg.model, cfg.variants[variant]), root)
        except FileNotFoundError as exc:
            raise ConfigError(f"params: variants.{variant}: {exc}; write the file or name a "
                              "built-in") from None
    folder = Path(folder)
    for old in folder.glob("*.txt") if folder.is_dir() else []:
        if old.stem not in records:
            old.unlink()
    for variant, text in records.items():
        fileio.write_text(folder / f"{variant}.txt", text)


def run(cfg: StudyConfig, out: Path, root: Path = Path("."),
        components: Path | None = None) -> list[Path]:
    """Check the stores (:func:`lmablate.core.fileio.check_sqlite_store`,
    :func:`check_tracking_store`) and the output folders (:data:`OUTPUT_FOLDERS` under
    ``root``, :func:`lmablate.core.fileio.check_writable`), then write :data:`CHECKED` to
    ``out`` and remove the copies of killed ``--temp`` runs (:func:`stale_temp_runs`). The
    params were checked as they were read. With ``components``, each variant's record is
    written there first (:func:`write_component_records`).

    Returns:
        The copies removed.

    Raises:
        OutputError: a store or folder that fails, naming it.
        ConfigError: a variant names a component whose file is missing.
    """
    fileio.check_sqlite_store(cfg.tune.storage_url, "tune.storage (LMABLATE_OPTUNA_STORAGE)")
    if cfg.tracking.enabled:
        fileio.check_sqlite_store(cfg.tracking.tracking_uri,
                                  "tracking.uri (MLFLOW_TRACKING_URI)")
    check_tracking_store(cfg, root / "runs")
    for folder in OUTPUT_FOLDERS:
        fileio.check_writable(root / folder)
    if components is not None:
        write_component_records(cfg, components, root)
    fileio.write_text(out, CHECKED)
    stale = stale_temp_runs(root)
    for copy in stale:
        shutil.rmtree(copy, ignore_errors=True)
    return stale


def main(cfg: StudyConfig, args: argparse.Namespace) -> str:
    """``lmablate check --out FILE --components FOLDER``; returns the summary line's ending."""
    removed = run(cfg, args.out, components=args.components)
    gone = (f"; removed {len(removed)} killed dvc exp run --temp cop"
            f"{'y' if len(removed) == 1 else 'ies'} ({', '.join(p.name for p in removed)})"
            if removed else "")
    return "params, stores and output folders valid" + gone
