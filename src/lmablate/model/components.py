"""A user's own feed-forward, norm or position scheme, from the project's ``components/`` folder.

A variant names one as ``components.<module>:<Class>`` in place of a built-in name (``ffn``,
``norm`` or ``position``; :data:`lmablate.core.component_files.COMPONENT_NAME`): class ``<Class>`` of
``components/<module>.py`` beside ``params.yaml``. The model's registries resolve such a name
here (:func:`load_component`), so a component shares every path of a built-in: the same blocks,
attention, parameter counts and causality pre-flight.

The contract, as for a built-in (``docs/components.md``): the class is built with the model's
:class:`~lmablate.config.study.ModelConfig`; an FFN or a norm maps (B, T, C) to (B, T, C), C =
``d_model``; a position scheme subclasses :class:`lmablate.model.gpt.Position` and overrides its
hooks. :func:`lmablate.model.variants.check_component` tries that before any work.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from functools import lru_cache
from pathlib import Path

import torch.nn as nn

# the files and their hashes (no torch): shared with the check stage, fingerprints and workers
from lmablate.core.component_files import component_file, is_component


class ComponentError(ValueError):
    """A component that cannot be used: its message names the name, the file and what failed."""


def component_path(name: str, root: Path | None = None) -> Path:
    """``components/<module>.py`` under ``root`` (the working directory when None)."""
    return (root if root is not None else Path.cwd()) / component_file(name)


def load_component(name: str, root: Path | None = None) -> type[nn.Module]:
    """The class ``name`` (``components.<module>:<Class>``) names, imported from its file.

    The module is imported once per file content (an edited file is imported again), under
    the name ``lmablate_components.<module>``.

    Raises:
        ComponentError: not a component's name, the file is missing, it fails to import, it
            has no such class, or that is not an ``nn.Module`` class.
    """
    if not is_component(name):
        raise ComponentError(f"{name!r} is not a component's name; expected "
                             "components.<module>:<Class>")
    path = component_path(name, root)
    if not path.is_file():
        raise ComponentError(f"{name}: {path} does not exist")
    cls_name = name.rsplit(":", 1)[1]
    try:
        module = _import(str(path), hashlib.sha256(path.read_bytes()).hexdigest())
    except ComponentError as exc:
        raise ComponentError(f"{name}: {exc}") from None
    cls = getattr(module, cls_name, None)
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise ComponentError(f"{name}: {path} has no nn.Module class {cls_name}")
    return cls


@lru_cache(maxsize=None)
def _import(path: str, digest: str):
    """The module of file ``path`` whose content hashes to ``digest``."""
    stem = Path(path).stem
    spec = importlib.util.spec_from_file_location(f"lmablate_components.{stem}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # a user's file: any error is its own
        raise ComponentError(f"{path} fails to import: {type(exc).__name__}: {exc}") from None
    sys.modules.setdefault(spec.name, module)  # pickling (processes, Dask) finds its classes
    return module
