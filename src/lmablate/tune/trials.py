"""Running a tuning study's trials: queue the batch the protocol asks for, train each queued
trial on a worker, tell the study its result, and tabulate the results.

:mod:`lmablate.tune.tuning` decides what each trial trains and which trials come next;
this module carries it out on Optuna's storage (:mod:`lmablate.tune.storage`), so the tune stage
only validates, opens the study and the MLflow parent run, and writes ``trials.csv`` and
``best.json``. Any number of workers, in threads, processes or on several machines sharing one
storage, run the same trials and give the same study: a batch is queued from the results of the
earlier ones alone, and a worker takes whichever queued trial is next (:func:`run_batches`).

Units: losses in nats/char, budgets as shares of the dataset's training FLOPs, steps as
optimizer steps.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

from lmablate.config.study import StudyConfig
from lmablate.core import interrupt
from lmablate.core.fingerprint import run_params
from lmablate.core.progress import note
from lmablate.core.tracker import Tracker
from lmablate.data.token_data import TokenData
from lmablate.evaluate.answer_probe import answer_probe
from lmablate.execution.cluster import Cluster
from lmablate.execution.executor import run_jobs
from lmablate.model.variants import resolve_model_config
from lmablate.tracking.environment import use_numerics
from lmablate.tracking.mlflow_views import OBJECTIVE_METRIC
from lmablate.tracking.trackers import make_tracker
from lmablate.train.budget import training_flops, trial_steps
from lmablate.train.device import resolve_device
from lmablate.train.numerics import numerics_kind
from lmablate.train.training import DivergenceError, train_model
from lmablate.tune.bracket import bracket_outcome
from lmablate.tune.lr_minimum import BRACKETED, sensitivity
from lmablate.tune.rungs import (DIVERGED, FRACTION, OUTCOME, RUNG, SLOT, TRIAL_SEED, Batch,
                                 batch_of, is_bracket, n_slots, slot_seed)
from lmablate.tune.search_space import (on_edge, space_for_batch, tokens_per_parameter,
                                   trial_distributions)
from lmablate.tune.storage import Heartbeat, claim, load_study, make_storage
from lmablate.tune.tuning import (chosen, next_batch, runs_alongside, slot_results,
                                  study_objective, trial_train_config, trial_value)

TRIALS_COLUMNS = ("number", "rung", "batch", "budget_flops", "budget_fraction", "seed", "state",
                  "value", "params_lr", "params_d_model", "tokens_per_parameter", "steps", "last_step",
                  "flops", "fail_reason")


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
    use_numerics(numerics_kind(device))  # in a worker process or task: its own
    tracker = make_tracker(cfg.tracking)
    ran = 0
    while True:
        interrupt.check()  # before each claim: a trial taken after Ctrl-C would only fail
        if (trial := claim(study)) is None:
            break
        # beating from the moment the trial is taken (see lmablate.tune.storage.claim)
        with Heartbeat(study, trial, cfg.tune.heartbeat_seconds):
            run_trial(job, study, trial, data, device, tracker)
        ran += 1
    return ran


def run_trial(job: TuneJob, study: optuna.Study, trial: optuna.Trial, data: TokenData,
              device, tracker: Tracker) -> None:
    """Train the queued ``trial`` and tell the study its result: COMPLETE with the final val
    loss, or FAIL with ``outcome: diverged`` and the reason. Any other
    error fails the trial and is raised; so does an interrupt (Ctrl-C), with ``fail_reason:
    interrupted``: a failed trial without ``outcome: diverged`` is no result
    (:func:`lmablate.tune.tuning.slot_results`), so its slot is queued again with the same params
    when the stage is run again. If another process took the same trial and finished it
    first (see :func:`lmablate.tune.storage.claim`), this one stops quietly."""
    try:
        _train_trial(job, study, trial, data, device, tracker)
    except optuna.exceptions.UpdateFinishedTrialError:
        pass


def _train_trial(job: TuneJob, study: optuna.Study, trial: optuna.Trial, data: TokenData,
                 device, tracker: Tracker) -> None:
    """:func:`run_trial`'s work: train the trial's params for its share of the budget on the
    tuning seed, reporting each value of the objective to the study, in an MLflow run nested
    under the study's: the validation loss (nats/char), or on an arithmetic dataset the answer
    loss of the validation problems (nats per answer character,
    :mod:`lmablate.evaluate.answer_probe`)."""
    cfg = job.cfg
    slot, fraction = trial.user_attrs[SLOT], trial.user_attrs[FRACTION]
    dists = trial_distributions(cfg.tune)
    lr = trial.suggest_float("lr", dists["lr"].low, dists["lr"].high, log=True)
    d_model = trial.suggest_int("d_model", dists["d_model"].low, dists["d_model"].high, log=True)
    model_cfg = resolve_model_config(cfg, job.variant, data.vocab_size, d_model,
                                     data.line_length)
    steps = trial_steps(cfg, job.dataset, model_cfg, fraction)
    train_cfg = trial_train_config(cfg, job.dataset, steps)
    reports: dict[int, float] = {}

    def report(step: int, value: float) -> None:
        # recorded for the curves (optuna-dashboard, MLflow); rungs judge only the last one
        index = step // train_cfg.eval_interval  # 1 .. tune.reports: the same share of compute
        if index in reports:
            return  # the last step after the last report: its loss is the trial's value
        trial.report(value, index)
        reports[index] = value
        trial.set_user_attr("last_step", step)

    tags = {"dataset": job.dataset, "variant": job.variant, "stage": "tune",
            "replicate": cfg.replicate, "optuna_study": study.study_name, "trial": slot, "rung": trial.user_attrs[RUNG]}
    with tracker.run(f"trial-{slot}", tags, parent_run_id=job.parent_run_id):
        seed = trial.user_attrs.get(TRIAL_SEED, cfg.tune.seed)
        tracker.log_params({**run_params(cfg, job.dataset, train_cfg), **model_cfg.to_dict(),
                            "peak_lr": lr, "d_model": d_model, "trial": slot, "steps": steps,
                            "rung": trial.user_attrs[RUNG], "budget_fraction": fraction,
                            "seed": seed})
        trial.set_user_attr("steps", steps)
        trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")
        try:
            result = train_model(model_cfg, train_cfg, data, seed=seed, lr=lr, steps=steps,
                                 device=device, on_eval=report, tracker=tracker,
                                 desc=f"{job.dataset}/{job.variant}/trial {slot}",
                                 probe=answer_probe(data.tokens_dir, cfg.evaluate.batch_size,
                                                    device))
        except DivergenceError as exc:
            trial.set_user_attr(OUTCOME, DIVERGED)
            trial.set_user_attr("fail_reason", str(exc))
            tracker.set_tags({"state": "FAILED", "fail_reason": str(exc)})
            study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
            return
        except optuna.exceptions.UpdateFinishedTrialError:
            raise
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
                    trial.set_user_attr("fail_reason", "interrupted")
            study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
            raise
        # skip_if_finished: another process took the same trial and finished it first (see
        # lmablate.tune.storage.claim); Optuna raises ValueError for a finished trial otherwise
        value = trial_value(study_objective(cfg, job.dataset), reports, result.objective)
        if value != result.objective:
            trial.set_user_attr("final_objective", result.objective)
        tracker.log_metrics({OBJECTIVE_METRIC: value})  # the tuning view's last axis
        study.tell(trial, value, skip_if_finished=True)


def queue_batch(cfg: StudyConfig, dataset: str, variant: str, study: optuna.Study,
                sampler_seed: int) -> list[Batch]:
    """Queue the proposals of the first unfinished batch (:func:`lmablate.tune.tuning.next_batch`),
    and of the batch that may train beside it (:func:`lmablate.tune.tuning.runs_alongside`), that
    are neither finished, queued nor running; returns those batches, none when the study is
    done."""
    results = slot_results(study)
    found = next_batch(cfg, dataset, variant, results, sampler_seed)
    if found is None:
        return []
    batches = [found]
    if (beside := runs_alongside(cfg, dataset, results, found[0])) is not None:
        batches.append(beside)
    live = {t.user_attrs.get(SLOT) for t in study.get_trials(
        deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING))}
    for batch, params in batches:
        for slot, values in params.items():
            if slot not in results and slot not in live:
                study.enqueue_trial(values, user_attrs={SLOT: slot, RUNG: batch.rung,
                                                        FRACTION: batch.fraction,
                                                        TRIAL_SEED: slot_seed(cfg.tune, slot)})
    return [batch for batch, _ in batches]


def run_batches(job: TuneJob, study: optuna.Study, sampler_seed: int,
                processes: bool, cluster: Cluster | None = None) -> None:
    """Queue and run the study's batches (:func:`queue_batch`) until every rung is done: each
    batch's waiting trials (with the batch that may train beside it) on up to
    ``runtime.workers`` workers (:func:`tune_worker`, in processes when ``processes``; all at
    once in threads when two batches run together, so that three trials share two cores
    instead of one training alone), or as one task per waiting trial on ``cluster``
    (:func:`lmablate.execution.executor.run_jobs`). A batch whose
    trials all run elsewhere (another machine, or a worker that died) is waited for: Optuna fails a
    trial whose heartbeat stopped, and its slot is queued again.

    Raises:
        Interrupted: the stage was asked to stop.
    """
    cfg = job.cfg
    told = -1
    while batches := queue_batch(cfg, job.dataset, job.variant, study, sampler_seed):
        results = slot_results(study)
        if len(results) != told and results:  # a line per batch done: no silent minutes
            told = len(results)
            note(progress_line(cfg, job.dataset, job.variant, results))
        slots = {s for batch in batches for s in batch.slots}
        waiting = sum(t.user_attrs.get(SLOT) in slots for t in study.get_trials(
            deepcopy=False, states=(TrialState.WAITING,)))
        if waiting:
            # a worker claims trials until none is left: as many as run at once here, one
            # task per waiting trial on a cluster
            run_jobs(tune_worker, [job] * waiting, runtime=cfg.runtime, cluster=cluster,
                     processes=processes, drain=True, all_at_once=len(batches) > 1,
                     names=[f"tune-{job.dataset}-{job.variant}-batch{batches[0].index}-{i}"
                            for i in range(waiting)], inputs=lambda j: [j.tokens_dir])
        else:
            # The batch's trials run elsewhere (another machine), or on a worker that died:
            # wait; Optuna fails a trial whose heartbeat stopped and queues it again.
            optuna.storages.fail_stale_trials(study)
            time.sleep(cfg.tune.heartbeat_seconds)


def progress_line(cfg: StudyConfig, dataset: str, variant: str,
                  results: dict[int, FrozenTrial]) -> str:
    """How far a tuning study is: trials done of those planned (the first rungs and the
    bracket's first learning rates; an extended bracket plans up to :func:`lmablate.tune.rungs.
    n_slots`), diverged ones, and the best objective value so far with its lr and width."""
    tune = cfg.tune
    least = sum((n + 1) * tune.bracket_seeds if is_bracket(tune, r) else n
                for r, (n, _) in enumerate(tune.rungs))
    most = n_slots(tune)
    if len(results) > least:  # the bracket extended past its first learning rates
        planned = f"{len(results)} trials done ({least} planned, extended up to {most})"
    else:
        planned = f"{len(results)} of {least}" + (f" (up to {most})" if most > least else "") + (
            " trials done")
    complete = [t for t in results.values() if t.state == TrialState.COMPLETE]
    line = (f"tune {dataset}/{variant}: {planned}"
            + (f", {len(results) - len(complete)} diverged" if len(complete) < len(results) else ""))
    if complete:
        best = min(complete, key=lambda t: t.value)
        line += (f"; best so far {study_objective(cfg, dataset)} {best.value:.4f} "
                 f"(lr {best.params['lr']:.3g}, d_model {best.params['d_model']}, rung "
                 f"{best.user_attrs[RUNG]}, {best.user_attrs[FRACTION]:g} of the budget)")
    return line


def trials_frame(cfg: StudyConfig, dataset: str, variant: str, vocab_size: int,
                 results: dict[int, FrozenTrial], line_length: int = 0) -> list[dict]:
    """One row per slot with a result (:data:`TRIALS_COLUMNS`): its rung, batch, the budget
    (FLOPs of a final run; ``cfg`` holds one per dataset, see
    :meth:`~lmablate.config.study.StudyConfig.at_budget`) and its share of it, params, the
    baseline's tokens per parameter at its width, state, value (final val loss; empty for a
    diverged trial), steps planned and trained (up to its last report), FLOPs spent."""
    rows = []
    for slot in sorted(results):
        t = results[slot]
        steps = t.user_attrs.get("steps", 0)
        # The last report's step from the reports themselves (report k is at step k * the
        # trial's eval interval), not from the "last_step" attribute: two processes that took
        # the same trial (see lmablate.tune.storage.claim) both write that attribute, and the slower
        # one may write an earlier step after the faster one's last report. Their reports are
        # the same values under the same keys, whoever writes them.
        interval = trial_train_config(cfg, dataset, steps).eval_interval if steps else 0
        last = min(steps, max(t.intermediate_values, default=0) * interval)
        if t.state == TrialState.COMPLETE:
            last = steps
        rows.append({"number": slot, "rung": t.user_attrs[RUNG],
                     "batch": batch_of(cfg.tune, slot).index,
                     "budget_flops": cfg.train.for_dataset(dataset).budget_flops[dataset],
                     "budget_fraction": t.user_attrs[FRACTION],
                     "seed": t.user_attrs.get(TRIAL_SEED, cfg.tune.seed), "state": t.state.name,
                     "value": t.value, "params_lr": t.params["lr"],
                     "params_d_model": t.params["d_model"],
                     "tokens_per_parameter": round(tokens_per_parameter(
                         cfg, dataset, t.params["d_model"]), 3),
                     "steps": steps, "last_step": last,
                     "flops": training_flops(
                         resolve_model_config(cfg, variant, vocab_size, t.params["d_model"],
                                              line_length),
                         cfg.train.batch_size, last),
                     "fail_reason": t.user_attrs.get("fail_reason", "")})
    return rows


def summarise_study(cfg: StudyConfig, dataset: str, variant: str, study_name: str,
                    results: dict[int, FrozenTrial], vocab_size: int, sampler_seed: int,
                    widths: list[int], line_length: int = 0) -> tuple[dict, list[dict]]:
    """``(best, rows)`` of a finished study: ``rows`` its :func:`trials_frame`, and ``best``
    what ``best.json`` records: the chosen trial (:func:`lmablate.tune.tuning.chosen`: ``lr``,
    ``d_model``, ``val_loss``, the value of the tuning ``objective``
    (:func:`lmablate.evaluate.answer_probe.objective_name`), its ``slot``, ``rung``, the
    ``budget_flops`` of a final run and the trial's ``budget_fraction`` of it,
    whether it was trained at the ``full_budget``), its ``on_edge`` flags against the ranges
    searched by the last batch (``lr_range``, ``d_model_choices``, how they were
    ``extended``; ``widths`` the derived width ladder, or the configured choices), the
    ``rungs``, trial counts, the tuning's ``steps`` and ``flops``, ``sampler_seed`` and
    ``study_name``.

    Raises:
        RuntimeError: no trial completed.
    """
    tune = cfg.tune
    best = chosen(tune, results)
    if best is None:
        raise RuntimeError(f"tune {dataset}/{variant}: no trial of study {study_name} completed; "
                           "see the trials' fail_reason in trials.csv, Optuna or MLflow")
    last = batch_of(tune, n_slots(tune) - 1)
    searched = space_for_batch(cfg, dataset, results, last)
    rows = trials_frame(cfg, dataset, variant, vocab_size, results, line_length)
    complete = [t for t in results.values() if t.state == TrialState.COMPLETE]
    ladder = None if tune.d_model_choices is not None else widths
    bracket = bracket_outcome(cfg, dataset, results)
    if bracket is None:  # one rung, or every full-budget point diverged: the best trial
        chosen_values = {"lr": best.params["lr"], "d_model": best.params["d_model"],
                         "val_loss": best.value, "slot": best.user_attrs[SLOT],
                         "rung": best.user_attrs[RUNG],
                         "budget_fraction": best.user_attrs[FRACTION],
                         "full_budget": best.user_attrs[FRACTION] == 1.0,
                         "on_edge": on_edge(searched, best.params, tune, ladder),
                         "bracket": None}
    else:
        chosen_values = {"lr": bracket.fit.lr, "d_model": bracket.width,
                         "val_loss": bracket.fit.loss, "slot": None,
                         "rung": len(tune.rungs) - 1, "budget_fraction": 1.0,
                         "full_budget": True,
                         "on_edge": _bracket_edges(bracket, searched, tune, ladder),
                         "bracket": _bracket_record(bracket)}
    result = {**{k: v for k, v in chosen_values.items() if k != "bracket"},
              "objective": study_objective(cfg, dataset),
              "budget_flops": cfg.train.for_dataset(dataset).budget_flops[dataset],
              "lr_range": [searched.lr_low, searched.lr_high],
              "d_model_choices": list(searched.d_model_choices),
              "extended": list(searched.extended),
              "rungs": [list(r) for r in tune.rungs],
              "n_trials": len(results), "n_complete": len(complete),
              "n_diverged": len(results) - len(complete),
              "steps": sum(r["last_step"] for r in rows),
              "flops": sum(r["flops"] for r in rows),
              "sampler_seed": sampler_seed, "study_name": study_name,
              "bracket": chosen_values["bracket"]}
    return result, rows


def _bracket_edges(bracket, searched, tune, ladder: list[int] | None) -> list[str]:
    """The bracket's edge flags: a learning rate not bracketed (at ``tune.lr_limits``, or out
    of ``tune.bracket_points``), and a width at an end of the ladder (the hard limit)."""
    flags = [] if bracket.state == BRACKETED else [f"lr {bracket.state}"]
    widths = ladder if ladder is not None else list(tune.d_model_choices)
    if len(widths) > 1 and bracket.width in (widths[0], widths[-1]):
        which = "smallest" if bracket.width == widths[0] else "largest"
        limit = (" (the limit tune.tokens_per_parameter_limits)" if ladder is not None
                 else " (of tune.d_model_choices)")
        flags.append(f"d_model the {which} choice{limit}")
    return flags


def _bracket_record(bracket) -> dict:
    """``best.json``'s ``bracket``: how it ended (``state``), the ``width`` and the mean losses
    at the middle lr that chose it (``widths_compared``), each full-budget
    point (``lr``, the tuning seeds' ``losses`` and their ``mean``, nats/char; a diverged seed
    as null), the fit (``fit``: ``used`` vertex or best point, ``note``, ``coefficients`` of
    loss in ln lr, highest power first, ``lrs`` fitted over), the ``seed_spread`` of one trial,
    the ``regret`` at the chosen lr (bootstrap median) and the ``uncertainty`` of the tuned loss
    (its 95th percentile), and the fitted curve's ``sensitivity`` (excess loss at 2x or 1/2 the
    chosen lr); nats/char throughout."""
    u = bracket.uncertainty

    def finite(x: float) -> float | None:
        return x if math.isfinite(x) else None

    return {"state": bracket.state, "width": bracket.width,
            "widths_compared": {str(d): finite(x) for d, x in bracket.widths.items()},
            "points": [{"lr": p.lr, "losses": [finite(x) for x in p.losses],
                        "mean": finite(p.loss)} for p in bracket.points],
            "fit": {"used": bracket.fit.used, "note": bracket.fit.note,
                    "coefficients": (list(bracket.fit.coefficients)
                                     if bracket.fit.coefficients is not None else None),
                    "lrs": list(bracket.fit.lrs)},
            "seed_spread": u.spread if u else None,
            "regret": u.median if u else None,
            "uncertainty": u.bound if u else None,
            "sensitivity": sensitivity(bracket.fit)}
