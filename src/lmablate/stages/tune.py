"""Stage ``tune``: an Optuna study per dataset x variant over learning rate and width.

Objective: validation loss (nats/token) after ``tune.steps`` training steps on the study's first
seed. Each trial is an MLflow run nested under one parent run per dataset x variant. On a CPU,
several trials run at once (Optuna's parallel workers: threads by default, see
:mod:`lmablate.parallel`); more machines join the same study through shared storage
(:mod:`lmablate.tuning`).
"""

from __future__ import annotations

import argparse
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import optuna

from .. import fileio
from ..config import StudyConfig
from ..device import resolve_device
from ..parallel import map_jobs, threads_per_worker, use_processes, worker_count
from ..tokens import TokenData
from ..tracking import NullTracker, make_tracker
from ..training import DivergenceError, train_model
from ..tuning import (COUNTED, FINISHED, SurplusTrial, is_surplus, load_study,
                      trial_train_config)
from ..variants import preflight, resolve_model_config


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
    train_cfg = trial_train_config(cfg)
    tracker = make_tracker(cfg.tracking)
    data = TokenData.load(job.tokens_dir)
    device = resolve_device(cfg.runtime.device)
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
    cfg.dataset(dataset)
    cfg.check_variant(variant)
    data = TokenData.load(tokens_dir)
    data.check_fits(cfg.model.context_length, dataset)
    models = [resolve_model_config(cfg, variant, data.vocab_size, d_model)
              for d_model in cfg.tune.d_model_choices]
    for model_cfg in models:
        preflight(model_cfg, f"variant {variant!r}")
    processes = use_processes(cfg.runtime, models)
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
            workers = worker_count(cfg.runtime, remaining, resolve_device(cfg.runtime.device))
            threads = threads_per_worker(cfg.runtime, workers)
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
    fileio.write_csv(trials_path, study.trials_dataframe())
    fileio.write_json(best_path, result)
    return result


def main(cfg: StudyConfig, args: argparse.Namespace) -> None:
    """``lmablate tune <dataset> <variant> --tokens DIR --best FILE --trials FILE``."""
    cfg.check_variant(args.variant)
    run(cfg, args.dataset, args.variant, args.tokens, args.best, args.trials,
        make_tracker(cfg.tracking))
