"""The trackers every stage records its runs through, over :mod:`lmablate.tracking.mlflow_store`.

Every stage gets a :class:`Tracker`; with ``tracking.enabled: false`` it is a :class:`NullTracker`
whose calls do nothing, so stage code never checks whether tracking is on. Runs are tagged with
``dataset``, ``variant``, ``seed`` and ``stage`` so the MLflow UI can filter and compare them.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Mapping

from lmablate.config.study import TrackingConfig
from lmablate.core.tracker import NullTracker, RunTracker, Tracker
from lmablate.tracking.environment import run_tags
from lmablate.tracking.mlflow_store import MlflowStore, TrackingError, owner_tags


class MlflowRunTracker(RunTracker):
    """Logs to one MLflow run by id (``run_id``), whatever this thread's active run is: what
    :meth:`MlflowTracker.open_run` yields."""

    def __init__(self, store: MlflowStore, run_id: str):
        self._store, self.run_id = store, run_id

    def log_params(self, params: Mapping[str, Any]) -> None:
        self._store.log_batch(self.run_id, {k: str(v) for k, v in params.items()})

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        now = int(time.time() * 1000)
        clean = [(k, float(v), now, step or 0) for k, v in metrics.items() if v is not None]
        if clean:
            self._store.log_batch(self.run_id, None, clean)

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        self._store.log_artifact(self.run_id, str(Path(path).absolute()), artifact_path)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        self._store.log_batch(self.run_id, None, None, {k: str(v) for k, v in tags.items()})


class MlflowTracker(Tracker):
    """MLflow-backed :class:`Tracker`: one experiment per study, runs nested where asked.

    Like MLflow's fluent API, each thread has its own stack of active runs (:meth:`run`), and
    ``log_*`` go to the top one. The calls go to an :class:`MlflowStore` in this process, or to
    the process's :class:`lmablate.tracking.sidecar.Sidecar` when the command started one; the
    records are the same.

    Args:
        cfg: tracking settings; ``MLFLOW_TRACKING_URI`` overrides ``cfg.uri``.

    Raises:
        TrackingError: the store cannot be reached (e.g. a server URI that does not answer);
            raised at construction so a stage fails before any training.
    """

    def __init__(self, cfg: TrackingConfig):
        self.uri = cfg.tracking_uri
        from lmablate.tracking import sidecar  # imports this module: a cycle only at module level

        running = sidecar.current()
        self._store = (MlflowStore(self.uri, cfg.experiment) if running is None
                       else sidecar.RemoteStore(running, self.uri, cfg.experiment))
        self._local = threading.local()

    def _stack(self) -> list[MlflowRunTracker]:
        if not hasattr(self._local, "stack"):
            self._local.stack = []
        return self._local.stack

    def _top(self) -> MlflowRunTracker:
        stack = self._stack()
        if not stack:
            raise TrackingError("no active MLflow run in this thread; log inside tracker.run()")
        return stack[-1]

    @property
    def active_run_id(self) -> str | None:
        stack = self._stack()
        return stack[-1].run_id if stack else None

    @contextlib.contextmanager
    def run(self, name: str, tags: Mapping[str, Any] | None = None, *, nested: bool = False,
            run_id: str | None = None, parent_run_id: str | None = None) -> Iterator[str]:
        """Start (or, with ``run_id``, reopen) a run and make it this thread's active run; yields
        its id. Nested under this thread's active run with ``nested``, or under ``parent_run_id``
        (a run of another thread or process: Optuna workers). Ends it on exit, marking it FAILED
        if the body raised, KILLED if it was interrupted (see :meth:`open_run`).

        Raises:
            TrackingError: a run is already active in this thread and neither ``nested`` nor
                ``parent_run_id`` is given (as ``mlflow.start_run``).
        """
        stack = self._stack()
        if stack and not (nested or parent_run_id):
            raise TrackingError(f"run {stack[-1].run_id} is already active in this thread; "
                                "end it first or start this one with nested=True")
        parent = parent_run_id or (stack[-1].run_id if stack else None)
        with self.open_run(name, tags, run_id=run_id, parent_run_id=parent) as bound:
            stack.append(bound)
            try:
                yield bound.run_id
            finally:
                stack.pop()

    @contextlib.contextmanager
    def open_run(self, name: str, tags: Mapping[str, Any] | None = None, *,
                 run_id: str | None = None,
                 parent_run_id: str | None = None) -> Iterator[MlflowRunTracker]:
        """Start (or, with ``run_id``, reopen) a run as :meth:`run` does (same name, tags and
        MLflow's context tags such as ``mlflow.user`` and ``mlflow.source.name``), without
        making it this thread's active run; yields a :class:`MlflowRunTracker` bound to it.
        Ends it on exit: FINISHED, FAILED if the body raised, KILLED if it was interrupted
        (a ``KeyboardInterrupt``: Ctrl-C). The run is tagged with this process as its owner
        (:func:`owner_tags`), so that a run whose process was killed is ended KILLED later, and
        with what it computed with (:func:`lmablate.tracking.environment.run_tags`: numerics,
        versions, lock, CPU, OS, BLAS, commit)."""
        tags = {**run_tags(), **{k: str(v) for k, v in (tags or {}).items()}, **owner_tags()}
        run_id = self._store.start_run(name, tags, run_id, parent_run_id)
        status = "FINISHED"
        try:
            yield MlflowRunTracker(self._store, run_id)
        except KeyboardInterrupt:
            status = "KILLED"
            raise
        except BaseException:
            status = "FAILED"
            raise
        finally:
            self._store.end_run(run_id, status)

    def log_params(self, params: Mapping[str, Any]) -> None:
        self._top().log_params(params)

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        self._top().log_metrics(metrics, step)

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        self._top().log_artifact(path, artifact_path)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        self._top().set_tags(tags)

    def runs_view_url(self) -> str | None:
        return self._store.runs_view_url()

    def save_views(self, datasets: list[str], variants: list[str],
                   colours: dict[str, str],
                   verdicts: dict[str, str] | None = None) -> dict[str, str]:
        return self._store.save_views(list(datasets), list(variants), dict(colours),
                                      dict(verdicts or {}))

    def find_run(self, tags: Mapping[str, Any]) -> str | None:
        return self._store.find_run({k: str(v) for k, v in tags.items()})


def make_tracker(cfg: TrackingConfig) -> Tracker:
    """An :class:`MlflowTracker` when ``cfg.enabled``, else a :class:`NullTracker`."""
    return MlflowTracker(cfg) if cfg.enabled else NullTracker()


def run_name(dataset: str, variant: str, seed: int, label: str | None, replicate: int) -> str:
    """A final run's MLflow name: ``shakespeare-rope-seed0``; in a scaling study with its
    budget, ``shakespeare-rope-1.1e10-seed0``; replicate r > 0's ends in ``-r<r>``."""
    return (f"{dataset}-{variant}-" + (f"{label}-" if label else "") + f"seed{seed}"
            + (f"-r{replicate}" if replicate else ""))
