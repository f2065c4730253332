"""The files of a user's components (``components/<module>.py`` beside ``params.yaml``) and what
identifies them: their sha256. Pure Python, no torch: the check stage writes each variant's
record from these (:func:`variant_record`, a DVC dep of exactly that variant's stages), the
fingerprints of tuning and training take :func:`component_hashes`, and a Dask worker is
checked against the driver's (:mod:`lmablate.execution.cluster`). Importing and checking the
classes is :mod:`lmablate.model.components`' job.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any, Mapping

# A user's own component: class <Class> of the project's components/<module>.py
# (lmablate.model.components), as a variant's ffn, norm or position.
COMPONENT_NAME = re.compile(r"components\.[A-Za-z_][A-Za-z0-9_]*:[A-Za-z_][A-Za-z0-9_]*")
COMPONENT_TEXT = ("components.<module>:<Class> (a class of the project's "
                  "components/<module>.py)")
COMPONENTS_DIR = "components"  # beside params.yaml
KINDS = ("ffn", "norm", "position")  # the ModelConfig fields a component may fill
# a variant's record when it names no component: the same bytes whatever components/ holds, so
# that an edit there never re-runs a built-in variant's stages
NO_COMPONENT = "no component of components/\n"


def is_component(name: Any) -> bool:
    """Whether ``name`` names a user's component (``components.<module>:<Class>``) rather than a
    built-in."""
    return isinstance(name, str) and bool(COMPONENT_NAME.fullmatch(name))


def component_file(name: str) -> str:
    """``components/<module>.py``, the file of component ``name``, relative to the project."""
    module = name.split(".", 1)[1].split(":", 1)[0]
    return f"{COMPONENTS_DIR}/{module}.py"


def named_components(model: Any, overrides: Mapping[str, Any] | None = None) -> dict[str, str]:
    """``kind -> name`` of the components a model uses, by :data:`KINDS` order: ``model`` a
    :class:`~lmablate.config.study.ModelConfig` (or any object with ``ffn``, ``norm`` and
    ``position``), ``overrides`` a variant's changes to it. Empty for a built-in model."""
    overrides = overrides or {}
    chosen = {kind: overrides.get(kind, getattr(model, kind)) for kind in KINDS}
    return {kind: name for kind, name in chosen.items() if is_component(name)}


def file_sha256(path: Path) -> str | None:
    """The sha256 (hex) of file ``path``'s bytes, or None if there is no such file."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


def component_hashes(names: Mapping[str, str] | list[str],
                     root: Path | None = None) -> dict[str, str | None]:
    """``components/<module>.py -> sha256`` (None where missing) of the files of component
    ``names`` (a list, or the values of a ``kind -> name`` mapping), under ``root`` (the working
    directory when None), sorted by file. Empty for no names: a built-in model's fingerprint
    gains nothing from it."""
    values = names.values() if isinstance(names, Mapping) else names
    return file_hashes([component_file(name) for name in values], root)


def file_hashes(files: Any, root: Path | None = None) -> dict[str, str | None]:
    """``file -> sha256`` (None where missing) of ``files`` (paths relative to ``root``, the
    working directory when None), sorted, each once."""
    base = Path.cwd() if root is None else Path(root)
    return {rel: file_sha256(base / rel) for rel in sorted(set(files))}


def variant_record(components: Mapping[str, str], root: Path | None = None) -> str:
    """The text of a variant's record (``data/components/<variant>.txt``): one line per
    component, ``<kind> <name> <file> sha256 <hex>``, or :data:`NO_COMPONENT` for none.

    Raises:
        FileNotFoundError: a component's file is missing (the message names kind, name, file).
    """
    if not components:
        return NO_COMPONENT
    base = Path.cwd() if root is None else Path(root)
    lines = []
    for kind, name in components.items():
        rel = component_file(name)
        digest = file_sha256(base / rel)
        if digest is None:
            raise FileNotFoundError(f"{kind} {name}: {base / rel} does not exist")
        lines.append(f"{kind} {name} {rel} sha256 {digest}\n")
    return "".join(lines)
