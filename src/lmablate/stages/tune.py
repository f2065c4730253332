"""Stage ``tune``: a deterministic Optuna study per dataset x variant over learning rate and width.

Objective: validation loss (nats/char) at the end of a trial's share of the dataset's training
budget, on the tuning seed ``tune.seed``, which is not a final seed. What each trial trains,
which trials go on to the next rung and what the study returns is decided by
:mod:`lmablate.tune.tuning` (successive halving up to the full budget), and the queued trials are
trained on the stage's workers by :mod:`lmablate.tune.trials`; this stage validates, opens the study
and the MLflow parent run, and records the outcome: Optuna's storage, ``trials.csv``,
``best.json``, and one MLflow run per trial nested under one parent run per dataset x variant.
The study is the same at any ``runtime.workers``, in threads, processes or on several machines
sharing one storage.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from lmablate.config.study import StudyConfig, budget_label
from lmablate.core import fileio
from lmablate.core.fingerprint import result_fields, run_params, tuned_settings
from lmablate.core.tracker import Tracker
from lmablate.data.token_data import TokenData
from lmablate.execution.cluster import resolve
from lmablate.execution.parallel import use_processes
from lmablate.model.variants import preflight, resolve_model_config
from lmablate.tracking.environment import result_environment
from lmablate.tracking.trackers import make_tracker
from lmablate.train.budget import run_steps, stage_budgets, trial_steps
from lmablate.tune.search_space import initial_space, width_ladder
from lmablate.tune.storage import load_study, make_storage
from lmablate.tune.trials import TRIALS_COLUMNS, TuneJob, run_batches, summarise_study
from lmablate.tune.tuning import describe_study, slot_results, study_name


def run(cfg: StudyConfig, dataset: str, variant: str, tokens_dir: Path, best_path: Path,
        trials_path: Path, tracker: Tracker, replicate: int = 0) -> dict:
    """Run (or resume) the study of each of the dataset's budgets until every rung is done
    (:mod:`lmablate.tune.tuning`); every budget is checked before any trial.

    ``replicate`` r > 0 tunes replicate r of the study
    (:meth:`~lmablate.config.study.StudyConfig.for_replicate`: its own tuning seeds and sampler
    seed, so a study of its own with its own design and proposals), at the headline budget only
    (:func:`lmablate.train.budget.stage_budgets`).

    Writes ``best_path`` (JSON: ``lr``, ``d_model``, ``val_loss``, its ``slot``, ``rung``,
    ``budget_flops`` and ``budget_fraction``, ``full_budget`` (whether it was trained at the
    final runs' budget), ``on_edge`` flags, the ranges searched (``lr_range``,
    ``d_model_choices``) and how they were ``extended``, trial counts, tuning steps and FLOPs,
    ``study_name``, the ``settings`` it was tuned for (:func:`lmablate.core.fingerprint.
    tuned_settings`) and the ``environment`` (:func:`lmablate.tracking.environment.
    result_environment`); the same bytes on every run of the same commit, params and data;
    :func:`lmablate.tune.trials.summarise_study`; in a scaling study ``{"budgets": [...]}``, one
    such entry per budget, increasing) and ``trials_path`` (CSV,
    :data:`lmablate.tune.trials.TRIALS_COLUMNS`, one row per slot and budget). A diverging trial
    (NaN/inf loss) is a result (FAIL, ``outcome: diverged``) and the study goes on.

    Returns the headline budget's entry.

    Raises:
        ConfigError / ValueError: unknown dataset or variant, data too small, a budget too small
            for a width, no width derivable, a model that fails the causality pre-flight;
            raised before any trial.
        RuntimeError: no trial completed.
    """
    cfg.dataset(dataset)
    cfg.check_variant(variant)
    cfg = cfg.for_replicate(replicate).for_dataset(dataset)
    # a device this machine lacks, a cluster that does not answer or a worker of another
    # kind: before any trial
    _, kind, cluster = resolve(cfg)
    data = TokenData.load(tokens_dir)
    data.check_fits(cfg.model.context_length, dataset)
    budgets = stage_budgets(cfg, dataset, replicate)
    # every budget's widths and step counts before the first trial of any
    plans = [(label, cfg.at_budget(dataset, budget)) for budget, label in budgets]
    plans = [(label, at, _widths(at, dataset, variant, data)) for label, at in plans]
    results, rows = [], []
    for label, at, (widths, models) in plans:
        result, budget_rows = _tune_budget(at, dataset, variant, tokens_dir, data, tracker,
                                           replicate, label, widths, models, kind, cluster)
        results.append(result)
        rows += budget_rows
    fileio.write_csv(trials_path, rows, TRIALS_COLUMNS)
    fileio.write_json(best_path, results[0] if len(results) == 1 else {"budgets": results})
    return results[-1]


def _widths(cfg: StudyConfig, dataset: str, variant: str, data: TokenData
            ) -> tuple[list[int], list]:
    """The widths a budget's study searches and their model configs, each checked: causal,
    and a trial of the lowest rung and a final run both buy enough steps at ``cfg``'s budget.

    Raises:
        ConfigError / ValueError: no width derivable, a budget too small for a width, a model
            that fails the causality pre-flight.
    """
    tune = cfg.tune
    widths = (list(tune.d_model_choices) if tune.d_model_choices is not None
              else width_ladder(cfg, dataset))
    if tune.d_model_choices is None:
        initial_space(cfg, dataset)  # no derivable width fails here, before any trial
    models = [resolve_model_config(cfg, variant, data.vocab_size, d_model, data.line_length)
              for d_model in widths]
    for model_cfg in models:
        preflight(model_cfg, f"variant {variant!r}")
        trial_steps(cfg, dataset, model_cfg)  # a budget too small for a width fails here
        run_steps(cfg, dataset, model_cfg)
    return widths, models


def _tune_budget(cfg: StudyConfig, dataset: str, variant: str, tokens_dir: Path,
                 data: TokenData, tracker: Tracker, replicate: int, label: str | None,
                 widths: list[int], models: list, kind: str, cluster) -> tuple[dict, list[dict]]:
    """One budget's study (``cfg`` holds that budget), run or resumed under its MLflow parent
    run (named with the budget's ``label`` in a scaling study): ``(best, trial rows)``."""
    tune = cfg.tune
    sampler_seed = tune.sampler_seed
    processes = use_processes(cfg.runtime, models)
    if cluster is not None and processes:
        cluster.check_single_threaded(f"variant {variant!r} has dropout")
    storage = make_storage(tune.storage_url, tune.heartbeat_seconds)
    name = study_name(cfg, dataset, variant, data.fingerprint(), sampler_seed, kind)
    study = load_study(storage, name)
    describe_study(study, cfg, dataset, variant, sampler_seed)
    tags = {"dataset": dataset, "variant": variant, "stage": "tune", "optuna_study": name,
            "replicate": replicate,
            "budget_flops": cfg.train.for_dataset(dataset).budget_flops[dataset]}
    space = initial_space(cfg, dataset)
    # the study's parent run from an earlier, interrupted or killed, run of this stage: its
    # trials go on under it rather than under a duplicate
    run_name = (f"tune-{dataset}-{variant}" + (f"-{label}" if label else "")
                + (f"-r{replicate}" if replicate else ""))
    with tracker.run(run_name, tags, run_id=tracker.find_run(tags)) as parent_run_id:
        # every setting of the search (tune.*, as params.yaml has them, with this study's
        # sampler seed) and of its trials' training, then the search space this study began with
        settings = dataclasses.replace(tune, sampler_seed=sampler_seed)
        tracker.log_params({**{f"tune.{k}": v for k, v in result_fields(settings).items()},
                            **run_params(cfg, dataset),
                            "rungs": [list(r) for r in tune.rungs],
                            "trials_per_batch": tune.trials_per_batch,
                            "lr_low": space.lr_low, "lr_high": space.lr_high,
                            "d_model_choices": list(space.d_model_choices),
                            "sampler_seed": sampler_seed})
        job_cfg = cfg if cluster is None else cluster.pin(cfg)
        run_batches(TuneJob(job_cfg, dataset, variant, tokens_dir, name, parent_run_id), study,
                    sampler_seed, processes, cluster)
        result, rows = summarise_study(cfg, dataset, variant, name, slot_results(study),
                                       data.vocab_size, sampler_seed, widths,
                                       data.line_length)
        result["settings"] = tuned_settings(cfg, dataset, variant, data.fingerprint(),
                                            sampler_seed)
        result["environment"] = result_environment(kind)
        tracker.log_metrics({"best_val_loss": result["val_loss"]})
        bracket = result.get("bracket")
        # where the answer comes from: a fitted curve's minimum is no trial's value
        tracker.log_params({"best_lr": result["lr"], "best_d_model": result["d_model"],
                            "full_budget": result["full_budget"],
                            "objective": result.get("objective", "val_loss"),
                            "best_from": ("the best trial" if bracket is None else
                                          f"the bracket's {bracket['fit']['used']} over "
                                          f"{len(bracket['points'])} learning rates x "
                                          f"{tune.bracket_seeds} tuning seeds")})
    return result, rows


def main(cfg: StudyConfig, args: argparse.Namespace) -> str:
    """``lmablate tune <dataset> <variant> --tokens DIR --best FILE --trials FILE
    [--replicate N]``. Returns the stage's summary line: trials per rung, the best value, where
    it was found and at which share of the budget; in a scaling study one such part per budget
    (:func:`lmablate.cli.main` prints it with the stage's time)."""
    cfg.check_variant(args.variant)
    run(cfg, args.dataset, args.variant, args.tokens, args.best, args.trials,
        make_tracker(cfg.tracking), replicate=getattr(args, "replicate", 0))
    best = fileio.read_json(args.best)
    entries = best.get("budgets", [best])
    return "; ".join((f"at {budget_label(r['budget_flops'])} FLOPs: " if len(entries) > 1
                      else "") + _summary(r) for r in entries)


def _summary(r: dict) -> str:
    """One budget's tuning in one line."""
    rungs = " -> ".join(f"{n} x {f:g}" for n, f in r["rungs"])
    objective = r.get("objective", "val_loss")  # val_answer_loss on arithmetic
    notes = r["extended"] and [f"range extended: {', '.join(r['extended'])}"]
    head = (f"{r['n_trials']} trials (rungs {rungs} of the budget; {r['n_diverged']} "
            f"diverged); ")
    if b := r.get("bracket"):
        u = ("" if b["uncertainty"] is None else
             f", regret {b['regret']:.4f} (95% bound {b['uncertainty']:.4f} from this "
             "study's own seed spread; the report's tuning uncertainty pools the dataset's)")
        how = "fitted minimum" if b["fit"]["used"] == "vertex" else (
            f"best point: {b['fit']['note']}")
        return (head + f"lr {r['lr']:.3g} ({how}; {len(b['points'])} full-budget lrs, "
                f"{b['state']}{u}), d_model {r['d_model']}, {objective} {r['val_loss']:.4f}"
                + "".join(f"; {x}" for x in (notes or []) + r["on_edge"]))
    where = ("trained at the full budget" if r["full_budget"] else
             f"NOT trained at the full budget (best of rung {r['rung']}, "
             f"{r['budget_fraction']:g} of it: every trial above diverged)")
    return (head + f"best {objective} {r['val_loss']:.4f} at lr {r['lr']:.3g}, d_model "
            f"{r['d_model']}, {where}"
            + "".join(f"; {x}" for x in (notes or []) + r["on_edge"]))
