"""Ctrl-C as a request to stop at the next step, in every thread and worker process of a stage.

Python delivers SIGINT to the main thread alone, as a ``KeyboardInterrupt`` at whatever line it
is running. A stage's training runs in other threads (or processes), which would train on to
the end, and an exception in the middle of a write to the MLflow sidecar's pipe or to a resume
state would leave either half done. So while jobs run (:func:`deferred`, entered by
:func:`lmablate.execution.parallel.map_jobs` and the batched train path), SIGINT only sets a
process-wide flag, and the loops call :func:`check` at every training step and evaluation batch: it
raises :class:`Interrupted` (a ``KeyboardInterrupt``) there, between two steps, in whichever thread
runs the loop. Worker processes install the same handler for their whole life
(:func:`install_handler`), so that a SIGINT reaching an idle worker does not kill it.

Checking costs one ``Event.is_set()`` per step and changes nothing an uninterrupted run
computes.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

_REQUESTED = threading.Event()
# Nesting depth of deferred() in the main thread (map_jobs inside map_jobs) and the SIGINT
# handler it replaced: only the outermost entry installs and restores.
_DEPTH = 0
_PREVIOUS: object = None


class Interrupted(KeyboardInterrupt):
    """The stage was asked to stop (Ctrl-C, or SIGINT): raised by :func:`check` at the next
    training step or evaluation batch of every job. A ``KeyboardInterrupt``, so that whatever
    lets a real error through (``except Exception``) lets this through too, and MLflow runs end
    KILLED rather than FAILED (:meth:`lmablate.tracking.trackers.MlflowTracker.open_run`)."""

    def __init__(self, message: str = "interrupted"):
        super().__init__(message)


def request() -> None:
    """Ask every job of this process to stop at its next :func:`check`."""
    _REQUESTED.set()


def requested() -> bool:
    """Whether this process has been asked to stop."""
    return _REQUESTED.is_set()


def reset() -> None:
    """Forget a stop request (for a process that goes on to other work: tests, notebooks).
    A stage process never resets: once asked, it stops."""
    _REQUESTED.clear()


def check() -> None:
    """Return at once unless this process has been asked to stop.

    Raises:
        Interrupted: a stop was requested (:func:`request`, or SIGINT under :func:`deferred`
            or :func:`install_handler`).
    """
    if _REQUESTED.is_set():
        raise Interrupted()


def _on_sigint(signum: int, frame: object) -> None:
    _REQUESTED.set()


def install_handler() -> None:
    """Make SIGINT request a stop for the rest of this process's life (a worker process: its
    parent decides when the stage ends). Call from the main thread."""
    signal.signal(signal.SIGINT, _on_sigint)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """While inside, SIGINT requests a stop (:func:`request`) instead of raising
    ``KeyboardInterrupt`` in the main thread; the jobs then stop at their next :func:`check`,
    and :class:`Interrupted` reaches the caller from them. A stop requested while the last job
    was past its last check is raised on leaving (the outermost entry), so that a Ctrl-C is
    never lost. Does nothing outside the main thread (signals go to the main thread only), or
    where SIGINT is not Python's default handler (a process started with SIGINT ignored keeps
    ignoring it; a worker process has its own, :func:`install_handler`).

    Raises:
        Interrupted: on leaving, when a stop was requested and nothing else is being raised.
    """
    global _DEPTH, _PREVIOUS
    if threading.current_thread() is not threading.main_thread() or (
            _DEPTH == 0 and signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    if _DEPTH == 0:
        _PREVIOUS = signal.signal(signal.SIGINT, _on_sigint)
    _DEPTH += 1
    try:
        yield
    finally:
        _DEPTH -= 1
        if _DEPTH == 0:
            signal.signal(signal.SIGINT, _PREVIOUS)
    if _DEPTH == 0:
        check()
