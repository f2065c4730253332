"""Optuna for the ``tune`` stage: storage, pruner, the study's name, and the trial-count rule.

A study per dataset x variant lives in persistent Optuna storage (SQLite by default, a shared
PostgreSQL for several machines), named by dataset, variant and the fingerprint of every setting
that affects the objective: an interrupted run resumes its study; a changed setting starts a
fresh one. Several workers (threads, processes or machines) share one study and together finish
exactly ``tune.n_trials`` trials (:func:`is_surplus`).
"""

from __future__ import annotations

import dataclasses
import time
import warnings

import optuna

from .config import StudyConfig, TrainConfig
from .fingerprint import fingerprint

# Trials that count towards ``tune.n_trials``: a pruned trial is a finished trial too; a running
# one will finish (or, if its worker died, be failed by the heartbeat check and retried).
FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
COUNTED = FINISHED + (optuna.trial.TrialState.RUNNING,)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def make_storage(url: str, heartbeat_seconds: int = 10) -> optuna.storages.BaseStorage:
    """Optuna RDB storage for ``url``, with a heartbeat so that a trial whose worker died is
    marked FAIL and retried (Optuna's RetryFailedTrialCallback) instead of staying RUNNING.
    SQLite gets a generous lock timeout so that parallel workers wait rather than fail with
    "database is locked"; PostgreSQL a connect timeout so that an unreachable host fails soon.

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


def make_pruner(name: str, n_startup_trials: int, percentile: float = 25.0,
                n_warmup_steps: int = 1) -> optuna.pruners.BasePruner:
    """Optuna's pruner for ``tune.pruner``: ``median`` (MedianPruner: stop a trial whose val loss
    is worse than the median of finished trials at the same step), ``percentile``
    (PercentilePruner: worse than the best ``percentile`` %), ``hyperband`` (HyperbandPruner,
    Li et al. 2018) or ``none``. Median and percentile prune once ``n_startup_trials`` trials
    have finished, at reports after step ``n_warmup_steps``."""
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=n_startup_trials,
                                           n_warmup_steps=n_warmup_steps)
    if name == "percentile":
        return optuna.pruners.PercentilePruner(percentile, n_startup_trials=n_startup_trials,
                                               n_warmup_steps=n_warmup_steps)
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner()
    return optuna.pruners.NopPruner()


def trial_train_config(cfg: StudyConfig) -> TrainConfig:
    """The training settings of one trial: ``train`` with ``tune.steps`` steps and a validation
    loss every ``tune.report_interval`` steps (what the pruner sees)."""
    return dataclasses.replace(cfg.train, steps=cfg.tune.steps,
                               eval_interval=cfg.tune.report_interval)


def study_name(cfg: StudyConfig, dataset: str, variant: str) -> str:
    """``<dataset>-<variant>-<fingerprint>``. The fingerprint (:func:`lmablate.config.fingerprint`)
    covers every input of the objective: the dataset, the baseline model and the variant's
    overrides, a trial's training settings (:func:`trial_train_config`), the tune settings, the
    seed trials train on and ``study.match_params``."""
    fp = fingerprint(cfg.dataset(dataset), cfg.model, cfg.variants[variant],
                     trial_train_config(cfg), cfg.tune, cfg.seeds[0], cfg.match_params)
    return f"{dataset}-{variant}-{fp}"


def load_study(cfg: StudyConfig, dataset: str, variant: str, sampler_seed: int) -> optuna.Study:
    """Create or load the study of ``dataset`` x ``variant`` in ``tune.storage``."""
    return optuna.create_study(
        study_name=study_name(cfg, dataset, variant),
        storage=make_storage(cfg.tune.storage_url, cfg.tune.heartbeat_seconds),
        load_if_exists=True, direction="minimize",
        sampler=optuna.samplers.TPESampler(seed=sampler_seed),
        # No trial is judged during its learning-rate warm-up: early losses mostly say how fast
        # the learning rate ramps up, and pruning there cost the best trial in benchmarks.
        pruner=make_pruner(cfg.tune.pruner, n_startup_trials=max(1, cfg.tune.n_trials // 4),
                           percentile=cfg.tune.percentile,
                           n_warmup_steps=max(1, cfg.train.warmup_steps)))


class SurplusTrial(Exception):
    """A trial that another worker's trials made one too many (see :func:`is_surplus`)."""


def is_surplus(study: optuna.Study, trial: optuna.Trial, n_trials: int) -> bool:
    """True if ``n_trials`` counted trials were created before ``trial``.

    MaxTrialsCallback checks the count before a worker creates its next trial, so two workers
    whose trials end at the same moment can both start one more. Optuna numbers trials one at a
    time (it locks the study row), so counting the trials numbered below this one is exact: a
    surplus trial ends as FAIL without training, and the study keeps exactly ``n_trials``
    finished trials."""
    return sum(t.number < trial.number
               for t in study.get_trials(deepcopy=False, states=COUNTED)) >= n_trials
