"""Stage ``tune``: an Optuna study per dataset x variant over learning rate and width.

Objective: validation loss (nats/token) after ``tune.steps`` training steps on the study's first
seed. The study lives in persistent Optuna storage (SQLite by default, a shared PostgreSQL for
several machines), named by dataset, variant and a fingerprint of every setting that affects the
objective: an interrupted run resumes its study; a changed setting starts a fresh one. On a CPU,
several trials run at once (Optuna's parallel workers: threads by default, see
:mod:`lmablate.parallel`); more machines join the same study through shared storage.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import threading
import time
import warnings

import optuna

from . import fileio
from .config import StudyConfig
from .tracking import NullTracker, make_tracker
from .train import (DivergenceError, TokenData, preflight, resolve_device, resolve_model_config,
                    train_model)

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


def study_name(cfg: StudyConfig, dataset: str, variant: str) -> str:
    """``<dataset>-<variant>-<fingerprint>``, the fingerprint covering every objective input."""
    fp = cfg.fingerprint(cfg.dataset(dataset), cfg.model, cfg.variants[variant], cfg.train.steps,
                         cfg.train.batch_size, cfg.train.weight_decay, cfg.train.beta1,
                         cfg.train.beta2, cfg.train.grad_clip, cfg.train.warmup_steps,
                         cfg.train.lr_schedule, cfg.train.eval_interval, cfg.train.eval_iters,
                         cfg.tune.n_trials, cfg.tune.steps, cfg.tune.lr_low, cfg.tune.lr_high,
                         cfg.tune.d_model_choices, cfg.tune.sampler_seed, cfg.tune.pruner,
                         cfg.tune.percentile, cfg.tune.report_interval, cfg.seeds[0],
                         cfg.match_params)
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


@dataclass(frozen=True)
class TuneJob:
    """One Optuna worker (``n_jobs`` trials at a time in threads), picklable for a process."""

    cfg: StudyConfig
    dataset: str
    variant: str
    tokens_dir: Path
    worker: int
    parent_run_id: str | None
    n_jobs: int = 1


def tune_worker(job: TuneJob) -> int:
    """Run trials of the shared study until ``tune.n_trials`` have finished, ``job.n_jobs`` at a
    time (Optuna's ``n_jobs`` threads); returns how many this worker ran. Each trial is an MLflow
    run under the dataset x variant's parent run and reports its val loss every
    ``tune.report_interval`` steps to the pruner."""
    cfg, tune = job.cfg, job.cfg.tune
    train_cfg = dataclasses.replace(cfg.train, eval_interval=tune.report_interval)
    tracker = make_tracker(cfg.tracking)
    data = TokenData.load(job.tokens_dir)
    device = resolve_device(cfg.train.device)
    # Each worker gets its own sampler seed: the same seed would propose the same points.
    study = load_study(cfg, job.dataset, job.variant, tune.sampler_seed + job.worker)
    tags = {"dataset": job.dataset, "variant": job.variant, "stage": "tune",
            "optuna_study": study.study_name}
    ran, lock = 0, threading.Lock()  # trials of this worker, counted across its threads

    def objective(trial: optuna.Trial) -> float:
        nonlocal ran
        if is_surplus(study, trial, tune.n_trials):
            study.stop()
            reason = f"surplus: {tune.n_trials} trials had started before it (tune.n_trials)"
            trial.set_user_attr("fail_reason", reason)
            raise SurplusTrial(reason)
        with lock:
            ran += 1
        lr = trial.suggest_float("lr", tune.lr_low, tune.lr_high, log=True)
        d_model = trial.suggest_categorical("d_model", list(tune.d_model_choices))
        model_cfg = resolve_model_config(cfg, job.variant, data.vocab_size, d_model)

        def report(step: int, val_loss: float) -> None:
            trial.report(val_loss, step)
            if trial.should_prune():
                tracker.set_tags({"state": "PRUNED"})
                raise optuna.TrialPruned(f"pruned at step {step}: val_loss {val_loss:.4f}")

        with tracker.run(f"trial-{trial.number}", {**tags, "trial": trial.number},
                         parent_run_id=job.parent_run_id):
            tracker.log_params({"lr": lr, "d_model": d_model, "trial": trial.number})
            try:
                result = train_model(model_cfg, train_cfg, data, seed=cfg.seeds[0], lr=lr,
                                     steps=tune.steps, device=device, on_eval=report,
                                     tracker=tracker,
                                     desc=f"{job.dataset}/{job.variant}/trial {trial.number}")
            except DivergenceError as exc:
                trial.set_user_attr("fail_reason", str(exc))
                tracker.set_tags({"state": "FAILED", "fail_reason": str(exc)})
                raise
            return result.val_loss

    if sum(t.state in COUNTED for t in study.trials) < tune.n_trials:
        # MaxTrialsCallback counts trials in the shared storage, so resumed studies and several
        # workers (processes or machines) stop together at n_trials; n_trials also caps this
        # worker should every trial diverge.
        study.optimize(objective, n_trials=tune.n_trials, n_jobs=job.n_jobs,
                       catch=(DivergenceError, SurplusTrial),
                       callbacks=[optuna.study.MaxTrialsCallback(tune.n_trials, states=COUNTED)])
    return ran


def run(cfg: StudyConfig, dataset: str, variant: str, tokens_dir: Path, best_path: Path,
        trials_path: Path, tracker: NullTracker) -> dict:
    """Run (or resume) the study until ``tune.n_trials`` trials have finished.

    Writes ``best_path`` (JSON: lr, d_model, val_loss, study_name, trial, n_trials) and
    ``trials_path`` (CSV from ``study.trials_dataframe()``). Each trial is an MLflow run nested
    under one parent run per dataset x variant. A diverging trial (NaN/inf loss) is recorded as
    FAIL with its reason and the study goes on.

    Raises:
        ConfigError / ValueError: unknown dataset or variant, data too small, a model that fails
            the causality pre-flight; raised before the first trial.
        RuntimeError: no trial finished successfully.
    """
    from .parallel import map_jobs, threads_per_worker, use_processes, worker_count

    cfg.dataset(dataset)
    cfg.check_variant(variant)
    data = TokenData.load(tokens_dir)
    data.check_fits(cfg.model.context_length, dataset)
    models = [resolve_model_config(cfg, variant, data.vocab_size, d_model)
              for d_model in cfg.tune.d_model_choices]
    for model_cfg in models:
        preflight(model_cfg, f"variant {variant!r}")
    processes = use_processes(cfg.train, models)
    tune = cfg.tune
    study = load_study(cfg, dataset, variant, tune.sampler_seed)
    tags = {"dataset": dataset, "variant": variant, "stage": "tune",
            "optuna_study": study.study_name}
    with tracker.run(f"tune-{dataset}-{variant}", tags) as parent_run_id:
        tracker.log_params({"n_trials": tune.n_trials, "steps": tune.steps,
                            "lr_low": tune.lr_low, "lr_high": tune.lr_high,
                            "d_model_choices": list(tune.d_model_choices), "pruner": tune.pruner})
        while True:
            trials = study.trials
            finished = sum(t.state in FINISHED for t in trials)
            if finished >= tune.n_trials:
                break
            if sum(t.state in COUNTED for t in trials) >= tune.n_trials:
                # Trials still RUNNING: live workers elsewhere, or workers that were killed.
                # Wait; Optuna fails a trial whose heartbeat stopped and queues a retry.
                optuna.storages.fail_stale_trials(study)
                time.sleep(tune.heartbeat_seconds)
                continue
            remaining = tune.n_trials - finished
            workers = worker_count(cfg.train, remaining, resolve_device(cfg.train.device))
            threads = threads_per_worker(cfg.train, workers)
            if processes:
                jobs = [TuneJob(cfg, dataset, variant, tokens_dir, w, parent_run_id)
                        for w in range(workers)]
                map_jobs(tune_worker, jobs, workers, threads, processes=True)
            else:
                map_jobs(tune_worker, [TuneJob(cfg, dataset, variant, tokens_dir, 0,
                                               parent_run_id, n_jobs=workers)], 1, threads)
            now = study.trials
            if (sum(t.state in FINISHED for t in now) == finished
                    and sum(t.state in COUNTED for t in now) < tune.n_trials):
                break  # every new trial failed (e.g. diverged); reported below
        trials = study.trials
        if not any(t.state == optuna.trial.TrialState.COMPLETE for t in trials):
            raise RuntimeError(f"tune {dataset}/{variant}: no trial of study {study.study_name} "
                               "completed; see the failed trials' fail_reason in Optuna or MLflow")
        best = study.best_trial
        result = {"lr": best.params["lr"], "d_model": best.params["d_model"],
                  "val_loss": best.value, "study_name": study.study_name, "trial": best.number,
                  "n_trials": sum(t.state in FINISHED for t in trials),
                  # training steps spent: each trial's last reported step (pruned ones stop early)
                  "steps": sum(max(t.intermediate_values, default=0)
                               for t in trials if t.state in FINISHED)}
        tracker.log_metrics({"best_val_loss": best.value})
        tracker.log_params({"best_lr": result["lr"], "best_d_model": result["d_model"]})
    with fileio.atomic_path(trials_path) as tmp:
        study.trials_dataframe().to_csv(tmp, index=False)
    fileio.write_json(best_path, result)
    return result
