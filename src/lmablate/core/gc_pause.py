"""The cyclic garbage collector paused around slow imports (:func:`gc_paused`)."""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for the block, then restore it as it was.

    Importing torch, Optuna or MLflow allocates some 10^6 objects that all live to the end, and the
    collections they trigger scan them again and again (a quarter of the import time). For blocks
    that make nothing collectable meanwhile: a stage module's import
    (:func:`lmablate.cli.import_stage`), MLflow's import and the first store opened
    (:class:`lmablate.tracking.mlflow_store.MlflowStore`). Paused in several threads at once, the
    collector is back on once the thread that paused it first is done."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
