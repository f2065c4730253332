"""The one place that talks to MLflow.

Every stage gets a :class:`Tracker`; with ``tracking.enabled: false`` it is a :class:`NullTracker`
whose calls do nothing, so stage code never checks whether tracking is on. Runs are tagged with
``dataset``, ``variant``, ``seed`` and ``stage`` so the MLflow UI can filter and compare them.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import time
from pathlib import Path
from typing import Any, Iterator, Mapping

from .config import TrackingConfig


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector: MLflow's import allocates some 10^6 long-lived objects,
    and the collections they trigger scan them again and again (a quarter of the import time).
    Nothing collectable is made meanwhile. Trackers made in several threads at once: the
    collector is back on once the thread that paused it is done."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class TrackingError(RuntimeError):
    """The MLflow tracking store cannot be reached or written."""


class NullTracker:
    """A tracker that records nothing (tracking disabled, or in unit tests)."""

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

    @contextlib.contextmanager
    def open_run(self, name: str, tags: Mapping[str, Any] | None = None, *,
                 run_id: str | None = None) -> Iterator["NullTracker"]:
        """Like :meth:`run`, but the run is not made this thread's active run: yields a tracker
        bound to it (its id in ``run_id``), so that one thread can log to several runs at once
        (the seeds of :func:`lmablate.batched.train_seeds`)."""
        bound = NullTracker()
        bound.run_id = run_id  # type: ignore[attr-defined]
        yield bound


class MlflowRunTracker(NullTracker):
    """Logs to one MLflow run by id through ``MlflowClient`` (the records MLflow's fluent calls
    would write to that run), whatever this thread's active run is."""

    def __init__(self, client, run_id: str):
        self._client, self.run_id = client, run_id

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        self._client.log_batch(self.run_id, params=[Param(k, str(v)) for k, v in params.items()])

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        clean = [Metric(k, float(v), now, step or 0) for k, v in metrics.items() if v is not None]
        if clean:
            self._client.log_batch(self.run_id, metrics=clean)

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        path = Path(path)
        if path.is_dir():
            self._client.log_artifacts(self.run_id, str(path), artifact_path=artifact_path)
        elif path.exists():
            self._client.log_artifact(self.run_id, str(path), artifact_path=artifact_path)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        from mlflow.entities import RunTag

        self._client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])


class MlflowTracker(NullTracker):
    """MLflow-backed tracker: one experiment per study, runs nested where asked.

    Args:
        cfg: tracking settings; ``MLFLOW_TRACKING_URI`` overrides ``cfg.uri``.

    Raises:
        TrackingError: the store cannot be reached (e.g. a server URI that does not answer);
            raised at construction so a stage fails before any training.
    """

    def __init__(self, cfg: TrackingConfig):
        with gc_paused():
            import mlflow  # slow import, only when tracking is on

        # MLflow logs alembic migrations and the like at INFO on first use of a SQLite store.
        logging.getLogger("alembic").setLevel(logging.WARNING)
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        self._mlflow = mlflow
        self.uri = cfg.tracking_uri
        mlflow.set_tracking_uri(self.uri)
        try:
            with gc_paused():  # the first store opened imports SQLAlchemy, alembic, MLflow's models
                self._experiment_id = mlflow.set_experiment(cfg.experiment).experiment_id
        except Exception as exc:  # noqa: BLE001 - any backend failure means "unreachable"
            raise TrackingError(
                f"MLflow tracking store {self.uri!r} cannot be used ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:200]}); set MLFLOW_TRACKING_URI or tracking.uri "
                "to a reachable store, or tracking.enabled: false"
            ) from None

    @property
    def active_run_id(self) -> str | None:  # type: ignore[override]
        run = self._mlflow.active_run()
        return run.info.run_id if run else None

    @contextlib.contextmanager
    def run(self, name: str, tags: Mapping[str, Any] | None = None, *, nested: bool = False,
            run_id: str | None = None, parent_run_id: str | None = None) -> Iterator[str]:
        """Start (or, with ``run_id``, reopen) a run; yields its id. ``parent_run_id`` nests it
        under a run of another process (Optuna workers). Ends it on exit, marking it FAILED if
        the body raised."""
        tags = {k: str(v) for k, v in (tags or {}).items()}
        with self._mlflow.start_run(run_id=run_id, run_name=None if run_id else name,
                                    nested=nested or parent_run_id is not None,
                                    parent_run_id=parent_run_id, tags=tags) as active:
            yield active.info.run_id

    @contextlib.contextmanager
    def open_run(self, name: str, tags: Mapping[str, Any] | None = None, *,
                 run_id: str | None = None) -> Iterator[MlflowRunTracker]:
        """Start (or, with ``run_id``, reopen) a run as :meth:`run` does (same name, tags and
        MLflow's context tags such as ``mlflow.user`` and ``mlflow.source.name``), without
        making it this thread's active run; yields a :class:`MlflowRunTracker` bound to it.
        Ends it on exit, marking it FAILED if the body raised."""
        from mlflow.entities import RunTag
        from mlflow.tracking.context import registry
        from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME

        client = self._mlflow.MlflowClient(tracking_uri=self.uri)
        tags = {k: str(v) for k, v in (tags or {}).items()}
        if run_id:
            client.update_run(run_id, status="RUNNING")
            if tags:
                client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
        else:
            resolved = registry.resolve_tags({**tags, MLFLOW_RUN_NAME: name})
            run_id = client.create_run(self._experiment_id, tags=resolved,
                                       run_name=name).info.run_id
        status = "FINISHED"
        try:
            yield MlflowRunTracker(client, run_id)
        except BaseException:
            status = "FAILED"
            raise
        finally:
            client.set_terminated(run_id, status)

    def log_params(self, params: Mapping[str, Any]) -> None:
        self._mlflow.log_params({k: v for k, v in params.items()})

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        clean = {k: float(v) for k, v in metrics.items() if v is not None}
        if clean:
            self._mlflow.log_metrics(clean, step=step)

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        path = Path(path)
        if path.is_dir():
            self._mlflow.log_artifacts(str(path), artifact_path=artifact_path)
        elif path.exists():
            self._mlflow.log_artifact(str(path), artifact_path=artifact_path)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        self._mlflow.set_tags({k: str(v) for k, v in tags.items()})


def make_tracker(cfg: TrackingConfig) -> NullTracker:
    """An :class:`MlflowTracker` when ``cfg.enabled``, else a :class:`NullTracker`."""
    return MlflowTracker(cfg) if cfg.enabled else NullTracker()
