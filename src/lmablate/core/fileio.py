"""The project's file I/O: atomic writes, and the one JSON reader/writer and CSV writer.

Every output is written to a temporary file in the target's folder, then renamed: a crash
mid-write leaves the old file (or none), never a truncated one for DVC to cache or a reader
(MLflow, a browser) to see. Tables are written by pandas alone, so every CSV of the project has
the same dialect (comma, ``\n`` line ends, floats as their shortest round-trip repr).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Iterator, Mapping, Sequence

from lmablate.core.validation import OutputError

if TYPE_CHECKING:  # pandas is imported by write_csv only: the data stages never need it
    import pandas as pd


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path`` atomically.

    For writers that want a path (``torch.save``, ``DataFrame.to_csv``, ``savefig``). On an
    exception the temporary file is removed and ``path`` is left untouched. Creates the folder.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike) -> Iterator[IO[bytes]]:
    """A binary file object whose content replaces ``path`` (flushed to disk) on a clean exit."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        yield f
        f.flush()
        os.fsync(f.fileno())


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_writer(path) as f:
        f.write(data)


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` as UTF-8 to ``path`` atomically, without newline translation."""
    write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike, obj: Any, indent: int = 2) -> None:
    """Write ``obj`` as JSON indented by ``indent`` spaces, with a final newline, to ``path``
    atomically."""
    write_text(path, json.dumps(obj, indent=indent) + "\n")


def check_writable(path: str | os.PathLike) -> None:
    """Raise unless ``path`` (a file or folder, existing or not) can be written: its nearest
    existing folder must take a new file, and so must every folder below an existing folder
    ``path`` (a stage writes at every depth of its output folder: seed folders, figures).
    Tried for real, with a probe file created and removed at once, since permission bits do
    not tell (root ignores them, a read-only mount does not show in them).

    Raises:
        OutputError: a file stands where a folder must be, or a folder refuses the probe (the
            message names the path, the folder and the system's reason).
    """
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise OutputError(f"cannot write {path}: {folder} is a file, not a folder")
    below = sorted(Path(d) for d, _, _ in os.walk(path) if Path(d) != path) \
        if path.is_dir() else []
    for place in (folder, *below):
        try:
            fd, probe = tempfile.mkstemp(prefix=".lmablate-probe.", dir=place)
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise OutputError(f"cannot write {path}: folder {place} is not writable "
                              f"({exc.strerror or exc})") from None


def check_room(path: str | os.PathLike, need: int, what: str) -> None:
    """Raise unless the file system that will hold ``path`` (its nearest existing folder) has
    ``need`` bytes free: a stage that can estimate what it writes (``what``, e.g. "5
    checkpoints") says so before any work, instead of failing on a full disk after minutes.

    Raises:
        OutputError: less free space than ``need`` (the message names both, in MB).
    """
    folder = Path(path)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    free = shutil.disk_usage(folder).free
    if free < need:
        raise OutputError(f"cannot write {path}: {what} need{'s' * what.startswith('1 ')} about {need / 1e6:,.1f} MB and "
                          f"{folder} has {free / 1e6:,.1f} MB free")


def check_sqlite_store(url: str, key: str) -> None:
    """Refuse a SQLite store (``sqlite:///path``) that exists but is no sound database or cannot
    be written, before any work: SQLite's ``PRAGMA quick_check`` on a read-only connection (on a
    writable one where a killed writer's hot journal must first be rolled back), then the file
    opened for writing (nothing written). Other URLs and a file not yet made pass (the
    folder's writability is :func:`check_writable`'s).

    Raises:
        OutputError: naming ``key`` (e.g. ``tracking.uri (MLFLOW_TRACKING_URI)``), the file and
            SQLite's or the system's reason.
    """
    if not url.startswith("sqlite:///"):
        return
    path = Path(url.removeprefix("sqlite:///").split("?", 1)[0])
    if not path.is_file():
        return
    import sqlite3  # the standard library's; only stages with a store need it

    def quick_check(mode: str) -> list[str]:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode={mode}", uri=True,
                                                timeout=30)) as db:
            return [row[0] for row in db.execute("PRAGMA quick_check")]
    try:
        try:
            result = quick_check("ro")
        except sqlite3.OperationalError as exc:
            if "readonly" not in str(exc):
                raise
            # a hot journal, left by a writer killed mid-transaction: SQLite rolls it back on
            # the first read, which a read-only connection cannot do; a writable one does, as
            # the store's next user would
            result = quick_check("rw")
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc):  # another process is writing it: busy, not broken
            return
        result = [str(exc)]
    except sqlite3.DatabaseError as exc:
        result = [str(exc)]
    if result != ["ok"]:
        detail = " ".join(" ".join(result).split())[:120]  # one line
        raise OutputError(f"{key}: {path} fails SQLite's integrity check ({detail}); "
                          "move it away (a new store is made) or restore it from a backup")
    try:
        with open(path, "r+b"):
            pass
    except OSError as exc:
        raise OutputError(f"{key}: {path} cannot be written ({exc.strerror or exc})") from None


def os_error_line(exc: OSError) -> str:
    """One line for an :class:`OSError`: the path(s) it names, the system's reason and its errno
    name, and for a full disk what to do, e.g. ``runs/x/best.json: No space left on device
    (ENOSPC); free some space and run the same command again: it resumes``."""
    reason = exc.strerror or type(exc).__name__
    name = errno.errorcode.get(exc.errno or 0)
    line = f"{reason} ({name})" if name else reason
    if exc.filename is not None:
        where = os.fsdecode(exc.filename)
        if exc.filename2 is not None:
            where += f" -> {os.fsdecode(exc.filename2)}"
        line = f"{where}: {line}"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        line += "; free some space and run the same command again: it resumes"
    return line


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes (read in 1 MiB chunks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_json(path: str | os.PathLike) -> Any:
    """Read a UTF-8 JSON file.

    Raises:
        FileNotFoundError: ``path`` does not exist (the message names it).
        ValueError: it is not valid JSON or not UTF-8; the message names the file.
    """
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"file {path} not found") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} is not UTF-8 text (byte offset {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno} column "
                         f"{exc.colno}); the file is truncated or corrupted: delete it and run "
                         "the stage that writes it again") from None


def write_csv(path: str | os.PathLike,
              table: "pd.DataFrame | Sequence[Mapping[str, Any]]",
              columns: Sequence[str] | None = None) -> Path:
    """Write ``table`` (a DataFrame, or rows as mappings) as CSV to ``path`` atomically.

    ``columns`` selects and orders the columns (rows missing a key get an empty cell); by
    default all of the frame's, or the first row's keys. No index column. Returns ``path``.
    """
    import pandas as pd

    frame = table if isinstance(table, pd.DataFrame) else pd.DataFrame(list(table))
    if columns is not None:
        frame = frame.reindex(columns=list(columns))
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False)
    return Path(path)


def absolute_sqlite_url(url: str, root: Path) -> str | None:
    """``url`` with its file made absolute against folder ``root`` if it is a relative SQLite
    path (``sqlite:///optuna.db`` -> ``sqlite:////<root>/optuna.db``; a driver and a query are
    kept); None for any other URL (an absolute path, ``:memory:``, a server)."""
    m = re.fullmatch(r"(sqlite(?:\+\w+)?:///)([^/?][^?]*)(\?.*)?", url)
    if not m or m.group(2) == ":memory:":
        return None
    return f"{m.group(1)}{os.path.abspath(root / m.group(2))}{m.group(3) or ''}"
