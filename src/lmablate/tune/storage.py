"""Optuna storage for the ``tune`` stage: studies that many workers share, trial by trial.

What a study tries is decided by :mod:`lmablate.tune.tuning` alone; this module only moves its
trials through persistent storage (SQLite by default, a shared PostgreSQL for several
machines): a worker claims a queued trial (:func:`claim`), beats while it trains
(:class:`Heartbeat`), and a trial whose worker died is failed and queued again with the same
parameters, so a rerun, or a second machine, computes the same thing.
"""

from __future__ import annotations

import threading
import time
import warnings

import optuna
from optuna.trial import TrialState

# Optuna's INFO lines contradict each other here: every tune stage printed "A new study
# created" and then, as its trial workers opened the same study, "Using an existing study".
# Warnings still show; the stage prints its own summary.
optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def make_storage(url: str, heartbeat_seconds: int = 10) -> optuna.storages.BaseStorage:
    """Optuna RDB storage for ``url``, with a heartbeat so that a trial whose worker died is
    marked FAIL and queued again with the same slot and parameters (Optuna's
    RetryHeartbeatStaleTrialCallback) instead of staying RUNNING. SQLite gets a generous lock
    timeout so that parallel workers wait rather than fail with "database is locked"; PostgreSQL a
    connect timeout so that an unreachable host fails soon.

    Raises:
        RuntimeError: the database cannot be reached or used, or its driver is missing (the
            message names the URL, password hidden, and ``LMABLATE_OPTUNA_STORAGE``).
    """
    import sqlalchemy

    if url.startswith("sqlite"):
        engine_kwargs = {"connect_args": {"timeout": 60}}
    elif url.startswith("postgresql"):
        engine_kwargs = {"connect_args": {"connect_timeout": 10}}
    else:
        engine_kwargs = None
    try:
        shown = sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a URL at all; RDBStorage below says so
        shown = url
    # Workers that start together on a fresh database race to create Optuna's tables; the loser
    # of that race fails once and finds the tables on its next attempt.
    for attempt in range(3):
        try:
            return optuna.storages.RDBStorage(
                url, engine_kwargs=engine_kwargs, heartbeat_interval=heartbeat_seconds,
                grace_period=4 * heartbeat_seconds,
                heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(
                    max_retry=2))
        except (ImportError, sqlalchemy.exc.ArgumentError) as exc:
            error = exc
            break
        except sqlalchemy.exc.SQLAlchemyError as exc:
            error = exc
            if attempt < 2:
                time.sleep(0.5 + attempt)
    hint = ("; install the database's driver (PostgreSQL: pip install 'lmablate[postgres]' and "
            "a postgresql+psycopg2:// URL)" if isinstance(error, ImportError) else "")
    cause = error.__cause__ if isinstance(error, ImportError) and error.__cause__ else error
    detail = str(getattr(cause, "orig", None) or cause).strip().splitlines()
    raise RuntimeError(
        f"Optuna storage {shown!r} cannot be used ({type(cause).__name__}: "
        f"{(detail[0] if detail else '')[:200]}){hint}; set LMABLATE_OPTUNA_STORAGE or "
        "tune.storage to a reachable database") from None


def load_study(storage: optuna.storages.BaseStorage, name: str) -> optuna.Study:
    """Create or load study ``name`` (minimising val loss). Its sampler is never asked for a
    point: every trial is queued with fixed parameters by :func:`lmablate.tune.tuning.propose`."""
    return optuna.create_study(study_name=name, storage=storage, load_if_exists=True,
                               direction="minimize",
                               sampler=optuna.samplers.RandomSampler(seed=0))


_CLAIM_LOCK = threading.Lock()


def claim(study: optuna.Study) -> optuna.Trial | None:
    """Take one queued (WAITING) trial of ``study`` for this worker, or None if none is left.

    The storage moves a trial from WAITING to RUNNING for one caller only, so threads,
    processes and machines never train the same queued trial twice, and, unlike
    ``study.ask()``, no trial is ever sampled outside :func:`lmablate.tune.tuning.propose`. (This is
    Optuna's own ``Study._pop_waiting_trial_id`` without the fallback to a new trial; it goes
    through the study's storage object so that the trial is known to the study's cache.)"""
    storage = study._storage
    # SQLite has no SELECT ... FOR UPDATE, so two connections can both see a trial WAITING and
    # both take it: the lock makes the threads of a process take turns. Between processes on
    # one SQLite file the race remains; the loser notices when it writes to the finished trial
    # (UpdateFinishedTrialError, see lmablate.tune.trials.run_trial), and its work was the same
    # as the winner's anyway.
    with _CLAIM_LOCK:
        for t in storage.get_all_trials(study._study_id, deepcopy=False,
                                        states=(TrialState.WAITING,)):
            # A heartbeat first: Optuna never fails a RUNNING trial that has no heartbeat at
            # all, so a worker killed between taking the trial and its first beat would leave
            # the slot RUNNING for good, and every later worker waiting on it.
            storage.record_heartbeat(t._trial_id)
            try:
                if storage.set_trial_state_values(t._trial_id, state=TrialState.RUNNING):
                    return optuna.Trial(study, t._trial_id)
            except optuna.exceptions.UpdateFinishedTrialError:
                continue
    return None


class Heartbeat:
    """Records the heartbeat of a running trial every ``interval`` seconds in a daemon thread,
    as Optuna's ``optimize`` does, so that a trial whose worker died is failed and retried by
    :func:`optuna.storages.fail_stale_trials`. A context manager. (Optuna's private
    ``get_heartbeat_thread`` in its place left a killed trial RUNNING for good: the rerun in
    ``tests/test_faults.py`` waited until its timeout.)"""

    def __init__(self, study: optuna.Study, trial: optuna.Trial, interval: float):
        self.storage, self.trial_id, self.interval = study._storage, trial._trial_id, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)

    def _beat(self) -> None:
        while True:
            self.storage.record_heartbeat(self.trial_id)
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> "Heartbeat":
        if isinstance(self.storage, optuna.storages._heartbeat.BaseHeartbeat):
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


