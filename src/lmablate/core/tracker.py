"""What a step records its runs through: the tracker protocols the training loops and the stages
are written against, and a tracker that records nothing. MLflow's trackers
(:mod:`lmablate.tracking.trackers`) implement them; the training code needs only this module."""

from __future__ import annotations

import contextlib
import os
from typing import Any, ContextManager, Iterator, Mapping, Protocol


class RunTracker(Protocol):
    """What logs to one run: its parameters, metrics, artifacts and tags. Every :class:`Tracker`
    is one (logging to its thread's active run, :meth:`Tracker.run`), and so is the tracker
    bound to one run that :meth:`Tracker.open_run` yields (with the run's id in ``run_id``).
    The training loops take one (:func:`lmablate.train.training.train_model`,
    :func:`lmablate.train.batched.train_seeds`)."""

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Record ``params`` on the run (values as their ``str``)."""
        ...

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Record ``metrics`` at ``step`` (0 when None); None values are left out."""
        ...

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        """Copy file or directory ``path`` into the run's artifacts, under ``artifact_path``."""
        ...

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        """Tag the run with ``tags`` (values as their ``str``)."""
        ...


class Tracker(RunTracker, Protocol):
    """What every stage records its runs through (:func:`~lmablate.tracking.trackers.make_tracker`):
    an :class:`~lmablate.tracking.trackers.MlflowTracker`, or a :class:`NullTracker` that records
    nothing. Its ``log_*`` and :meth:`set_tags` go to this thread's active run (:meth:`run`)."""

    def run(self, name: str, tags: Mapping[str, Any] | None = None, *, nested: bool = False,
            run_id: str | None = None,
            parent_run_id: str | None = None) -> ContextManager[str | None]:
        """Start (or, with ``run_id``, reopen) a run named ``name`` with ``tags`` as this
        thread's active run, nested where asked; yields its id (None when nothing is
        recorded) and ends it on exit (see :meth:`lmablate.tracking.trackers.MlflowTracker.run`)."""
        ...

    def open_run(self, name: str, tags: Mapping[str, Any] | None = None, *,
                 run_id: str | None = None,
                 parent_run_id: str | None = None) -> ContextManager[RunTracker]:
        """Like :meth:`run`, but the run is not made this thread's active run: yields a tracker
        bound to it (its id in ``run_id``), so that one thread can log to several runs at once
        (the seeds of :func:`lmablate.train.batched.train_seeds`)."""
        ...

    def find_run(self, tags: Mapping[str, Any]) -> str | None:
        """The id of an earlier top-level run with ``tags`` that is not running, to reopen
        (:meth:`lmablate.tracking.mlflow_store.MlflowStore.find_run`); None when there is none or
        nothing is recorded."""
        ...

    def save_views(self, datasets: list[str], variants: list[str],
                   colours: dict[str, str],
                   verdicts: dict[str, str] | None = None) -> dict[str, str]:
        """Write the study's saved views and the runs' colours and verdicts
        (:meth:`lmablate.tracking.mlflow_store.MlflowStore.save_views`); returns their URLs, none
        when nothing is recorded."""
        ...

    def runs_view_url(self) -> str | None:
        """Where the MLflow UI shows the runs view
        (:meth:`lmablate.tracking.mlflow_store.MlflowStore.runs_view_url`); None when nothing is
        recorded."""
        ...


class NullTracker(Tracker):
    """A :class:`Tracker` that records nothing (tracking disabled, or in unit tests)."""

    active_run_id: str | None = None

    @contextlib.contextmanager
    def run(self, name: str, tags: Mapping[str, Any] | None = None, *, nested: bool = False,
            run_id: str | None = None, parent_run_id: str | None = None) -> Iterator[str | None]:
        yield run_id

    def log_params(self, params: Mapping[str, Any]) -> None:
        pass

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        pass

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        pass

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        pass

    def runs_view_url(self) -> str | None:
        return None

    def save_views(self, datasets: list[str], variants: list[str],
                   colours: dict[str, str],
                   verdicts: dict[str, str] | None = None) -> dict[str, str]:
        return {}

    def find_run(self, tags: Mapping[str, Any]) -> str | None:
        return None

    @contextlib.contextmanager
    def open_run(self, name: str, tags: Mapping[str, Any] | None = None, *,
                 run_id: str | None = None,
                 parent_run_id: str | None = None) -> Iterator["NullTracker"]:
        bound = NullTracker()
        bound.run_id = run_id  # type: ignore[attr-defined]
        yield bound
