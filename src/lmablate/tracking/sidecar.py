"""MLflow in a child process: the calls of :class:`~lmablate.tracking.mlflow_store.MlflowStore`,
made by a process that imported MLflow while the stage imported torch.

A stage command starts it first thing (:func:`start_sidecar`, from :mod:`lmablate.cli`); every
:class:`~lmablate.tracking.trackers.MlflowTracker` made afterwards in that process logs through it
(:class:`RemoteStore`), and the records are the same as in-process. The child ignores Ctrl-C
(the stage records its runs KILLED through it) and ends, without a word, when the stage closes
its end of the pipe.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from typing import Any

from lmablate.config.study import TrackingConfig
from lmablate.tracking.mlflow_store import MlflowStore, TrackingError


class Sidecar:
    """A child process that imports MLflow, opens its store and makes the calls of
    :class:`MlflowStore` for this process.

    MLflow's import and the opening of its store take about 2 s of pure Python (1.2 s import,
    0.6 s SQLAlchemy and alembic), which a thread cannot overlap with torch's import (both hold
    the GIL). The ``lmablate`` command starts the sidecar first thing (:func:`start_sidecar`),
    so that on a second core MLflow gets ready while the stage imports torch and reads its data.
    Every call waits for its answer, so a record is written when the call returns, as
    in-process, and an MLflow error is raised where the call was made. The child is given the
    caller's ``sys.argv`` (for MLflow's ``mlflow.source.*`` tags), environment and working
    directory at its start, and ends when this process closes its end of the pipe (at exit, or
    when it dies).

    Raises:
        TrackingError: from any call, when the child failed or is gone.
    """

    def __init__(self, open_first: tuple[str, str] | None = None):
        from multiprocessing.connection import Connection

        child_reads, parent_writes = os.pipe()
        parent_reads, child_writes = os.pipe()
        self._proc = subprocess.Popen(
            [sys.executable, "-c",
             f"import lmablate.tracking.sidecar as s; s._serve({child_reads}, "
             f"{child_writes})"], pass_fds=(child_reads, child_writes), stdin=subprocess.DEVNULL)
        os.close(child_reads)
        os.close(child_writes)
        self._send = Connection(parent_writes, readable=False)
        self._recv = Connection(parent_reads, writable=False)
        self._lock = threading.Lock()
        self._send.send(("argv", list(sys.argv)))
        # Stores asked to open before anyone waits for them: key -> reply, None until read.
        self._opened: dict[tuple[str, str], tuple[bool, Any] | None] = {}
        if open_first:
            self._send.send(("open", open_first))
            self._opened[open_first] = None

    def _exchange(self, op: str, request: tuple | None) -> tuple[bool, Any]:
        """Send ``request`` (if any) and read the next reply; the caller holds the lock."""
        try:
            if request is not None:
                self._send.send(request)
            return self._recv.recv()
        except (OSError, EOFError):
            raise TrackingError(f"the MLflow sidecar process exited (status "
                                f"{self._proc.poll()}) before answering {op!r}") from None

    def call(self, op: str, *args: Any) -> Any:
        """Run :class:`MlflowStore` method ``op`` in the child (or, for ``"open"``, make the
        store of ``args`` = (uri, experiment)), return what it returned."""
        with self._lock:  # requests are answered one by one, in order
            for key, reply in self._opened.items():  # replies to opens sent ahead
                if reply is None:
                    self._opened[key] = self._exchange("open", None)
            if op == "open" and args in self._opened:
                ok, value = self._opened[args]  # type: ignore[misc]
            else:
                ok, value = self._exchange(op, (op, args))
        if not ok:
            raise TrackingError(value)
        return value


def _serve(reads: int, writes: int) -> None:
    """The :class:`Sidecar` child: answers ``(op, args)`` requests with ``(True, result)`` or
    ``(False, message)`` until the parent closes the pipe. ``("open", (uri, experiment))`` makes
    an :class:`MlflowStore` (kept per URI and experiment); ``(name, (key, *args))`` calls its
    method ``name``."""
    import signal
    from multiprocessing.connection import Connection

    # Ctrl-C reaches the whole process group: the parent turns it into KILLED runs, which it
    # records through this process, so this one must outlive it and end at the pipe's EOF.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    recv, send = Connection(reads, writable=False), Connection(writes, readable=False)

    def reply(ok: bool, value: Any) -> None:
        try:
            send.send((ok, value))
        except (OSError, EOFError):  # BrokenPipeError: the parent is gone; nobody to answer
            os._exit(0)

    stores: dict[tuple[str, str], MlflowStore] = {}
    while True:
        try:
            op, args = recv.recv()
        except (EOFError, OSError):
            os._exit(0)  # no teardown: every call has been answered, its record written
        if op == "argv":
            sys.argv = args  # MLflow's context tags read the command from sys.argv
            continue
        try:
            if op == "open":
                if args not in stores:
                    stores[args] = MlflowStore(*args)
                result: tuple[bool, Any] = (True, None)
            elif op in ("start_run", "end_run", "log_batch", "log_artifact", "runs_view_url",
                        "find_run", "save_views"):
                result = (True, getattr(stores[args[0]], op)(*args[1:]))
            else:
                result = (False, f"unknown MLflow sidecar request {op!r}")
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the caller
            first = (str(exc).splitlines() or [""])[0][:300]
            result = (False, str(exc) if isinstance(exc, TrackingError)
                      else f"MLflow {op}: {type(exc).__name__}: {first}")
        reply(*result)


class RemoteStore:
    """:class:`MlflowStore`'s methods, run by the :class:`Sidecar`."""

    def __init__(self, sidecar: Sidecar, uri: str, experiment: str):
        self._sidecar, self._key = sidecar, (uri, experiment)
        sidecar.call("open", *self._key)

    def __getattr__(self, op: str):
        return lambda *args: self._sidecar.call(op, self._key, *args)


_SIDECAR: Sidecar | None = None


def current() -> Sidecar | None:
    """This process's sidecar, once :func:`start_sidecar` has started it; else None."""
    return _SIDECAR


def start_sidecar(cfg: TrackingConfig) -> None:
    """Start this process's :class:`Sidecar` and have it open ``cfg``'s store; every later
    :class:`~lmablate.tracking.trackers.MlflowTracker` of this process logs through it. For commands
    that record runs: the child imports MLflow whether or not a run is recorded."""
    global _SIDECAR
    if _SIDECAR is None:
        _SIDECAR = Sidecar((cfg.tracking_uri, cfg.experiment))
