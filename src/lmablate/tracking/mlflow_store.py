"""The MLflow store: every call lmablate makes to MLflow, on one tracking URI and experiment.

:class:`MlflowStore` writes through ``MlflowClient`` with explicit run ids, so any thread, or
the sidecar process (:mod:`lmablate.tracking.sidecar`), can log to any run. It also keeps the
study's saved views in the UI (:mod:`lmablate.tracking.mlflow_views`) and ends runs whose owning
process died (:func:`owner_tags`, :func:`owner_alive`). :mod:`lmablate.tracking.trackers` builds the
trackers the stages use on top of it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import socket
import tempfile
from pathlib import Path
from typing import Iterator, Mapping

from lmablate.core.gc_pause import gc_paused
from lmablate.tracking import mlflow_views as views

# The experiment's kind, as MLflow 3's UI reads it (its ExperimentKind enum): a model-training
# experiment opens on the runs table instead of the GenAI "Traces" view.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"

# The saved views of the study in the UI (lmablate.tracking.mlflow_views): the table of the final
# runs, grouped by dataset x variant, written when the store is opened if the experiment has none;
# the study's views in full (groups closed, one chart view per dataset, runs in their variant's
# colour) written by the report stage (MlflowStore.save_views), when every run is there.
RUNS_VIEW_KEY = views.RUNS_VIEW_KEY
RUNS_VIEW_TAG = views.view_tag(RUNS_VIEW_KEY)
RUNS_VIEW = views.runs_view(metrics=views.HEADLINE + views.CURVES)  # before any run


# Artifacts of a study whose store is a SQLite file live beside it, in the folder `mlflow ui`
# and `mlflow server` serve by default (--artifacts-destination ./mlartifacts), and its experiment
# records them as proxied locations (mlflow-artifacts:/<experiment>/...), which the server
# resolves against that folder: a moved or re-cloned study opens with working links. MLflow's
# default instead stores the absolute path of ./mlruns as the cwd was when the experiment began.
ARTIFACTS_FOLDER = "mlartifacts"
PROXIED = "mlflow-artifacts:"


def local_artifact_root(uri: str) -> Path | None:
    """The folder beside a SQLite tracking store that holds its artifacts (``<db folder>/
    mlartifacts``); None for any other store (a server, PostgreSQL, ``:memory:``)."""
    m = re.fullmatch(r"sqlite(?:\+\w+)?:///([^?]+)(\?.*)?", uri)
    if not m or m.group(1) == ":memory:":
        return None
    return Path(os.path.abspath(m.group(1))).parent / ARTIFACTS_FOLDER


def artifact_dir(tracking_uri: str, artifact_uri: str) -> Path:
    """Where a run's artifacts (``artifact_uri``, as MLflow records it) lie on this disk, for a
    store on this disk: a proxied location under :func:`local_artifact_root`, else the path of a
    ``file:`` URI or a plain path.

    Raises:
        ValueError: a proxied location of a store that is not a local SQLite file.
    """
    if artifact_uri.startswith(PROXIED):
        root = local_artifact_root(tracking_uri)
        if root is None:
            raise ValueError(f"{artifact_uri} is served by a tracking server, not on this disk")
        return root / artifact_uri[len(PROXIED):].lstrip("/")
    return Path(artifact_uri.removeprefix("file://").removeprefix("file:"))


def experiment_folder(name: str) -> str:
    """The folder of experiment ``name`` under :data:`ARTIFACTS_FOLDER`: its name with anything
    but letters, digits, ``.``, ``_`` and ``-`` replaced by ``-``."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip(".-") or "experiment"


# The process that owns a run (recorded on it when it starts or is reopened): a run left
# RUNNING by a process that no longer exists is ended KILLED by the next store opened on the
# same host (MlflowStore.end_stale_runs). The start time tells a reused pid from its owner.
HOST_TAG, PID_TAG, START_TAG = "lmablate.host", "lmablate.pid", "lmablate.pid_start"


def _process_start(pid: int) -> str:
    """Process ``pid``'s start time (clock ticks after boot, from ``/proc``); "" where unknown
    (not Linux, or no such process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    fields = stat.rpartition(")")[2].split()  # after the command name, which may hold spaces
    return fields[19] if len(fields) > 19 else ""  # field 22, starttime


def owner_tags() -> dict[str, str]:
    """The tags that name this process as a run's owner: host name, pid and start time."""
    pid = os.getpid()
    return {HOST_TAG: socket.gethostname(), PID_TAG: str(pid), START_TAG: _process_start(pid)}


def owner_alive(tags: Mapping[str, str]) -> bool:
    """Whether the process named by a run's :func:`owner_tags` still runs on this host (a
    zombie, or another process that got its pid, does not count). True for a run of another
    host, or without the tags: nothing here can tell."""
    if tags.get(HOST_TAG) != socket.gethostname() or not tags.get(PID_TAG, "").isdigit():
        return True
    pid = int(tags[PID_TAG])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        pass
    start = _process_start(pid)
    if start and tags.get(START_TAG) and start != tags[START_TAG]:
        return False
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True


class TrackingError(RuntimeError):
    """The MLflow tracking store cannot be reached or written."""


@contextlib.contextmanager
def _first_use_lock(uri: str) -> Iterator[None]:
    """Hold an exclusive lock, per SQLite file, while a store is opened: MLflow creates a new
    SQLite store's tables (alembic migrations) on first use, and processes that open the same
    new file at once (the train stage's worker processes) fail with "table ... already exists".
    The lock file is in the temporary directory, keyed by the database's absolute path (only
    processes of one host share a SQLite file). Other stores (a server, PostgreSQL) need none."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    database = Path(uri.removeprefix("sqlite:///")).resolve()
    key = hashlib.sha256(str(database).encode()).hexdigest()[:16]
    with open(Path(tempfile.gettempdir()) / f"lmablate-mlflow-{key}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


_SWEPT: set[tuple[str, str]] = set()  # stores whose stale runs this process has ended


class MlflowStore:
    """The MLflow calls a tracker needs, on one tracking URI and experiment, through
    ``MlflowClient``: the records MLflow's fluent API (``start_run``, ``log_metrics``, ...) would
    write, with run ids passed explicitly so that any thread (or another process, see
    :class:`lmablate.tracking.sidecar.Sidecar`) can log to any run.

    Args:
        uri: the tracking URI (``sqlite:///...``, ``postgresql://...``, ``http://...``).
        experiment: the experiment's name; created if missing, as ``mlflow.set_experiment``.

    The first store a process opens on an experiment ends the runs that processes killed on
    this host left RUNNING (:meth:`end_stale_runs`).

    Raises:
        TrackingError: the store cannot be reached or the experiment cannot be set (e.g. a server
            URI that does not answer), at construction.
    """

    def __init__(self, uri: str, experiment: str):
        with gc_paused():  # MLflow's import, then the first store opened (SQLAlchemy, alembic)
            import mlflow  # slow import, only where a run is recorded
            from mlflow.entities import LifecycleStage

            # MLflow logs alembic migrations and the like at INFO on first use of a SQLite store
            # ("Creating initial MLflow database tables..." in the middle of a dvc repro's log):
            # warnings only, unless the user asks with MLflow's own MLFLOW_LOGGING_LEVEL
            logging.getLogger("alembic").setLevel(logging.WARNING)
            if "MLFLOW_LOGGING_LEVEL" not in os.environ:
                logging.getLogger("mlflow").setLevel(logging.WARNING)
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
            self.uri = uri
            self._artifact_uris: dict[str, str] = {}  # run id -> its artifact location
            self._end_times: dict[str, int] = {}  # reopened run id -> its earlier end (ms)
            # processes opening a new SQLite store at once would each create its tables
            with _first_use_lock(uri):
                self.client = mlflow.MlflowClient(tracking_uri=uri)
                try:  # what mlflow.set_experiment does
                    exp = self.client.get_experiment_by_name(experiment)
                    if exp is None:
                        # MLflow 3's UI opens an experiment of no kind on its GenAI "Traces" view;
                        # this kind opens it on the runs table
                        root = local_artifact_root(uri)
                        self.experiment_id = self.client.create_experiment(
                            experiment, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND},
                            artifact_location=(f"{PROXIED}/{experiment_folder(experiment)}"
                                               if root else None))
                    elif exp.lifecycle_stage == LifecycleStage.DELETED:
                        raise RuntimeError(f"experiment {experiment!r} is deleted; restore it "
                                           "(mlflow experiments restore) or pick another name")
                    else:
                        self.experiment_id = exp.experiment_id
                    if exp is None or RUNS_VIEW_TAG not in exp.tags:  # save_views writes the rest
                        self.client.set_experiment_tag(self.experiment_id, RUNS_VIEW_TAG,
                                                       json.dumps(RUNS_VIEW, sort_keys=True))
                    if exp is not None and (uri, experiment) not in _SWEPT:  # once per process
                        _SWEPT.add((uri, experiment))
                        self.end_stale_runs()
                except Exception as exc:  # noqa: BLE001 - any backend failure means "unreachable"
                    raise TrackingError(
                        f"MLflow tracking store {uri!r} cannot be used ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0][:200]}); set MLFLOW_TRACKING_URI or tracking.uri "
                        "to a reachable store, or tracking.enabled: false") from None

    def _search(self, filter_string: str) -> list:
        """Every run of the experiment that ``filter_string`` selects, oldest first."""
        runs, token = [], None
        while True:
            page = self.client.search_runs([self.experiment_id], filter_string,
                                           max_results=1000, order_by=["attributes.start_time ASC"],
                                           page_token=token)
            runs.extend(page)
            token = page.token
            if not token:
                return runs

    def end_stale_runs(self) -> list[str]:
        """End KILLED the runs of the experiment that are RUNNING, were started on this host
        and whose owning process (:func:`owner_tags`) is gone: killed with ``kill -9``, or a
        machine that went down. Runs of other hosts are left alone (on a cluster their owners
        may be running). Called when the store is opened; returns the ids ended."""
        host = socket.gethostname().replace("'", "")
        ended = []
        for run in self._search(f"attributes.status = 'RUNNING' AND tags.`{HOST_TAG}` = '{host}'"):
            if not owner_alive(run.data.tags):
                self.client.set_terminated(run.info.run_id, "KILLED")
                ended.append(run.info.run_id)
        return ended

    def find_run(self, tags: Mapping[str, str]) -> str | None:
        """The id of the oldest top-level run (no parent) of the experiment with every tag of
        ``tags`` that is not RUNNING, or None: a run to reopen instead of adding a duplicate
        (the parent run of an Optuna study tuned again after a kill). A RUNNING one belongs to
        a live process (see :meth:`end_stale_runs`), on this host or another, and is left to
        it."""
        from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

        clauses = [f"tags.`{k}` = '{str(v)}'" for k, v in tags.items() if "'" not in str(v)]
        for run in self._search(" AND ".join(clauses)):
            if (run.info.status != "RUNNING" and MLFLOW_PARENT_RUN_ID not in run.data.tags
                    and all(run.data.tags.get(k) == str(v) for k, v in tags.items())):
                return run.info.run_id
        return None

    def start_run(self, name: str, tags: Mapping[str, str], run_id: str | None = None,
                  parent_run_id: str | None = None) -> str:
        """Create a run named ``name`` with ``tags``, MLflow's context tags (``mlflow.user``,
        ``mlflow.source.name``, ``mlflow.source.git.commit``, ...) and, with ``parent_run_id``,
        ``mlflow.parentRunId``; or, with ``run_id``, set that run RUNNING again and add ``tags``.
        Returns the run's id."""
        from mlflow.entities import RunTag
        from mlflow.tracking.context import registry
        from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID, MLFLOW_RUN_NAME

        if run_id:
            # A reopened run that had finished (evaluate adding its metrics to train's run)
            # keeps the end time it had, so that the UI's Duration stays its training's, not
            # the span to evaluation. One that was cut off (a resumed seed) goes on to a new end.
            info = self.client.get_run(run_id).info
            if info.end_time and info.status == "FINISHED":
                self._end_times[run_id] = info.end_time
            if tags:  # first: the new owner's tags, so that no one finds it RUNNING and ownerless
                self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
            self.client.update_run(run_id, status="RUNNING")
            return run_id
        tags = {**tags, MLFLOW_RUN_NAME: name}
        if parent_run_id:
            tags[MLFLOW_PARENT_RUN_ID] = parent_run_id
        return self.client.create_run(self.experiment_id, tags=registry.resolve_tags(tags),
                                      run_name=name).info.run_id

    def runs_view_url(self) -> str:
        """The part of the MLflow UI's URL after its address that opens this experiment on the
        saved runs view (:data:`RUNS_VIEW`), in the UI's machine-learning mode (MLflow 3 opens
        in its GenAI mode otherwise)."""
        return views.view_url(self.experiment_id, RUNS_VIEW_KEY)

    def save_views(self, datasets: list[str], variants: list[str],
                   colours: dict[str, str],
                   verdicts: dict[str, str] | None = None) -> dict[str, str]:
        """Write the study's saved views (:func:`lmablate.tracking.mlflow_views.study_views`) on the
        experiment, from the metrics and budgets its final runs logged, and tag every final run
        with its variant's colour (``colours``: variant -> ``"#rrggbb"``, the run tag
        ``mlflow.runColor`` the UI draws a run in) and, with ``verdicts``
        (``"<dataset>/<variant>"`` -> the verdict in the dataset's headline loss), its verdict
        (tag ``verdict``, by which the runs view also groups, so the verdict is on its first
        screen). Tags already right are not written again.

        Returns:
            ``"runs"`` -> the URL part of the table view, each dataset -> that of its
            chart view, and ``"tuning"`` -> dataset -> that of its trials' parallel
            coordinates (:func:`lmablate.tracking.mlflow_views.view_url`).
        """
        from mlflow.entities import RunTag

        metrics: dict[str, set[str]] = {d: set() for d in datasets}
        budgets: dict[str, set[str]] = {}
        for run in self._search("tags.stage = 'final'"):
            tags = run.data.tags
            metrics.setdefault(tags.get("dataset", ""), set()).update(run.data.metrics)
            if views.BUDGET_TAG in tags:
                budgets.setdefault(tags.get("dataset", ""), set()).add(tags[views.BUDGET_TAG])
            want = {views.RUN_COLOR_TAG: colours.get(tags.get("variant", ""))}
            if verdicts and tags.get("replicate", "0") == "0":
                want[views.VERDICT_TAG] = verdicts.get(
                    f"{tags.get('dataset', '')}/{tags.get('variant', '')}")
            new = [RunTag(k, v) for k, v in want.items() if v and tags.get(k) != v]
            if new:
                self.client.log_batch(run.info.run_id, tags=new)
        trial_metrics: dict[str, set[str]] = {d: set() for d in datasets}
        for run in self._search("tags.stage = 'tune' AND attributes.run_name LIKE 'trial-%'"):
            trial_metrics.setdefault(run.data.tags.get("dataset", ""), set()).update(
                run.data.metrics)
        have = self.client.get_experiment(self.experiment_id).tags
        ordered = {d: sorted(b, key=float) for d, b in budgets.items()}
        for tag, value in views.study_views(datasets, variants, metrics, ordered,
                                            verdicts, trial_metrics).items():
            if have.get(tag) != value:
                self.client.set_experiment_tag(self.experiment_id, tag, value)
        return {"runs": self.runs_view_url(),
                **{d: views.view_url(self.experiment_id, views.dataset_view_key(d), charts=True)
                   for d in datasets},
                "tuning": {d: views.view_url(self.experiment_id, views.tuning_view_key(d),
                                             charts=True) for d in datasets}}

    def end_run(self, run_id: str, status: str) -> None:
        """End run ``run_id`` with ``status`` (``FINISHED``, ``FAILED`` or ``KILLED``), at the
        end time it had before :meth:`start_run` reopened it, else now."""
        self.client.set_terminated(run_id, status, end_time=self._end_times.pop(run_id, None))

    def log_batch(self, run_id: str, params: Mapping[str, str] | None = None,
                  metrics: list[tuple[str, float, int, int]] | None = None,
                  tags: Mapping[str, str] | None = None) -> None:
        """Log ``params``, ``metrics`` ((key, value, timestamp in ms, step) each) and ``tags``
        to run ``run_id`` in one call."""
        from mlflow.entities import Metric, Param, RunTag

        self.client.log_batch(run_id, params=[Param(k, v) for k, v in (params or {}).items()],
                              metrics=[Metric(*m) for m in metrics or []],
                              tags=[RunTag(k, v) for k, v in (tags or {}).items()])

    def log_artifact(self, run_id: str, path: str, artifact_path: str | None = None) -> None:
        """Copy file or directory ``path`` (absolute) into run ``run_id``'s artifacts."""
        if run_id not in self._artifact_uris:
            self._artifact_uris[run_id] = self.client.get_run(run_id).info.artifact_uri
        uri = self._artifact_uris[run_id]
        if uri.startswith(PROXIED) and local_artifact_root(self.uri) is not None:
            # a SQLite store with no server to proxy: write where `mlflow ui` will look (a
            # tracking server's own proxied locations go through the client, to the server)
            from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository

            repo = LocalArtifactRepository(str(artifact_dir(self.uri, uri)))
            if Path(path).is_dir():
                repo.log_artifacts(path, artifact_path)
            elif Path(path).exists():
                repo.log_artifact(path, artifact_path)
            return
        if Path(path).is_dir():
            self.client.log_artifacts(run_id, path, artifact_path=artifact_path)
        elif Path(path).exists():
            self.client.log_artifact(run_id, path, artifact_path=artifact_path)
