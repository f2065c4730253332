"""Optuna for the ``tune`` stage: a deterministic, batched study per dataset x variant.

Optuna's own parallel ``optimize`` is not reproducible: which point a trial gets and whether it
is pruned depend on which other trials happened to finish first. Here the study is a pure
function of its settings, code and data, however many workers (threads, processes, machines)
run its trials:

- Trials are numbered by *slot* (0 .. ``tune.n_trials`` - 1) and proposed in batches of
  ``tune.trials_per_batch`` (:func:`propose`): TPE (Bergstra et al. 2011) in a throwaway
  in-memory study that holds exactly the finished trials of earlier batches, in slot order,
  seeded by ``tune.sampler_seed`` and the batch index.
- The proposals are queued in the shared storage (WAITING trials carrying their slot); any
  worker claims one (:func:`claim`), trains it and tells the result.
- A trial is pruned (:func:`should_prune`) only against the finished trials of earlier batches,
  never during the learning-rate warm-up, and never while it is one of the
  ``tune.n_startup_trials`` start-up trials.
- A slot's result is its first finished trial (:func:`slot_results`); a retry after a worker
  died, or the same proposal queued twice by two machines, computes the same thing.

The study lives in persistent storage (SQLite by default, a shared PostgreSQL for several
machines), named by dataset, variant and the fingerprint of everything the objective depends on
(:func:`study_name`): settings, code and data. An interrupted run resumes its study; a change
starts a fresh one.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
import warnings
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import FrozenTrial, TrialState

# Optuna's INFO lines contradict each other here: every tune stage printed "A new study
# created" and then, as its trial workers opened the same study, "Using an existing study".
# Warnings still show; the stage prints its own summary.
optuna.logging.set_verbosity(optuna.logging.WARNING)

from .checkpoint import RUN_MODULES, code_version
from .config import TPE_SEED_STRIDE, StudyConfig, TrainConfig, TuneConfig
from .fingerprint import fingerprint

SLOT = "slot"  # user attribute: the trial's place in the study (0 .. n_trials - 1)
OUTCOME = "outcome"  # user attribute "diverged": a FAIL that is a result, not a lost worker
DIVERGED = "diverged"
# Modules whose code decides a trial's result besides the training code (RUN_MODULES).
TUNE_MODULES = RUN_MODULES + ("budget.py", "tuning.py", "variants.py", "stages/tune.py")
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
optuna.logging.set_verbosity(optuna.logging.WARNING)


def make_storage(url: str, heartbeat_seconds: int = 10) -> optuna.storages.BaseStorage:
    """Optuna RDB storage for ``url``, with a heartbeat so that a trial whose worker died is
    marked FAIL and queued again with the same slot and parameters (Optuna's
    RetryHeartbeatStaleTrialCallback) instead of staying RUNNING. SQLite gets a generous lock timeout
    so that parallel workers wait rather than fail with "database is locked"; PostgreSQL a
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


def make_pruner(tune: TuneConfig) -> optuna.pruners.BasePruner:
    """Optuna's pruner for ``tune.pruner``: ``median`` (MedianPruner: stop a trial whose val loss
    is worse than the median of finished trials at the same report), ``percentile``
    (PercentilePruner: worse than the best ``tune.percentile`` %) or ``none``. It only ever sees
    the finished trials of earlier batches (:func:`should_prune`), and only once
    ``tune.n_startup_trials`` of them have completed."""
    if tune.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=tune.n_startup_trials,
                                           n_warmup_steps=0)
    if tune.pruner == "percentile":
        return optuna.pruners.PercentilePruner(tune.percentile,
                                               n_startup_trials=tune.n_startup_trials,
                                               n_warmup_steps=0)
    return optuna.pruners.NopPruner()


def search_space(tune: TuneConfig) -> dict[str, optuna.distributions.BaseDistribution]:
    """``lr`` log-uniform in [``lr_low``, ``lr_high``] and ``d_model`` among the choices."""
    return {"lr": FloatDistribution(tune.lr_low, tune.lr_high, log=True),
            "d_model": CategoricalDistribution(list(tune.d_model_choices))}


def trial_train_config(cfg: StudyConfig, dataset: str, steps: int) -> TrainConfig:
    """The training settings of a trial of ``steps`` steps on ``dataset``: ``train`` with a
    validation loss every ``steps / tune.reports`` steps (what the pruner sees)."""
    return dataclasses.replace(cfg.train.for_dataset(dataset),
                               eval_interval=max(1, steps // cfg.tune.reports))


def study_name(cfg: StudyConfig, dataset: str, variant: str, data_fingerprint: str,
               sampler_seed: int) -> str:
    """``<dataset>-<variant>-<fingerprint>``. The fingerprint (:func:`lmablate.fingerprint`)
    covers every input of the objective: the dataset, the baseline model and the variant's
    overrides, the training settings with the dataset's budget, the tune settings (with
    ``sampler_seed``, which a re-tuning replaces), ``study.match_params``, the code of
    :data:`TUNE_MODULES` and the training data. So an edit of ``model.py`` starts a new study
    instead of returning trials trained by the old code."""
    # a trial validates tune.reports times, whatever train.eval_interval says
    train = dataclasses.replace(cfg.train.for_dataset(dataset), eval_interval=1)
    fp = fingerprint(cfg.dataset(dataset), cfg.model, cfg.variants[variant], train,
                     dataclasses.replace(cfg.tune, sampler_seed=sampler_seed), cfg.match_params,
                     code_version(TUNE_MODULES), data_fingerprint)
    return f"{dataset}-{variant}-{fp}"


def load_study(storage: optuna.storages.BaseStorage, name: str) -> optuna.Study:
    """Create or load study ``name`` (minimising val loss). Its sampler is never asked for a
    point: every trial is queued with fixed parameters by :func:`propose`."""
    return optuna.create_study(study_name=name, storage=storage, load_if_exists=True,
                               direction="minimize",
                               sampler=optuna.samplers.RandomSampler(seed=0))


def describe_study(study: optuna.Study, dataset: str, variant: str, budget_flops: float,
                   tune: TuneConfig, sampler_seed: int) -> None:
    """Name the objective (``val_loss``, nats/token) and record what the study tunes as its
    user attributes: dataset, variant, the dataset's budget (FLOPs), each trial's share of it,
    the search ranges and the sampler seed, so that the storage alone (optuna-dashboard, a
    PostgreSQL shared by workers) says what a study is. Setting them again writes the same
    values; nothing here changes a trial."""
    with warnings.catch_warnings():  # set_metric_names is marked experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(["val_loss"])
    for key, value in {"dataset": dataset, "variant": variant, "budget_flops": budget_flops,
                       "trial_budget_fraction": tune.budget_fraction,
                       "lr_range": [tune.lr_low, tune.lr_high],
                       "d_model_choices": list(tune.d_model_choices),
                       "sampler_seed": sampler_seed}.items():
        study.set_user_attr(key, value)


def slot_results(study: optuna.Study) -> dict[int, FrozenTrial]:
    """Each slot's result: its first finished trial (COMPLETE, PRUNED, or FAIL because the run
    diverged), by trial number. Later finished trials of a slot (a retry, or a proposal queued
    twice) computed the same thing and are ignored."""
    done: dict[int, FrozenTrial] = {}
    for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        slot = t.user_attrs.get(SLOT)
        if slot is None or slot in done:
            continue
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED) or (
                t.state == TrialState.FAIL and t.user_attrs.get(OUTCOME) == DIVERGED):
            done[slot] = t
    return done


def batch_of(tune: TuneConfig, slot: int) -> range:
    """The slots proposed together with ``slot``."""
    start = slot - slot % tune.trials_per_batch
    return range(start, min(start + tune.trials_per_batch, tune.n_trials))


def _history_study(tune: TuneConfig, history: list[FrozenTrial], sampler=None) -> optuna.Study:
    """An in-memory study holding ``history`` in order: what TPE and the pruner may see."""
    study = optuna.create_study(direction="minimize", sampler=sampler,
                                pruner=optuna.pruners.NopPruner())
    space = search_space(tune)
    for t in history:
        study.add_trial(optuna.trial.create_trial(
            state=t.state, params=t.params, distributions=space,
            value=t.value if t.state == TrialState.COMPLETE else None,
            intermediate_values=t.intermediate_values))
    return study


def propose(tune: TuneConfig, results: dict[int, FrozenTrial], slots: range,
            sampler_seed: int) -> list[dict[str, Any]]:
    """Parameters for ``slots`` (one batch), from the finished trials of the slots before it.

    TPE (multivariate, with a constant liar so that one batch spreads out) is seeded by
    ``sampler_seed`` and the batch's first slot, and sees the earlier slots in slot order: the
    same history gives the same proposals, whoever computes them and whenever.
    """
    history = [results[s] for s in range(slots.start)]
    sampler = optuna.samplers.TPESampler(
        seed=sampler_seed * TPE_SEED_STRIDE + slots.start, n_startup_trials=tune.n_startup_trials,
        multivariate=True, constant_liar=True)
    study = _history_study(tune, history, sampler)
    return [study.ask(search_space(tune)).params for _ in slots]


def should_prune(tune: TuneConfig, pruner: optuna.pruners.BasePruner, earlier: optuna.Study,
                 slot: int, step: int, warmup_steps: int, intermediate: dict[int, float]) -> bool:
    """Whether the trial of ``slot``, at optimizer ``step`` with val losses ``intermediate``
    (report index -> nats/token), is to stop. Never for a start-up slot, nor during the
    ``warmup_steps`` of learning-rate warm-up (early losses mostly say how fast the learning
    rate ramps up); otherwise ``pruner`` against ``earlier`` (:func:`earlier_trials`)."""
    if slot < tune.n_startup_trials or step <= warmup_steps:
        return False
    trial = optuna.trial.create_trial(state=TrialState.RUNNING,
                                      intermediate_values=dict(intermediate))
    return pruner.prune(earlier, trial)


def earlier_trials(tune: TuneConfig, study: optuna.Study, slot: int) -> optuna.Study:
    """The in-memory study of the finished trials of the batches before ``slot``'s, in slot
    order: what :func:`should_prune` judges ``slot``'s trial against.

    Raises:
        RuntimeError: an earlier slot has no result yet (its batch was not finished first).
    """
    results = slot_results(study)
    start = batch_of(tune, slot).start
    missing = [s for s in range(start) if s not in results]
    if missing:
        raise RuntimeError(f"study {study.study_name}: slot {slot} started before slots "
                           f"{missing} of earlier batches finished")
    return _history_study(tune, [results[s] for s in range(start)])


_CLAIM_LOCK = threading.Lock()


def claim(study: optuna.Study) -> optuna.Trial | None:
    """Take one queued (WAITING) trial of ``study`` for this worker, or None if none is left.

    The storage moves a trial from WAITING to RUNNING for one caller only, so threads,
    processes and machines never train the same queued trial twice, and, unlike
    ``study.ask()``, no trial is ever sampled outside :func:`propose`. (This is Optuna's own
    ``Study._pop_waiting_trial_id`` without the fallback to a new trial; it goes through the
    study's storage object so that the trial is known to the study's cache.)"""
    storage = study._storage
    # SQLite has no SELECT ... FOR UPDATE, so two connections can both see a trial WAITING and
    # both take it: the lock makes the threads of a process take turns. Between processes on
    # one SQLite file the race remains; the loser notices when it writes to the finished trial
    # (UpdateFinishedTrialError, see lmablate.stages.tune.run_trial), and its work was the same
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


def on_edge(tune: TuneConfig, params: dict[str, Any]) -> list[str]:
    """The tuned values that sit on the edge of their search range: ``lr`` within 5% of the
    log-range of a bound, ``d_model`` the smallest or largest choice (when there are several).
    Such a value says the range may have cut off the optimum."""
    flags = []
    span = math.log(tune.lr_high / tune.lr_low)
    where = math.log(params["lr"] / tune.lr_low) / span
    if where <= 0.05:
        flags.append("lr at lower bound")
    elif where >= 0.95:
        flags.append("lr at upper bound")
    choices = tune.d_model_choices
    if len(choices) > 1 and params["d_model"] in (choices[0], choices[-1]):
        which = "smallest" if params["d_model"] == choices[0] else "largest"
        flags.append(f"d_model the {which} choice")
    return flags
