"""Stage ``tune``: a deterministic Optuna study per dataset x variant over learning rate and width.

Objective: validation loss (nats/char) at the end of a trial's share of the dataset's training
budget, on the tuning seed ``tune.seed``, which is not a final seed. What each trial trains,
which trials go on to the next rung and what the study returns is decided by
:mod:`lmablate.tuning` (successive halving up to the full budget), and the queued trials are
trained on the stage's workers by :mod:`lmablate.trials`; this stage validates, opens the study
and the MLflow parent run, and records the outcome: Optuna's storage, ``trials.csv``,
``best.json``, and one MLflow run per trial nested under one parent run per dataset x variant.
The study is the same at any ``runtime.workers``, in threads, processes or on several machines
sharing one storage.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lmablate import fileio
from lmablate.budget import run_steps, trial_steps
from lmablate.config import MAX_SEED, ConfigError, StudyConfig
from lmablate.cluster import resolve
from lmablate.parallel import use_processes
from lmablate.studies import load_study, make_storage
from lmablate.token_data import TokenData
from lmablate.tracking import Tracker, make_tracker
from lmablate.trials import TRIALS_COLUMNS, TuneJob, run_batches, summarise_study
from lmablate.tuning import describe_study, initial_space, slot_results, study_name, width_ladder
from lmablate.variants import preflight, resolve_model_config


def run(cfg: StudyConfig, dataset: str, variant: str, tokens_dir: Path, best_path: Path,
        trials_path: Path, tracker: Tracker, replicate: int = 0) -> dict:
    """Run (or resume) the study until every rung is done (:mod:`lmablate.tuning`).

    ``replicate`` > 0 re-tunes with sampler seed ``tune.sampler_seed + replicate`` (a separate
    study with its own design and proposals): how much the tuned result owes to the luck of
    the search.

    Writes ``best_path`` (JSON: ``lr``, ``d_model``, ``val_loss``, its ``slot``, ``rung`` and
    ``budget_fraction``, ``full_budget`` (whether it was trained at the final runs' budget),
    ``on_edge`` flags, the ranges searched (``lr_range``, ``d_model_choices``) and how they
    were ``extended``, trial counts, tuning steps and FLOPs, ``study_name``; the same bytes on
    every run of the same commit, params and data;
    :func:`lmablate.trials.summarise_study`) and ``trials_path`` (CSV,
    :data:`lmablate.trials.TRIALS_COLUMNS`, one row per slot). A diverging trial (NaN/inf
    loss) is a result (FAIL, ``outcome: diverged``) and the study goes on.

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
    # a device this machine lacks, a cluster that does not answer or a worker of another
    # kind: before any trial
    _, kind, cluster = resolve(cfg)
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
    if cluster is not None and processes:
        cluster.check_single_threaded(f"variant {variant!r} has dropout")
    storage = make_storage(tune.storage_url, tune.heartbeat_seconds)
    name = study_name(cfg, dataset, variant, data.fingerprint(), sampler_seed, kind)
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
        job_cfg = cfg if cluster is None else cluster.pin(cfg)
        run_batches(TuneJob(job_cfg, dataset, variant, tokens_dir, name, parent_run_id), study,
                    sampler_seed, processes, cluster)
        result, rows = summarise_study(cfg, dataset, variant, name, slot_results(study),
                                       data.vocab_size, sampler_seed, widths)
        tracker.log_metrics({"best_val_loss": result["val_loss"]})
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
