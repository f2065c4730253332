"""Stage ``tune``: a deterministic Optuna study per dataset x variant over learning rate and width.

Objective: validation loss (nats/token) after a trial's share of the dataset's training budget
(``tune.budget_fraction`` of ``train.budget_flops``), on the tuning seed ``tune.seed``, which is
not a final seed. Trials are proposed a batch at a time and judged only against earlier batches
(:mod:`lmablate.tuning`), so the study is the same at any ``runtime.workers``, in threads,
processes or on several machines sharing one storage. Each trial is an MLflow run nested under
one parent run per dataset x variant.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.trial import TrialState

from .. import fileio, interrupt
from ..budget import run_steps, training_flops, trial_steps
from ..config import MAX_SAMPLER_SEED, ConfigError, StudyConfig
from ..device import resolve_device
from ..parallel import map_jobs, use_processes, worker_count
from ..tokens import TokenData
from ..tracking import NullTracker, make_tracker
from ..training import DivergenceError, train_model
from ..tuning import (DIVERGED, OUTCOME, SLOT, Heartbeat, batch_of, claim, earlier_trials,
                      describe_study, load_study, make_pruner, make_storage, on_edge, propose, should_prune,
                      slot_results, study_name, trial_train_config)
from ..variants import preflight, resolve_model_config

TRIALS_COLUMNS = ("number", "batch", "state", "value", "params_lr", "params_d_model", "steps",
                  "last_step", "flops", "fail_reason")


@dataclass(frozen=True)
class TuneJob:
    """One worker: claims queued trials of the study until none is left. Picklable for a
    process."""

    cfg: StudyConfig
    dataset: str
    variant: str
    tokens_dir: Path
    study_name: str
    parent_run_id: str | None


def tune_worker(job: TuneJob) -> int:
    """Run queued trials of ``job.study_name`` until the queue is empty; returns how many this
    worker ran.

    Raises:
        Interrupted: the stage was asked to stop; no further trial is taken.
    """
    cfg = job.cfg
    storage = make_storage(cfg.tune.storage_url, cfg.tune.heartbeat_seconds)
    study = load_study(storage, job.study_name)
    data = TokenData.load(job.tokens_dir)
    device = resolve_device(cfg.runtime.device)
    tracker = make_tracker(cfg.tracking)
    ran = 0
    while True:
        interrupt.check()  # before each claim: a trial taken after Ctrl-C would only fail
        if (trial := claim(study)) is None:
            break
        # beating from the moment the trial is taken (see lmablate.tuning.claim)
        with Heartbeat(study, trial, cfg.tune.heartbeat_seconds):
            run_trial(job, study, trial, data, device, tracker)
        ran += 1
    return ran


def run_trial(job: TuneJob, study: optuna.Study, trial: optuna.Trial, data: TokenData,
              device, tracker: NullTracker) -> None:
    """Train the queued ``trial`` and tell the study its result: COMPLETE with the final val
    loss, PRUNED (with the reason), or FAIL with ``outcome: diverged`` and the reason. Any other
    error fails the trial and is raised; so does an interrupt (Ctrl-C), with ``fail_reason:
    interrupted``: a failed trial without ``outcome: diverged`` is no result
    (:func:`lmablate.tuning.slot_results`), so its slot is queued again with the same params
    when the stage is run again. If another process took the same trial and finished it
    first (see :func:`lmablate.tuning.claim`), this one stops quietly."""
    try:
        _train_trial(job, study, trial, data, device, tracker)
    except optuna.exceptions.UpdateFinishedTrialError:
        pass


def _train_trial(job: TuneJob, study: optuna.Study, trial: optuna.Trial, data: TokenData,
                 device, tracker: NullTracker) -> None:
    cfg, tune = job.cfg, job.cfg.tune
    slot = trial.user_attrs[SLOT]
    lr = trial.suggest_float("lr", tune.lr_low, tune.lr_high, log=True)
    d_model = trial.suggest_categorical("d_model", list(tune.d_model_choices))
    model_cfg = resolve_model_config(cfg, job.variant, data.vocab_size, d_model)
    steps = trial_steps(cfg, job.dataset, model_cfg)
    train_cfg = trial_train_config(cfg, job.dataset, steps)
    earlier, pruner = earlier_trials(tune, study, slot), make_pruner(tune)
    reports: dict[int, float] = {}

    def report(step: int, val_loss: float) -> None:
        index = step // train_cfg.eval_interval  # 1 .. tune.reports: the same share of compute
        if index in reports:
            return  # the last step after the last report: its loss is the trial's value
        trial.report(val_loss, index)
        reports[index] = val_loss
        trial.set_user_attr("last_step", step)
        if should_prune(tune, pruner, earlier, slot, step, cfg.train.warmup_steps, reports):
            raise optuna.TrialPruned(f"pruned at step {step} of {steps}: val_loss "
                                     f"{val_loss:.4f}")

    tags = {"dataset": job.dataset, "variant": job.variant, "stage": "tune",
            "optuna_study": study.study_name, "trial": slot}
    with tracker.run(f"trial-{slot}", tags, parent_run_id=job.parent_run_id):
        tracker.log_params({"peak_lr": lr, "d_model": d_model, "trial": slot, "steps": steps})
        trial.set_user_attr("steps", steps)
        trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")
        try:
            result = train_model(model_cfg, train_cfg, data, seed=tune.seed, lr=lr, steps=steps,
                                 device=device, on_eval=report, tracker=tracker,
                                 desc=f"{job.dataset}/{job.variant}/trial {slot}")
        except optuna.TrialPruned as exc:
            trial.set_user_attr("fail_reason", str(exc))
            tracker.set_tags({"state": "PRUNED", "pruned_reason": str(exc)})
            study.tell(trial, state=TrialState.PRUNED)
            return
        except DivergenceError as exc:
            trial.set_user_attr(OUTCOME, DIVERGED)
            trial.set_user_attr("fail_reason", str(exc))
            tracker.set_tags({"state": "FAILED", "fail_reason": str(exc)})
            study.tell(trial, state=TrialState.FAIL)
            return
        except optuna.exceptions.UpdateFinishedTrialError:
            raise
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
                    trial.set_user_attr("fail_reason", "interrupted")
            study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
            raise
        study.tell(trial, result.val_loss)


def _queue_batch(cfg: StudyConfig, study: optuna.Study, sampler_seed: int) -> range | None:
    """Queue the proposals of the first unfinished batch that are neither finished, queued nor
    running; returns that batch, or None when every slot has its result."""
    tune = cfg.tune
    results = slot_results(study)
    todo = [s for s in range(tune.n_trials) if s not in results]
    if not todo:
        return None
    batch = batch_of(tune, todo[0])
    live = {t.user_attrs.get(SLOT) for t in study.get_trials(
        deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING))}
    missing = [s for s in batch if s not in results and s not in live]
    if missing:
        params = propose(tune, results, batch, sampler_seed)
        for s in missing:
            study.enqueue_trial(params[s - batch.start], user_attrs={SLOT: s})
    return batch


def trials_frame(cfg: StudyConfig, dataset: str, variant: str, vocab_size: int,
                 results: dict) -> list[dict]:
    """One row per slot (:data:`TRIALS_COLUMNS`): its params, state, value (final val loss, or
    the last reported one of a pruned trial), steps planned and trained (up to its last
    report), FLOPs spent."""
    rows = []
    for slot in sorted(results):
        t = results[slot]
        steps = t.user_attrs.get("steps", 0)
        # The last report's step from the reports themselves (report k is at step k * the
        # trial's eval interval), not from the "last_step" attribute: two processes that took
        # the same trial (see lmablate.tuning.claim) both write that attribute, and the slower
        # one may write an earlier step after the faster one's last report. Their reports are
        # the same values under the same keys, whoever writes them.
        interval = trial_train_config(cfg, dataset, steps).eval_interval if steps else 0
        last = max(t.intermediate_values, default=0) * interval
        value = t.value if t.value is not None else (
            t.intermediate_values[max(t.intermediate_values)] if t.intermediate_values else None)
        rows.append({"number": slot, "batch": slot // cfg.tune.trials_per_batch,
                     "state": t.state.name, "value": value, "params_lr": t.params["lr"],
                     "params_d_model": t.params["d_model"], "steps": steps, "last_step": last,
                     "flops": training_flops(
                         resolve_model_config(cfg, variant, vocab_size, t.params["d_model"]),
                         cfg.train.batch_size, last),
                     "fail_reason": t.user_attrs.get("fail_reason", "")})
    return rows


def run(cfg: StudyConfig, dataset: str, variant: str, tokens_dir: Path, best_path: Path,
        trials_path: Path, tracker: NullTracker, replicate: int = 0) -> dict:
    """Run (or resume) the study until each of its ``tune.n_trials`` slots has a result.

    ``replicate`` > 0 re-tunes with sampler seed ``tune.sampler_seed + replicate`` (a separate
    study): how much the tuned result owes to the sampler's luck.

    Writes ``best_path`` (JSON: ``lr``, ``d_model``, ``val_loss``, ``slot``, ``on_edge`` flags,
    trial counts, tuning steps and FLOPs, ``study_name``; the same bytes on every run of the same
    commit, params and data) and ``trials_path`` (CSV, :data:`TRIALS_COLUMNS`, one row per slot).
    A diverging trial (NaN/inf loss) is a result (FAIL, ``outcome: diverged``) and the study
    goes on.

    Raises:
        ConfigError / ValueError: unknown dataset or variant, data too small, a budget too small
            for a width, a model that fails the causality pre-flight; raised before any trial.
        RuntimeError: no trial completed.
    """
    cfg.dataset(dataset)
    cfg.check_variant(variant)
    tune = cfg.tune
    sampler_seed = tune.sampler_seed + replicate
    if sampler_seed > MAX_SAMPLER_SEED:
        raise ConfigError(f"params: tune.sampler_seed={tune.sampler_seed} + --replicate "
                          f"{replicate} is not allowed; the sum must be <= {MAX_SAMPLER_SEED} "
                          "(TPE's seeds must stay below 2**32)")
    resolve_device(cfg.runtime.device)  # a device this machine lacks fails before any trial
    data = TokenData.load(tokens_dir)
    data.check_fits(cfg.model.context_length, dataset)
    models = [resolve_model_config(cfg, variant, data.vocab_size, d_model)
              for d_model in tune.d_model_choices]
    for model_cfg in models:
        preflight(model_cfg, f"variant {variant!r}")
        trial_steps(cfg, dataset, model_cfg)  # a budget too small for a width fails here
        run_steps(cfg, dataset, model_cfg)
    processes = use_processes(cfg.runtime, models)
    storage = make_storage(tune.storage_url, tune.heartbeat_seconds)
    name = study_name(cfg, dataset, variant, data.fingerprint(), sampler_seed)
    study = load_study(storage, name)
    describe_study(study, dataset, variant, cfg.train.budget_flops[dataset], tune,
                   sampler_seed)
    tags = {"dataset": dataset, "variant": variant, "stage": "tune", "optuna_study": name,
            "replicate": replicate}
    # the study's parent run from an earlier, interrupted or killed, run of this stage: its
    # trials go on under it rather than under a duplicate
    with tracker.run(f"tune-{dataset}-{variant}" + (f"-r{replicate}" if replicate else ""),
                     tags, run_id=tracker.find_run(tags)) as parent_run_id:
        tracker.log_params({"n_trials": tune.n_trials, "trials_per_batch": tune.trials_per_batch,
                            "budget_fraction": tune.budget_fraction,
                            "lr_low": tune.lr_low, "lr_high": tune.lr_high,
                            "d_model_choices": list(tune.d_model_choices), "pruner": tune.pruner,
                            "sampler_seed": sampler_seed})
        while (batch := _queue_batch(cfg, study, sampler_seed)) is not None:
            waiting = sum(t.user_attrs.get(SLOT) in batch for t in study.get_trials(
                deepcopy=False, states=(TrialState.WAITING,)))
            if waiting:
                workers = worker_count(cfg.runtime, waiting, resolve_device(cfg.runtime.device))
                job = TuneJob(cfg, dataset, variant, tokens_dir, name, parent_run_id)
                map_jobs(tune_worker, [job] * workers, workers, processes=processes)
            else:
                # The batch's trials run elsewhere (another machine), or on a worker that died:
                # wait; Optuna fails a trial whose heartbeat stopped and queues it again.
                optuna.storages.fail_stale_trials(study)
                time.sleep(tune.heartbeat_seconds)
        results = slot_results(study)
        complete = {s: t for s, t in results.items() if t.state == TrialState.COMPLETE}
        if not complete:
            raise RuntimeError(f"tune {dataset}/{variant}: no trial of study {name} completed; "
                               "see the trials' fail_reason in trials.csv, Optuna or MLflow")
        slot = min(complete, key=lambda s: (complete[s].value, s))
        best = complete[slot]
        rows = trials_frame(cfg, dataset, variant, data.vocab_size, results)
        result = {"lr": best.params["lr"], "d_model": best.params["d_model"],
                  "val_loss": best.value, "slot": slot,
                  "on_edge": on_edge(tune, best.params),
                  "n_trials": len(results), "n_complete": len(complete),
                  "n_pruned": sum(t.state == TrialState.PRUNED for t in results.values()),
                  "n_diverged": sum(t.state == TrialState.FAIL for t in results.values()),
                  "steps": sum(r["last_step"] for r in rows),
                  "flops": sum(r["flops"] for r in rows),
                  "sampler_seed": sampler_seed, "study_name": name}
        tracker.log_metrics({"best_val_loss": best.value})
        tracker.log_params({"best_lr": result["lr"], "best_d_model": result["d_model"]})
    fileio.write_csv(trials_path, rows, TRIALS_COLUMNS)
    fileio.write_json(best_path, result)
    return result


def main(cfg: StudyConfig, args: argparse.Namespace) -> str:
    """``lmablate tune <dataset> <variant> --tokens DIR --best FILE --trials FILE
    [--replicate N]``. Returns the stage's summary line: trials by state, the best value and
    where it was found (:func:`lmablate.cli.main` prints it with the stage's time)."""
    cfg.check_variant(args.variant)
    r = run(cfg, args.dataset, args.variant, args.tokens, args.best, args.trials,
            make_tracker(cfg.tracking), replicate=getattr(args, "replicate", 0))
    return (f"{r['n_trials']} trials ({r['n_complete']} complete, {r['n_pruned']} pruned, "
            f"{r['n_diverged']} diverged); best val_loss {r['val_loss']:.4f} at lr "
            f"{r['lr']:.3g}, d_model {r['d_model']}"
            + (f" ({'; '.join(r['on_edge'])})" if r["on_edge"] else ""))
