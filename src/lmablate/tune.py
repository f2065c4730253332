"""Stage ``tune``: an Optuna study per dataset x variant over learning rate and width.

Objective: validation loss (nats/token) after ``tune.steps`` training steps on the study's first
seed. The study lives in persistent Optuna storage (SQLite by default, a shared PostgreSQL for
several machines), named by dataset, variant and a fingerprint of every setting that affects the
objective: an interrupted run resumes its study; a changed setting starts a fresh one.
"""

from __future__ import annotations

from pathlib import Path

import optuna

from . import fileio
from .config import StudyConfig
from .tracking import NullTracker
from .train import DivergenceError, TokenData, preflight, resolve_device, resolve_model_config, train_model

# Trials that count towards ``tune.n_trials``: a pruned trial is a finished trial too.
FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)


def make_storage(url: str) -> optuna.storages.BaseStorage:
    """Optuna storage for ``url``. SQLite gets a generous lock timeout so that parallel workers
    wait rather than fail with "database is locked"."""
    engine_kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else None
    return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)


def make_pruner(name: str, n_startup_trials: int) -> optuna.pruners.BasePruner:
    """``median`` (Optuna's MedianPruner), ``hyperband`` or ``none``."""
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=n_startup_trials, n_warmup_steps=1)
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner()
    return optuna.pruners.NopPruner()


def study_name(cfg: StudyConfig, dataset: str, variant: str) -> str:
    """``<dataset>-<variant>-<fingerprint>``, the fingerprint covering every objective input."""
    fp = cfg.fingerprint(cfg.dataset(dataset), cfg.model, cfg.variants[variant], cfg.train,
                         cfg.tune.n_trials, cfg.tune.steps, cfg.tune.lr_low, cfg.tune.lr_high,
                         cfg.tune.d_model_choices, cfg.tune.sampler_seed, cfg.tune.pruner,
                         cfg.seeds[0], cfg.match_params)
    return f"{dataset}-{variant}-{fp}"


def run(cfg: StudyConfig, dataset: str, variant: str, tokens_dir: Path, best_path: Path,
        trials_path: Path, tracker: NullTracker) -> dict:
    """Run (or resume) the study until ``tune.n_trials`` trials have finished.

    Writes ``best_path`` (JSON: lr, d_model, val_loss, study_name, n_trials) and ``trials_path``
    (CSV from ``study.trials_dataframe()``). Each trial is an MLflow run nested under one parent
    run per dataset x variant. A diverging trial (NaN/inf loss) is recorded as FAIL and the
    study goes on.

    Raises:
        ConfigError / ValueError: unknown dataset or variant, data too small, a model that fails
            the causality pre-flight; raised before the first trial.
        RuntimeError: no trial finished successfully.
    """
    cfg.dataset(dataset)
    cfg.check_variant(variant)
    data = TokenData.load(tokens_dir)
    data.check_fits(cfg.model.context_length, dataset)
    for d_model in cfg.tune.d_model_choices:
        preflight(resolve_model_config(cfg, variant, data.vocab_size, d_model), f"variant {variant!r}")
    device = resolve_device(cfg.train.device)
    tune = cfg.tune
    name = study_name(cfg, dataset, variant)
    study = optuna.create_study(
        study_name=name, storage=make_storage(tune.storage_url), load_if_exists=True,
        direction="minimize", sampler=optuna.samplers.TPESampler(seed=tune.sampler_seed),
        pruner=make_pruner(tune.pruner, n_startup_trials=max(1, tune.n_trials // 4)))
    tags = {"dataset": dataset, "variant": variant, "stage": "tune", "optuna_study": name}

    def objective(trial: optuna.Trial) -> float:
        lr = trial.suggest_float("lr", tune.lr_low, tune.lr_high, log=True)
        d_model = trial.suggest_categorical("d_model", list(tune.d_model_choices))
        model_cfg = resolve_model_config(cfg, variant, data.vocab_size, d_model)

        def report(step: int, val_loss: float) -> None:
            trial.report(val_loss, step)
            if trial.should_prune():
                tracker.set_tags({"state": "PRUNED"})
                raise optuna.TrialPruned(f"pruned at step {step}: val_loss {val_loss:.4f}")

        with tracker.run(f"trial-{trial.number}", {**tags, "trial": trial.number}, nested=True):
            tracker.log_params({"lr": lr, "d_model": d_model, "trial": trial.number})
            try:
                result = train_model(model_cfg, cfg.train, data, seed=cfg.seeds[0], lr=lr,
                                     steps=tune.steps, device=device, on_eval=report,
                                     tracker=tracker, desc=f"{dataset}/{variant}/trial {trial.number}")
            except DivergenceError as exc:
                trial.set_user_attr("fail_reason", str(exc))
                tracker.set_tags({"state": "FAILED", "fail_reason": str(exc)})
                raise
            trial.set_user_attr("steps", tune.steps)
            return result.val_loss

    with tracker.run(f"tune-{dataset}-{variant}", tags):
        tracker.log_params({"n_trials": tune.n_trials, "steps": tune.steps,
                            "lr_low": tune.lr_low, "lr_high": tune.lr_high,
                            "d_model_choices": list(tune.d_model_choices), "pruner": tune.pruner})
        # MaxTrialsCallback counts finished trials in storage, so a resumed study, or several
        # workers sharing one database, stop together at exactly n_trials.
        if sum(t.state in FINISHED for t in study.trials) < tune.n_trials:
            study.optimize(  # n_trials caps this worker too, should every trial diverge
                objective, n_trials=tune.n_trials, catch=(DivergenceError,),
                callbacks=[optuna.study.MaxTrialsCallback(tune.n_trials, states=FINISHED)])
        completed = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        if not completed:
            raise RuntimeError(f"tune {dataset}/{variant}: no trial of study {name} completed; "
                               "see the failed trials' fail_reason in Optuna or MLflow")
        best = study.best_trial
        result = {"lr": best.params["lr"], "d_model": best.params["d_model"],
                  "val_loss": best.value, "study_name": name, "trial": best.number,
                  "n_trials": sum(t.state in FINISHED for t in study.trials)}
        tracker.log_metrics({"best_val_loss": best.value})
        tracker.log_params({"best_lr": result["lr"], "best_d_model": result["d_model"]})
    with fileio.atomic_path(trials_path) as tmp:
        study.trials_dataframe().to_csv(tmp, index=False)
    fileio.write_json(best_path, result)
    return result
