"""Atomic file output: write to a temporary file in the target's folder, then rename.

A crash mid-write leaves the old file (or none), never a truncated one for DVC to cache or a
reader (MLflow, a browser) to see.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import IO, Any, Iterator


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


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically."""
    write_text(path, json.dumps(obj, indent=2) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    """Read a JSON file."""
    return json.loads(Path(path).read_text(encoding="utf-8"))
