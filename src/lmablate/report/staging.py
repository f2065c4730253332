"""The report's outputs replaced all at once: written into a staging folder beside their
folder, and moved into place only when every one of them was written."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from lmablate.core.fileio import check_writable


def staging_prefix(path: Path) -> str:
    """The name every staging folder of folder ``path`` starts with (beside ``path``)."""
    return f".{Path(path).name}.staging-"


def check_stageable(path: str | os.PathLike) -> None:
    """Raise unless ``path``, the folders below it and the one beside it take new files.

    Raises:
        OutputError: a folder that cannot be written (the message names it and the reason).
    """
    path = Path(path).absolute()
    check_writable(path)
    check_writable(path.parent / staging_prefix(path).rstrip("-"))


@contextlib.contextmanager
def staged_folder(path: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty folder beside ``path``; when the block succeeds each entry written there
    replaces its namesake in ``path`` (a folder as a whole), others are left alone. A failure
    leaves ``path`` as it was; a killed run's staging folder is removed first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for left in path.parent.glob(staging_prefix(path) + "*"):
        shutil.rmtree(left, ignore_errors=True)
    stage = Path(tempfile.mkdtemp(prefix=staging_prefix(path), dir=path.parent))
    try:
        yield stage
        path.mkdir(exist_ok=True)
        replaced = stage / ".replaced"
        replaced.mkdir()
        for entry in sorted(stage.iterdir()):
            if entry == replaced:
                continue
            target = path / entry.name
            if target.is_dir() and not target.is_symlink():
                os.rename(target, replaced / entry.name)
            os.replace(entry, target)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
