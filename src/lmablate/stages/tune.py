"""Stage ``tune``: a deterministic Optuna study per dataset x variant over learning rate and width.

Objective: validation loss (nats/char) at the end of a trial's share of the dataset's training
budget, on the tuning seed ``tune.seed``, which is not a final seed. What each trial trains,
which trials go on to the next rung and what the study returns is decided by
:mod:`lmablate.tuning` (successive halving up to the full budget); this stage validates, trains
the queued trials on its workers, and records them: Optuna's storage, ``trials.csv``,
``best.json``, and one MLflow run per trial nested under one parent run per dataset x variant.
The study is the same at any ``runtime.workers``, in threads, processes or on several machines
sharing one storage.
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
from ..config import MAX_SEED, ConfigError, StudyConfig
from ..device import resolve_device
from ..parallel import map_jobs, use_processes, worker_count
from ..token_data import TokenData
from ..tracking import NullTracker, make_tracker
from ..training import DivergenceError, train_model
from ..studies import Heartbeat, claim, load_study, make_storage
from ..tuning import (DIVERGED, FRACTION, OUTCOME, RUNG, SLOT, batch_of, chosen, describe_study,
                      initial_space, n_slots, next_batch, on_edge, space_for_batch,
                      slot_results, study_name, tokens_per_parameter, trial_distributions,
                      trial_train_config, width_ladder)
from ..variants import preflight, resolve_model_config

TRIALS_COLUMNS = ("number", "rung", "batch", "budget_fraction", "state", "value", "params_lr",
                  "params_d_model", "tokens_per_parameter", "steps", "last_step", "flops",
                  "fail_reason")


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
        # beating from the moment the trial is taken (see lmablate.studies.claim)
        with Heartbeat(study, trial, cfg.tune.heartbeat_seconds):
            run_trial(job, study, trial, data, device, tracker)
        ran += 1
    return ran


def run_trial(job: TuneJob, study: optuna.Study, trial: optuna.Trial, data: TokenData,
              device, tracker: NullTracker) -> None:
    """Train the queued ``trial`` and tell the study its result: COMPLETE with the final val
    loss, or FAIL with ``outcome: diverged`` and the reason. Any other
    error fails the trial and is raised; so does an interrupt (Ctrl-C), with ``fail_reason:
    interrupted``: a failed trial without ``outcome: diverged`` is no result
    (:func:`lmablate.tuning.slot_results`), so its slot is queued again with the same params
    when the stage is run again. If another process took the same trial and finished it
    first (see :func:`lmablate.studies.claim`), this one stops quietly."""
    try:
        _train_trial(job, study, trial, data, device, tracker)
    except optuna.exceptions.UpdateFinishedTrialError:
        pass


def _train_trial(job: TuneJob, study: optuna.Study, trial: optuna.Trial, data: TokenData,
                 device, tracker: NullTracker) -> None:
    cfg = job.cfg
    slot, fraction = trial.user_attrs[SLOT], trial.user_attrs[FRACTION]
    dists = trial_distributions(cfg.tune)
    lr = trial.suggest_float("lr", dists["lr"].low, dists["lr"].high, log=True)
    d_model = trial.suggest_int("d_model", dists["d_model"].low, dists["d_model"].high, log=True)
    model_cfg = resolve_model_config(cfg, job.variant, data.vocab_size, d_model)
    steps = trial_steps(cfg, job.dataset, model_cfg, fraction)
    train_cfg = trial_train_config(cfg, job.dataset, steps)
    reports: dict[int, float] = {}

    def report(step: int, val_loss: float) -> None:
        # recorded for the curves (optuna-dashboard, MLflow); rungs judge only the last one
        index = step // train_cfg.eval_interval  # 1 .. tune.reports: the same share of compute
        if index in reports:
            return  # the last step after the last report: its loss is the trial's value
        trial.report(val_loss, index)
        reports[index] = val_loss
        trial.set_user_attr("last_step", step)

    tags = {"dataset": job.dataset, "variant": job.variant, "stage": "tune",
            "optuna_study": study.study_name, "trial": slot, "rung": trial.user_attrs[RUNG]}
    with tracker.run(f"trial-{slot}", tags, parent_run_id=job.parent_run_id):
        tracker.log_params({"peak_lr": lr, "d_model": d_model, "trial": slot, "steps": steps,
                            "rung": trial.user_attrs[RUNG], "budget_fraction": fraction})
        trial.set_user_attr("steps", steps)
        trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")
        try:
            result = train_model(model_cfg, train_cfg, data, seed=cfg.tune.seed, lr=lr, steps=steps,
                                 device=device, on_eval=report, tracker=tracker,
                                 desc=f"{job.dataset}/{job.variant}/trial {slot}")
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


def _queue_batch(cfg: StudyConfig, dataset: str, variant: str, study: optuna.Study,
                 sampler_seed: int):
    """Queue the proposals of the first unfinished batch (:func:`lmablate.tuning.next_batch`)
    that are neither finished, queued nor running; returns that batch, or None when the study
    is done."""
    found = next_batch(cfg, dataset, variant, slot_results(study), sampler_seed)
    if found is None:
        return None
    batch, params = found
    results = slot_results(study)
    live = {t.user_attrs.get(SLOT) for t in study.get_trials(
        deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING))}
    for slot, values in params.items():
        if slot not in results and slot not in live:
            study.enqueue_trial(values, user_attrs={SLOT: slot, RUNG: batch.rung,
                                                    FRACTION: batch.fraction})
    return batch


def trials_frame(cfg: StudyConfig, dataset: str, variant: str, vocab_size: int,
                 results: dict) -> list[dict]:
    """One row per slot with a result (:data:`TRIALS_COLUMNS`): its rung, batch and share of
    the budget, params, the baseline's tokens per parameter at its width, state, value (final
    val loss; empty for a diverged trial), steps planned and trained (up to its last report),
    FLOPs spent."""
    rows = []
    for slot in sorted(results):
        t = results[slot]
        steps = t.user_attrs.get("steps", 0)
        # The last report's step from the reports themselves (report k is at step k * the
        # trial's eval interval), not from the "last_step" attribute: two processes that took
        # the same trial (see lmablate.studies.claim) both write that attribute, and the slower
        # one may write an earlier step after the faster one's last report. Their reports are
        # the same values under the same keys, whoever writes them.
        interval = trial_train_config(cfg, dataset, steps).eval_interval if steps else 0
        last = min(steps, max(t.intermediate_values, default=0) * interval)
        if t.state == TrialState.COMPLETE:
            last = steps
        rows.append({"number": slot, "rung": t.user_attrs[RUNG],
                     "batch": batch_of(cfg.tune, slot).index,
                     "budget_fraction": t.user_attrs[FRACTION], "state": t.state.name,
                     "value": t.value, "params_lr": t.params["lr"],
                     "params_d_model": t.params["d_model"],
                     "tokens_per_parameter": round(tokens_per_parameter(
                         cfg, dataset, t.params["d_model"]), 3),
                     "steps": steps, "last_step": last,
                     "flops": training_flops(
                         resolve_model_config(cfg, variant, vocab_size, t.params["d_model"]),
                         cfg.train.batch_size, last),
                     "fail_reason": t.user_attrs.get("fail_reason", "")})
    return rows


def run(cfg: StudyConfig, dataset: str, variant: str, tokens_dir: Path, best_path: Path,
        trials_path: Path, tracker: NullTracker, replicate: int = 0) -> dict:
    """Run (or resume) the study until every rung is done (:mod:`lmablate.tuning`).

    ``replicate`` > 0 re-tunes with sampler seed ``tune.sampler_seed + replicate`` (a separate
    study with its own design and proposals): how much the tuned result owes to the luck of
    the search.

    Writes ``best_path`` (JSON: ``lr``, ``d_model``, ``val_loss``, its ``slot``, ``rung`` and
    ``budget_fraction``, ``full_budget`` (whether it was trained at the final runs' budget),
    ``on_edge`` flags, the ranges searched (``lr_range``, ``d_model_choices``) and how they
    were ``extended``, trial counts, tuning steps and FLOPs, ``study_name``; the same bytes on
    every run of the same commit, params and data) and ``trials_path`` (CSV,
    :data:`TRIALS_COLUMNS`, one row per slot). A diverging trial (NaN/inf loss) is a result
    (FAIL, ``outcome: diverged``) and the study goes on.

    Raises:
        ConfigError / ValueError: unknown dataset or variant, data too small, a budget too small
            for a width, no width derivable, a model that fails the causality pre-flight;
            raised before any trial.
        RuntimeError: no trial completed.
    """
    cfg.dataset(dataset)
    cfg.check_variant(variant)
    tune = cfg.tune
    sampler_seed = tune.sampler_seed + replicate
    if sampler_seed > MAX_SEED:
        raise ConfigError(f"params: tune.sampler_seed={tune.sampler_seed} + --replicate "
                          f"{replicate} is not allowed; the sum must be <= {MAX_SEED:,}")
    resolve_device(cfg.runtime.device)  # a device this machine lacks fails before any trial
    data = TokenData.load(tokens_dir)
    data.check_fits(cfg.model.context_length, dataset)
    widths = (list(tune.d_model_choices) if tune.d_model_choices is not None
              else width_ladder(cfg, dataset))
    if tune.d_model_choices is None:
        initial_space(cfg, dataset)  # no derivable width fails here, before any trial
    models = [resolve_model_config(cfg, variant, data.vocab_size, d_model) for d_model in widths]
    for model_cfg in models:
        preflight(model_cfg, f"variant {variant!r}")
        trial_steps(cfg, dataset, model_cfg)  # a budget too small for a width fails here
        run_steps(cfg, dataset, model_cfg)
    processes = use_processes(cfg.runtime, models)
    storage = make_storage(tune.storage_url, tune.heartbeat_seconds)
    name = study_name(cfg, dataset, variant, data.fingerprint(), sampler_seed)
    study = load_study(storage, name)
    describe_study(study, cfg, dataset, variant, sampler_seed)
    tags = {"dataset": dataset, "variant": variant, "stage": "tune", "optuna_study": name,
            "replicate": replicate}
    space = initial_space(cfg, dataset)
    # the study's parent run from an earlier, interrupted or killed, run of this stage: its
    # trials go on under it rather than under a duplicate
    with tracker.run(f"tune-{dataset}-{variant}" + (f"-r{replicate}" if replicate else ""),
                     tags, run_id=tracker.find_run(tags)) as parent_run_id:
        tracker.log_params({"rungs": [list(r) for r in tune.rungs],
                            "trials_per_batch": tune.trials_per_batch,
                            "lr_low": space.lr_low, "lr_high": space.lr_high,
                            "d_model_choices": list(space.d_model_choices),
                            "sampler_seed": sampler_seed})
        while (batch := _queue_batch(cfg, dataset, variant, study, sampler_seed)) is not None:
            waiting = sum(t.user_attrs.get(SLOT) in batch.slots for t in study.get_trials(
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
        best = chosen(tune, results)
        if best is None:
            raise RuntimeError(f"tune {dataset}/{variant}: no trial of study {name} completed; "
                               "see the trials' fail_reason in trials.csv, Optuna or MLflow")
        last = batch_of(tune, n_slots(tune) - 1)
        searched = space_for_batch(cfg, dataset, results, last)
        rows = trials_frame(cfg, dataset, variant, data.vocab_size, results)
        complete = [t for t in results.values() if t.state == TrialState.COMPLETE]
        result = {"lr": best.params["lr"], "d_model": best.params["d_model"],
                  "val_loss": best.value, "slot": best.user_attrs[SLOT],
                  "rung": best.user_attrs[RUNG], "budget_fraction": best.user_attrs[FRACTION],
                  "full_budget": best.user_attrs[FRACTION] == 1.0,
                  "on_edge": on_edge(searched, best.params, tune,
                                     None if tune.d_model_choices is not None else widths),
                  "lr_range": [searched.lr_low, searched.lr_high],
                  "d_model_choices": list(searched.d_model_choices),
                  "extended": list(searched.extended),
                  "rungs": [list(r) for r in tune.rungs],
                  "n_trials": len(results), "n_complete": len(complete),
                  "n_diverged": len(results) - len(complete),
                  "steps": sum(r["last_step"] for r in rows),
                  "flops": sum(r["flops"] for r in rows),
                  "sampler_seed": sampler_seed, "study_name": name}
        tracker.log_metrics({"best_val_loss": best.value})
        tracker.log_params({"best_lr": result["lr"], "best_d_model": result["d_model"],
                            "full_budget": result["full_budget"]})
    fileio.write_csv(trials_path, rows, TRIALS_COLUMNS)
    fileio.write_json(best_path, result)
    return result


def main(cfg: StudyConfig, args: argparse.Namespace) -> str:
    """``lmablate tune <dataset> <variant> --tokens DIR --best FILE --trials FILE
    [--replicate N]``. Returns the stage's summary line: trials per rung, the best value, where
    it was found and at which share of the budget (:func:`lmablate.cli.main` prints it with the
    stage's time)."""
    cfg.check_variant(args.variant)
    r = run(cfg, args.dataset, args.variant, args.tokens, args.best, args.trials,
            make_tracker(cfg.tracking), replicate=getattr(args, "replicate", 0))
    rungs = " -> ".join(f"{n} x {f:g}" for n, f in r["rungs"])
    where = ("trained at the full budget" if r["full_budget"] else
             f"NOT trained at the full budget (best of rung {r['rung']}, "
             f"{r['budget_fraction']:g} of it: every trial above diverged)")
    notes = r["extended"] and [f"range extended: {', '.join(r['extended'])}"]
    return (f"{r['n_trials']} trials (rungs {rungs} of the budget; {r['n_diverged']} "
            f"diverged); best val_loss {r['val_loss']:.4f} at lr {r['lr']:.3g}, d_model "
            f"{r['d_model']}, {where}"
            + "".join(f"; {x}" for x in (notes or []) + r["on_edge"]))
