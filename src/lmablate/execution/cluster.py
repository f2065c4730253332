"""The jobs of a stage (training seeds, evaluations, tuning workers) as tasks of a Dask cluster.

``runtime.cluster`` (or ``LMABLATE_CLUSTER``) names a Dask ``distributed`` scheduler; the stage
process that ``dvc repro`` runs stays the driver: it validates, sends one task per job, and
writes every output into its own workspace, so DVC sees the same files as after a local run.
DVC stays the unit of caching; a cluster never changes a byte (``tests/test_cluster.py``).

Before any task, :func:`connect` asks every worker what it computes with
(:class:`MachineKind`: torch version, lmablate's code, the CPU kernels or GPU) and refuses a
worker that differs from this machine in one line naming both: the same torch wheel and seed
give other weights with AVX512, AVX2 or default kernels; a variant's own component is imported
from the worker's ``components/``, so the worker must hold the driver's file (its sha256). Each
task checks again on its worker (a worker may join later). A worker on another host must reach
the same Optuna storage and MLflow tracking server: SQLite and file stores are refused then. Workers that see this
workspace's files (a shared filesystem, always so on one machine) read and write them there;
others get their inputs with the task and send their outputs back with its result.
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import os
import secrets
import socket
import time
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch

from lmablate.config.study import ConfigError, StudyConfig
from lmablate.core import fileio, interrupt
from lmablate.core.component_files import component_file, file_hashes, named_components
from lmablate.execution.scheduler_probe import probe_scheduler
from lmablate.tracking.environment import use_numerics
from lmablate.train.device import resolve_device
from lmablate.train.numerics import numerics_kind

# Seconds to wait for a first worker to join the scheduler before the stage fails.
WORKER_WAIT_SECONDS = 60
# Seconds between checks for Ctrl-C while waiting for a task's result.
POLL_SECONDS = 0.25
# Where the probe for a shared filesystem is written (DVC's own ignored scratch folder).
PROBE_DIR = Path(".dvc") / "tmp"


@dataclass(frozen=True)
class MachineKind:
    """What a process computes with, as far as it changes a result's bytes."""

    torch: str  # torch.__version__
    code: str  # sha256 prefix of every module of the lmablate package
    cpu: str  # numerics_kind of the CPU, e.g. "cpu AVX512 numerics 6f1286420fc4"
    gpu: str | None  # numerics_kind of the first CUDA device, e.g. "cuda NVIDIA H200 numerics ..."
    host: str  # socket.gethostname(): a worker on another host needs server stores
    # (components/<module>.py, sha256 or None where missing) of the user's components the study
    # names, as the process's working directory holds them: a task imports them from there
    components: tuple[tuple[str, str | None], ...] = ()


def package_code() -> str:
    """First 16 hex digits of the sha256 of every ``.py`` module of the lmablate package (names
    and bytes, in sorted order): a worker with other code would compute other results."""
    root = Path(__file__).parents[1]  # the lmablate package
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def machine_kind(component_files: Sequence[str] = ()) -> MachineKind:
    """This process's :class:`MachineKind`, with the sha256 of ``component_files``
    (``components/<module>.py``) as its working directory holds them."""
    gpu = numerics_kind(torch.device("cuda", 0)) if torch.cuda.is_available() else None
    return MachineKind(torch.__version__, package_code(), numerics_kind(torch.device("cpu")), gpu,
                       socket.gethostname(), tuple(file_hashes(component_files).items()))


def study_component_files(cfg: StudyConfig) -> tuple[str, ...]:
    """The files (``components/<module>.py``) of the user's components the study's variants
    name, sorted: every worker must hold them as this machine does."""
    return tuple(sorted({component_file(name) for variant in cfg.study_variants
                         for name in named_components(cfg.model, cfg.variants[variant]).values()}))


def mismatch(worker: str, theirs: MachineKind, ours: MachineKind,
             device_type: str) -> str | None:
    """Why a worker of kind ``theirs`` may not compute for a driver of kind ``ours`` on
    ``device_type`` (``cpu`` or ``cuda``), in one line naming both; None when it may."""
    checks = [("torch", theirs.torch, ours.torch), ("lmablate code", theirs.code, ours.code)]
    if device_type == "cpu":
        checks.append(("CPU", theirs.cpu.removeprefix("cpu "), ours.cpu.removeprefix("cpu ")))
    else:
        checks.append(("GPU", (theirs.gpu or "none").removeprefix("cuda "),
                       (ours.gpu or "none").removeprefix("cuda ")))
    theirs_files = dict(theirs.components)
    for rel, digest in ours.components:  # a file the driver lacks fails its own pre-flight
        theirs_digest = theirs_files.get(rel)
        checks.append((rel, f"sha256 {theirs_digest[:12]}" if theirs_digest else "none (missing)",
                       f"sha256 {digest[:12]}" if digest else "none (missing)"))
    for what, a, b in checks:
        if a != b:
            hint = {"CPU": " (start every worker with the same ATEN_CPU_CAPABILITY, or none, as "
                           "this machine, from an install of requirements.lock)",
                    "GPU": " (every GPU worker must have the same GPU)"}.get(
                what, " (start every worker in a checkout with this machine's components/)"
                if what.startswith("components/") else "")
            return (f"runtime.cluster: worker {worker} computes with {what} {a}, this machine "
                    f"with {b}; its results would differ, so it is refused{hint}")
    return None


@dataclass(frozen=True)
class _Task:
    """One job as a cluster task: ``fn(job)``, checked against the driver's ``kind``; without a
    shared filesystem (``root`` set) the ``inputs`` are written under a scratch folder first,
    the job's paths are moved there, and the files under ``outputs`` come back."""

    fn: Callable[[Any], Any]
    job: Any
    kind: MachineKind
    device_type: str
    env: tuple[tuple[str, str], ...]
    root: str | None = None
    inputs: tuple[tuple[str, bytes], ...] = ()
    outputs: tuple[str, ...] = ()


# The stores a task's worker uses are the driver's: these variables are set for each task.
_ENV_LOCK = threading.Lock()


def _run_task(task: _Task) -> tuple[Any, dict[str, bytes]]:
    """Run ``task`` on a worker: ``(fn(job), files)``, ``files`` the outputs by path relative to
    the driver's workspace (empty with a shared filesystem).

    Raises:
        ConfigError: this worker is not of the driver's kind (:func:`mismatch`).
    """
    from distributed import get_worker  # only ever called on a worker
    files = [rel for rel, _ in task.kind.components]
    problem = mismatch(get_worker().address, machine_kind(files), task.kind, task.device_type)
    if problem:
        raise ConfigError(problem)
    from lmablate.execution.parallel import INTRA_OP_THREADS
    torch.set_num_threads(INTRA_OP_THREADS)  # as in map_jobs: the same bits at any worker count
    with _ENV_LOCK:
        os.environ.update(dict(task.env))
    if task.root is None:
        return task.fn(task.job), {}
    with tempfile.TemporaryDirectory(prefix="lmablate-task-") as scratch:
        for rel, data in task.inputs:
            path = Path(scratch) / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        result = task.fn(_moved(task.job, Path(task.root), Path(scratch)))
        files = {}
        for rel in task.outputs:
            for path in sorted((Path(scratch) / rel).rglob("*")):
                if path.is_file():
                    files[path.relative_to(scratch).as_posix()] = path.read_bytes()
        return result, files


def _map_paths(obj: Any, change: Callable[[Path], Path]) -> Any:
    """``obj`` with ``change`` applied to every path in it: in dataclasses (their init fields),
    lists and tuples, recursively."""
    if isinstance(obj, Path):
        return change(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_paths(x, change) for x in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: _map_paths(getattr(obj, f.name), change)
                                           for f in dataclasses.fields(obj) if f.init})
    return obj


def _moved(obj: Any, old: Path, new: Path) -> Any:
    """``obj`` with every path under ``old`` moved under ``new``."""
    return _map_paths(obj, lambda p: new / p.relative_to(old) if p.is_relative_to(old) else p)


def _absolute(obj: Any, root: Path) -> Any:
    """``obj`` with every relative path made absolute under ``root`` (workers have other
    working directories)."""
    return _map_paths(obj, lambda p: p if p.is_absolute() else root / p)


def _absolute_url(url: str, root: Path) -> str:
    """A ``sqlite:///relative.db`` URL made absolute under ``root``; other URLs as given."""
    prefix = "sqlite:///"
    if url.startswith(prefix) and not url.startswith(prefix + "/"):
        return prefix + str(root / url[len(prefix):])
    return url


def _local_store(url: str) -> bool:
    """Whether a store URL is a file on the driver's disk (SQLite, a file path, ``file:``)."""
    return url.startswith(("sqlite:", "file:")) or "://" not in url


class Cluster:
    """A connection to the scheduler of ``runtime.cluster``, checked for use by one stage
    (:func:`connect`): the device type its tasks compute on, the kind every worker matches,
    whether the workers see this workspace."""

    def __init__(self, client, address: str, device: torch.device, kind: MachineKind,
                 workers: dict[str, MachineKind], threads: dict[str, int], shared: bool,
                 cfg: StudyConfig) -> None:
        self.client, self.address, self.device, self.kind = client, address, device, kind
        self.workers, self.threads, self.shared = workers, threads, shared
        self.root = Path.cwd().resolve()
        # the stores every task uses: this process's (its environment included)
        self.env = tuple((k, v) for k, v in (
            ("LMABLATE_OPTUNA_STORAGE", _absolute_url(cfg.tune.storage_url, self.root)),
            ("MLFLOW_TRACKING_URI", _absolute_url(cfg.tracking.tracking_uri, self.root))))

    @property
    def numerics(self) -> str:
        """The :func:`~lmablate.train.numerics.numerics_kind` every task computes on."""
        return self.kind.gpu if self.device.type == "cuda" else self.kind.cpu

    def check_single_threaded(self, why: str) -> None:
        """Refuse workers that run several tasks at once in one process when ``why`` (a model
        with dropout) needs a process per task: its masks come from the process-wide RNG, so
        concurrent tasks would draw them in a nondeterministic order.

        Raises:
            ConfigError: a worker has more than one thread.
        """
        many = sorted(w for w, n in self.threads.items() if n > 1)
        if many:
            raise ConfigError(f"runtime.cluster: {why}, so each task needs a worker process of "
                              f"its own, but worker {many[0]} runs {self.threads[many[0]]} "
                              "tasks at once; start the workers with --nthreads 1")

    def pin(self, cfg: StudyConfig) -> StudyConfig:
        """``cfg`` as the workers must see it: the device type resolved here, the Optuna
        storage and MLflow tracking URI as this process resolves them (environment included),
        a relative SQLite path made absolute, and no cluster (a task computes locally)."""
        return dataclasses.replace(
            cfg, runtime=dataclasses.replace(cfg.runtime, device=self.device.type, cluster=None),
            tune=dataclasses.replace(cfg.tune, storage=_absolute_url(cfg.tune.storage_url,
                                                                     self.root)),
            tracking=dataclasses.replace(cfg.tracking, uri=_absolute_url(
                cfg.tracking.tracking_uri, self.root)))

    def map(self, fn: Callable[[Any], Any], jobs: Sequence[Any], names: Sequence[str], *,
            inputs: Callable[[Any], Iterable[Path]] = lambda job: (),
            outputs: Callable[[Any], Iterable[Path]] = lambda job: ()) -> list[Any]:
        """``[fn(job) for job in jobs]`` as tasks named ``names`` (Dask keys; a random suffix
        keeps them unique), results in the jobs' order. On CUDA each task holds one ``GPU``
        resource. Without a shared filesystem, the files under each job's ``inputs`` travel
        with its task and those under its ``outputs`` come back and are written here
        atomically. Ctrl-C cancels the tasks not yet finished.

        Raises:
            Interrupted: the stage was asked to stop.
            ConfigError: a worker is not of this machine's kind.
            Exception: the first task's error, as raised on its worker.
        """
        env = self.env
        tasks = []
        for job in jobs:
            job = _absolute(job, self.root)
            if self.shared:
                tasks.append(_Task(fn, job, self.kind, self.device.type, env))
                continue
            files = tuple((p.relative_to(self.root).as_posix(), p.read_bytes())
                          for d in inputs(job) for p in _files(d))
            outs = tuple(Path(d).relative_to(self.root).as_posix() for d in outputs(job))
            tasks.append(_Task(fn, job, self.kind, self.device.type, env, str(self.root),
                               files, outs))
        suffix = secrets.token_hex(4)
        resources = {"GPU": 1} if self.device.type == "cuda" else None
        futures = self.client.map(_run_task, tasks, key=[f"{n}-{suffix}" for n in names],
                                  resources=resources, retries=0)
        try:
            with interrupt.deferred():  # Ctrl-C: Interrupted at the next poll of _wait
                done = [_wait(f) for f in futures]
        except BaseException:
            self.client.cancel(futures)
            raise
        for _, files in done:
            for rel, data in files.items():
                with fileio.atomic_path(self.root / rel) as tmp:
                    tmp.write_bytes(data)
        return [result for result, _ in done]


def _files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else []


def _wait(future) -> Any:
    """``future.result()``, checking for Ctrl-C every :data:`POLL_SECONDS`. Polls
    ``future.done()`` and asks for the result once it is there: ``result(timeout=...)`` can end
    in distributed's own ``UnboundLocalError`` when its timeout cancels the wait as the result
    arrives (``distributed.utils.sync`` catches ``Exception``, not the ``CancelledError``)."""
    while not future.done():
        interrupt.check()
        time.sleep(POLL_SECONDS)
    return future.result()


_CLIENTS: dict[str, Any] = {}


def _client(address: str, timeout: float, key: str):
    """One client per scheduler address and process, closed at exit; the address is probed
    first (:func:`lmablate.execution.scheduler_probe.probe_scheduler`), so a dead one fails in about
    ``timeout`` seconds with what answered there."""
    if address not in _CLIENTS:
        probe_scheduler(address, timeout, key)
        from distributed import Client
        try:
            client = Client(address, timeout=timeout, set_as_default=False)
        except (OSError, TypeError) as exc:  # TypeError: distributed's on a TLS mismatch
            raise ConfigError(f"params: {key}={address!r} is not allowed; no Dask "
                              f"scheduler answers there ({exc})") from None
        if not _CLIENTS:
            atexit.register(close_clients)
        _CLIENTS[address] = client
    return _CLIENTS[address]


def close_clients() -> None:
    """Close this process's clients (at exit; before a scheduler they talk to goes away)."""
    while _CLIENTS:
        _CLIENTS.popitem()[1].close()


def _identify(component_files: Sequence[str] = ()) -> MachineKind:
    # sent to the workers by name, so each answers with its own machine_kind()
    return machine_kind(component_files)


def _sees(path: str, token: str) -> bool:
    try:
        return Path(path).read_text() == token
    except OSError:
        return False


def connect(cfg: StudyConfig) -> Cluster | None:
    """The cluster of ``cfg.runtime`` checked for this stage, or None without one.

    Waits up to :data:`WORKER_WAIT_SECONDS` for a first worker. The tasks compute on CUDA when
    ``runtime.device`` is ``auto`` or ``cuda`` and a worker has a ``GPU`` resource
    (``dask worker --resources GPU=1``), else on CPUs.

    Raises:
        ConfigError: no scheduler answers, no worker joins, a worker is not of this machine's
            kind (torch, lmablate code, CPU capability; GPU workers of different GPUs; a file of
            components/ that a variant of the study names missing or other), or a
            worker on another host while the Optuna storage or MLflow store is a local file.
            All before any task.
    """
    address = cfg.runtime.cluster_address
    if address is None:
        return None
    client = _client(address, cfg.runtime.cluster_timeout, cfg.runtime.cluster_key)
    try:
        client.wait_for_workers(1, timeout=WORKER_WAIT_SECONDS)
    except TimeoutError:
        raise ConfigError(f"params: {cfg.runtime.cluster_key}={address!r}: no worker joined its "
                          f"scheduler in {WORKER_WAIT_SECONDS} s; start one with dask worker "
                          f"{address}") from None
    files = study_component_files(cfg)
    ours = machine_kind(files)
    kinds = client.run(_identify, files)
    info = client.scheduler_info(n_workers=-1)["workers"]
    gpus = [w for w, i in info.items() if i.get("resources", {}).get("GPU", 0) >= 1]
    device = torch.device("cuda" if gpus and cfg.runtime.device in ("auto", "cuda") else "cpu")
    if cfg.runtime.device not in ("auto", "cpu", "cuda") or (
            cfg.runtime.device == "cuda" and not gpus):
        raise ConfigError(f"params: runtime.device={cfg.runtime.device!r} is not allowed with "
                          f"{cfg.runtime.cluster_key}={address!r}; its workers offer "
                          f"{'cuda and cpu' if gpus else 'cpu only (no GPU=1 resource)'}")
    if device.type == "cuda":
        first = kinds[gpus[0]]
        ours = dataclasses.replace(ours, gpu=ours.gpu or first.gpu)
        kinds = {w: kinds[w] for w in gpus}
    for worker, theirs in sorted(kinds.items()):
        problem = mismatch(worker, theirs, ours, device.type)
        if problem:
            raise ConfigError(problem)
    remote = sorted(w for w, k in kinds.items() if k.host != ours.host)
    stores = [("tune.storage (LMABLATE_OPTUNA_STORAGE)", cfg.tune.storage_url)]
    if cfg.tracking.enabled:
        stores.append(("tracking.uri (MLFLOW_TRACKING_URI)", cfg.tracking.tracking_uri))
    for key, url in stores:
        if remote and _local_store(url):
            raise ConfigError(f"params: {key}={url!r} is not allowed with workers on other "
                              f"hosts ({remote[0]}); use a server every worker reaches "
                              "(postgresql+psycopg2://..., http://mlflow-host:5000)")
    shared = not remote or _shared_filesystem(client, list(kinds))
    threads = {w: info[w].get("nthreads", 1) for w in kinds}
    return Cluster(client, address, device, ours, kinds, threads, shared, cfg)


def _shared_filesystem(client, workers: list[str]) -> bool:
    """Whether every worker reads a file this process writes into the workspace."""
    PROBE_DIR.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(16)
    probe = (PROBE_DIR / f"lmablate-probe-{token[:8]}").resolve()
    probe.write_text(token)
    try:
        seen = client.run(_sees, str(probe), token, workers=workers)
    finally:
        probe.unlink(missing_ok=True)
    return all(seen.values())


def resolve(cfg: StudyConfig) -> tuple[torch.device, str, Cluster | None]:
    """Where a stage's jobs compute: ``(device, numerics_kind, cluster)``; on this machine
    (:func:`lmablate.train.device.resolve_device`) without a cluster.

    Raises:
        ConfigError: as :func:`connect`, or a device this machine lacks.
    """
    cluster = connect(cfg)
    if cluster is None:
        device = resolve_device(cfg.runtime.device)
        use_numerics(numerics_kind(device))  # the MLflow runs' tags
        return device, numerics_kind(device), None
    use_numerics(cluster.numerics)
    return cluster.device, cluster.numerics, cluster
