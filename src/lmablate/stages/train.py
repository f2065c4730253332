"""Stage ``train``: every seed of one dataset x variant, with the tuned learning rate and width,
for the steps that spend the dataset's training budget at that width (:mod:`lmablate.train.budget`).

Each seed is one MLflow run tagged dataset/variant/seed/stage. A seed whose ``result.json``
carries the current fingerprint, and whose checkpoint still has the sha256 recorded there, is
kept; an interrupted one resumes from its ``resume.pt``.
Seeds train as concurrent jobs on a CPU and as one batched model on a GPU (see :func:`run`).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from lmablate.config.study import ModelConfig, StudyConfig
from lmablate.core import fileio, interrupt
from lmablate.core.fingerprint import (code_version, component_code, fingerprint, run_params,
                                       tuned_settings)
from lmablate.core.tracker import RunTracker
from lmablate.data.token_data import TokenData
from lmablate.evaluate.answer_probe import answer_probe
from lmablate.execution.cluster import resolve
from lmablate.execution.executor import run_jobs
from lmablate.execution.parallel import use_processes
from lmablate.model.gpt import count_params, flops_per_token
from lmablate.model.variants import preflight, resolve_model_config
from lmablate.tracking.environment import describe, result_environment, same_environment
from lmablate.tracking.trackers import make_tracker, run_name
from lmablate.train.batched import batched_on, train_seeds
from lmablate.train.budget import run_steps, stage_budgets, tokens_per_step, training_flops
from lmablate.train.checkpoint import load_resume, save_checkpoint, verify_checkpoint
from lmablate.train.device import resolve_device
from lmablate.train.numerics import numerics_kind
from lmablate.train.training import GRAD_STATS_COLUMNS as SEED_GRAD_STATS_COLUMNS
from lmablate.train.training import HISTORY_COLUMNS as SEED_HISTORY_COLUMNS
from lmablate.train.training import DivergenceError, TrainResult, train_model


# The stage's CSVs: every seed's rows with the budget (training FLOPs of a final run) first
HISTORY_COLUMNS = ("budget_flops", *SEED_HISTORY_COLUMNS)
GRAD_STATS_COLUMNS = ("budget_flops", *SEED_GRAD_STATS_COLUMNS)


@dataclass(frozen=True)
class SeedJob:
    """One seed's training run, picklable for a worker process."""

    cfg: StudyConfig
    dataset: str
    variant: str
    model_cfg: ModelConfig
    lr: float
    seed: int
    steps: int
    tokens_dir: Path
    seed_dir: Path
    replicate: int = 0  # the re-tuning whose values these are: names the MLflow run only
    label: str | None = None  # the budget's, in a scaling study: names the MLflow run only

    @property
    def budget_flops(self) -> float:
        """The training FLOPs budget of this run (``cfg`` holds one per dataset)."""
        return self.cfg.train.for_dataset(self.dataset).budget_flops[self.dataset]


def seed_fingerprint(job: SeedJob, data: TokenData) -> str:
    """What a seed's result depends on: model, training settings (with its dataset's budget
    only), steps, lr, seed, the code of a run, its data and the numerics of the device it
    computes on (:func:`lmablate.train.numerics.numerics_kind`: the device type with its CPU kernels
    or GPU, and the measured fingerprint of its kernels); never the runtime settings that only
    change speed: ``runtime.workers``, ``threads``,
    ``parallel``, ``cluster``). A variant with a user's component adds its files' sha256
    (:func:`lmablate.core.fingerprint.component_code`; nothing for a built-in)."""
    device = resolve_device(job.cfg.runtime.device)
    return fingerprint(job.model_cfg, job.cfg.train.for_dataset(job.dataset), job.steps, job.lr,
                       job.seed, code_version(), data.fingerprint(), numerics_kind(device),
                       *component_code(job.model_cfg))


def _finished(job: SeedJob, fp: str) -> dict | None:
    """The seed's ``result.json`` if it exists with fingerprint ``fp`` and its checkpoint has
    the sha256 recorded there; else None, and the seed is trained again. A result or checkpoint
    that cannot be trusted (unreadable, truncated, changed) is reported in one line on stderr
    first: the user sees why a finished seed trains again."""
    result_path = job.seed_dir / "result.json"
    if not result_path.exists():
        return None
    try:
        done = fileio.read_json(result_path)
    except ValueError as exc:
        _distrust(job, str(exc))
        return None
    if not isinstance(done, dict) or done.get("fingerprint") != fp:
        return None  # written for other settings, data or code: trained again, as always
    problem = verify_checkpoint(job.seed_dir / "checkpoint.pt", done.get("checkpoint_sha256"))
    if problem:
        _distrust(job, problem)
        return None
    return done


def _where(job: SeedJob) -> str:
    """``dataset/variant``, and ``/<budget label>`` in a scaling study: a progress bar's name."""
    return f"{job.dataset}/{job.variant}" + (f"/{job.label}" if job.label else "")


def _distrust(job: SeedJob, problem: str) -> None:
    print(f"lmablate: {problem}; training {job.dataset}/{job.variant} seed {job.seed} again",
          file=sys.stderr, flush=True)


def _run_name_tags(job: SeedJob) -> tuple[str, dict]:
    """A seed's MLflow run name and tags (a scaling study's name the budget, a re-tuning's
    end in ``-r<N>``)."""
    return (run_name(job.dataset, job.variant, job.seed, job.label, job.replicate),
            {"dataset": job.dataset, "variant": job.variant, "seed": job.seed, "stage": "train",
             "replicate": job.replicate, "budget_flops": job.budget_flops})


def _run_params(job: SeedJob, device) -> dict:
    """The params a seed's MLflow run records once, when it starts: the model, every training
    setting (:meth:`~lmablate.config.train_config.TrainConfig.run_params`), the tuned peak lr, the
    steps, the seed and the sizes."""
    n_params, n_non_emb = count_params(job.model_cfg)
    # peak_lr: the tuned peak of the schedule; the metric "lr" is the schedule's value per step
    return {**job.model_cfg.to_dict(), **run_params(job.cfg, job.dataset),
            "peak_lr": job.lr, "steps": job.steps, "seed": job.seed, "n_params": n_params,
            "n_params_non_embedding": n_non_emb, "flops_per_token": flops_per_token(job.model_cfg),
            "device": device.type}


def _finish(job: SeedJob, fp: str, result: TrainResult, tracker: RunTracker,
            run_id: str | None, device) -> dict:
    """Record a trained seed: summary metrics to ``tracker``, ``checkpoint.pt`` and
    ``result.json`` written, ``resume.pt`` removed, the checkpoint logged as an artifact.
    Returns the ``result.json`` content."""
    n_params, n_non_emb = count_params(job.model_cfg)
    summary = {"seed": job.seed, "lr": job.lr, "d_model": job.model_cfg.d_model,
               "n_params": n_params, "n_params_non_embedding": n_non_emb,
               "flops_per_token": flops_per_token(job.model_cfg), "steps": job.steps,
               "tokens": job.steps * tokens_per_step(job.model_cfg, job.cfg.train.batch_size),
               "train_flops": training_flops(job.model_cfg, job.cfg.train.batch_size, job.steps),
               "budget_flops": job.budget_flops,
               "val_loss": result.val_loss,
               "train_seconds": result.train_seconds,
               "tokens_per_second": result.tokens_per_second,
               "device": device.type, "mlflow_run_id": run_id}
    # at the last step, not at step 0: val_loss is in the history there already, and a value
    # logged without a step would add a point at 0 to every curve
    tracker.log_metrics({k: summary[k] for k in ("train_seconds", "tokens_per_second")},
                        step=job.steps)
    sha256 = save_checkpoint(job.seed_dir / "checkpoint.pt", result.model, result.optimizer,
                             job.model_cfg, step=job.steps,
                             meta={"dataset": job.dataset, "variant": job.variant,
                                   "seed": job.seed})
    done = {"dataset": job.dataset, "variant": job.variant,
            "fingerprint": fp, "checkpoint_sha256": sha256, "summary": summary,
            "history": result.history,
            "grad_stats": [{"seed": job.seed, **g} for g in result.grad_stats]}
    fileio.write_json(job.seed_dir / "result.json", done)
    (job.seed_dir / "resume.pt").unlink(missing_ok=True)
    tracker.log_artifact(job.seed_dir / "checkpoint.pt", "checkpoint")
    return done


def train_seeds_of(jobs: Sequence[SeedJob], batched: bool = False) -> list[dict]:
    """Train a group of seeds of one dataset x variant and budget (same model config, lr and
    steps), in this process, a worker process or a cluster task, and record each as one MLflow
    run.

    A seed whose ``result.json`` has the current fingerprint (and a checkpoint with the sha256
    recorded there) is kept; the others resume from ``seed_dir/resume.pt`` where it has their
    fingerprint, each in its MLflow run (reopened when resuming), and train: together as one
    batched model with ``batched`` (:func:`lmablate.train.batched.train_seeds`, the GPU's path),
    else each with :func:`lmablate.train.training.train_model` (a group of one seed, the CPU's
    path). Each trained seed gets ``seed_dir/checkpoint.pt`` and ``seed_dir/result.json``
    (``fingerprint``, ``summary``, ``history``, ``grad_stats``), and its ``resume.pt`` is
    removed (:func:`_finish`). Returns the ``result.json`` contents in ``jobs``' order.

    Raises:
        DivergenceError: a seed's loss became NaN/inf (names dataset, variant, seed and step).
        Interrupted: Ctrl-C; the seeds' runs end KILLED, their resume states stay.
    """
    first = jobs[0]
    cfg = first.cfg
    if not batched and len(jobs) != 1:
        raise ValueError(f"{len(jobs)} seeds without batched: train them as groups of one")
    data = TokenData.load(first.tokens_dir)
    fps = {job.seed: seed_fingerprint(job, data) for job in jobs}
    done = {job.seed: _finished(job, fps[job.seed]) for job in jobs}
    todo = [job for job in jobs if done[job.seed] is None]
    if not todo:
        return [done[job.seed] for job in jobs]
    tracker = make_tracker(cfg.tracking)
    device = resolve_device(cfg.runtime.device)
    # Ctrl-C stops the seeds at their next step (lmablate.core.interrupt); every seed's run
    # open, ended FAILED if one raises (KILLED by Ctrl-C)
    with interrupt.deferred(), contextlib.ExitStack() as stack:
        runs = []
        for job in todo:
            resumed = load_resume(job.seed_dir / "resume.pt", fps[job.seed])
            name, tags = _run_name_tags(job)
            run = stack.enter_context(tracker.open_run(
                name, tags, run_id=resumed["meta"].get("mlflow_run_id") if resumed else None))
            if resumed is None:
                run.log_params(_run_params(job, device))
            runs.append(run)
        try:
            probe = answer_probe(data.tokens_dir, cfg.evaluate.batch_size, device)
            if batched:
                results = train_seeds(
                    first.model_cfg, cfg.train, data, seeds=[job.seed for job in todo],
                    lr=first.lr, steps=first.steps, device=device, trackers=runs,
                    desc=_where(first),
                    resume_paths=[job.seed_dir / "resume.pt" for job in todo],
                    fingerprints=[fps[job.seed] for job in todo],
                    resume_meta=[{"mlflow_run_id": run.run_id} for run in runs], probe=probe)
            else:
                results = [train_model(first.model_cfg, cfg.train, data, seed=first.seed,
                                       lr=first.lr, steps=first.steps, device=device,
                                       tracker=runs[0], desc=f"{_where(first)}/seed {first.seed}",
                                       resume_path=first.seed_dir / "resume.pt",
                                       fingerprint=fps[first.seed],
                                       resume_meta={"mlflow_run_id": runs[0].run_id},
                                       probe=probe)]
        except DivergenceError as exc:
            seed = getattr(exc, "seed", "?") if batched else first.seed
            raise DivergenceError(f"dataset {first.dataset}, variant {first.variant}, seed "
                                  f"{seed}: {exc}") from None
        for job, run, result in zip(todo, runs, results):
            done[job.seed] = _finish(job, fps[job.seed], result, run, run.run_id, device)
    return [done[job.seed] for job in jobs]


def run(cfg: StudyConfig, dataset: str, variant: str, tokens_dir: Path, best_path: Path,
        checkpoints_dir: Path, history_path: Path, grad_stats_path: Path,
        replicate: int = 0) -> dict:
    """Train ``variant`` on ``dataset`` for every seed with the tuned lr and d_model, at each
    of the dataset's budgets (:func:`lmablate.train.budget.stage_budgets`).

    ``replicate`` r > 0: replicate r of the study
    (:meth:`~lmablate.config.study.StudyConfig.for_replicate`): its own final seeds, and
    ``best_path`` from its own tuning (``lmablate tune --replicate r``, the headline budget
    only); the seeds' MLflow runs are tagged with r.

    On a CPU, seeds run concurrently as threads or processes, on a cluster as tasks
    (:func:`lmablate.execution.executor.run_jobs`); on a GPU
    (:func:`lmablate.train.batched.batched_on`) the seeds of a model without dropout train
    together as one batched model (:func:`train_seeds_of`). Writes
    ``checkpoints_dir/seed_<s>/checkpoint.pt`` and ``result.json`` per seed (see
    :func:`train_seeds_of`; interrupted seeds resume, finished ones are
    kept; in a scaling study under ``checkpoints_dir/<budget label>/``), ``history_path`` (CSV,
    columns :data:`HISTORY_COLUMNS`, every budget's) and ``grad_stats_path`` (CSV,
    :data:`GRAD_STATS_COLUMNS`).

    Returns the headline budget's seed summaries, ``{"seed_<s>": {...}}``.

    Raises:
        ConfigError / ValueError: unknown dataset or variant, data too small for the context,
            the model fails the causality pre-flight, ``best_path`` comes from another
            replicate's tuning or lacks a budget. All raised before the first step.
        DivergenceError: a run's loss became NaN/inf (names dataset, variant, seed and step).
    """
    cfg.dataset(dataset)
    cfg = cfg.for_replicate(replicate).for_dataset(dataset)
    # a device this machine lacks, a cluster that does not answer or a worker of another kind:
    # before any work
    device, numerics, cluster = resolve(cfg)
    best = fileio.read_json(best_path)
    check_tuned_here(best, best_path, result_environment(numerics), cfg.mixed_environments)
    data = TokenData.load(tokens_dir)
    # every budget's model, checked, before any seed of any budget trains
    plans = [_plan(cfg.at_budget(dataset, budget), dataset, variant, data, tokens_dir, best,
                   best_path, replicate, label,
                   checkpoints_dir / label if label else checkpoints_dir)
             for budget, label in stage_budgets(cfg, dataset, replicate)]
    # weights and AdamW's two moments at 4 bytes each, and a resume state beside them while
    # it is replaced, per seed and budget: the checkpoints this stage leaves and passes through
    need = sum(len(jobs) * (4 * 4 * count_params(jobs[0].model_cfg)[0] + 2 ** 16)
               for jobs in plans)
    n = sum(map(len, plans))
    fileio.check_room(checkpoints_dir, need, f"{n} checkpoint" + "s" * (n != 1))
    if cluster is not None and use_processes(cfg.runtime, [jobs[0].model_cfg for jobs in plans]):
        cluster.check_single_threaded(f"variant {variant!r} has dropout")
    results: list[dict] = []
    for jobs in plans:
        results += _train_budget(jobs, device, cluster)
    fileio.write_csv(history_path, [{"budget_flops": r["summary"]["budget_flops"], **row}
                                    for r in results for row in r["history"]], HISTORY_COLUMNS)
    fileio.write_csv(grad_stats_path, [{"budget_flops": r["summary"]["budget_flops"], **row}
                                       for r in results for row in r["grad_stats"]],
                     GRAD_STATS_COLUMNS)
    headline = cfg.headline_budget(dataset)
    return {f"seed_{r['summary']['seed']}": r["summary"] for r in results
            if r["summary"]["budget_flops"] == headline}


def check_tuned_here(best: dict, best_path: Path, here: dict, mixed: bool) -> None:
    """Refuse a ``best.json`` tuned with other numerics or another torch build
    (:func:`lmablate.tracking.environment.same_environment`) than this stage trains with
    (``here``), unless ``study.mixed_environments`` (``mixed``) says to take it.

    Raises:
        ValueError: naming the file and both environments.
    """
    entries = [best, *best.get("budgets", [])]
    tuned = next((e["environment"] for e in entries if e.get("environment")), None)
    if not mixed and not same_environment(tuned, here):
        raise ValueError(f"{best_path}: tuned with {describe(tuned)}, but this stage trains with "
                         f"{describe(here)}; tune here (dvc repro -f the tune stage), or set "
                         "study.mixed_environments: true to train from it anyway")


def tuned_at(best: dict, budget: float, best_path: Path) -> dict:
    """The tuned values of ``budget`` in a ``best.json`` (one entry, or a scaling study's
    ``{"budgets": [...]}``).

    Raises:
        ValueError: the file has no entry for ``budget`` (tuned for other budgets: run the
            tune stage again).
    """
    for entry in best.get("budgets", [best]):
        if entry.get("budget_flops", budget) == budget:
            return entry
    raise ValueError(f"{best_path}: tuned for budgets "
                     f"{[e.get('budget_flops') for e in best.get('budgets', [best])]}, not "
                     f"{budget:.3g}; run lmablate tune (or dvc repro) again")


def _plan(cfg: StudyConfig, dataset: str, variant: str, data: TokenData, tokens_dir: Path,
          best: dict, best_path: Path, replicate: int, label: str | None,
          checkpoints_dir: Path) -> list[SeedJob]:
    """One budget's seed jobs (``cfg`` holds that budget), checked: tuned by this replicate,
    data long enough, the model causal."""
    tuned = tuned_at(best, cfg.train.for_dataset(dataset).budget_flops[dataset], best_path)
    study = tuned.get("study_name")
    if study is not None and not study.startswith(f"{dataset}-{variant}-"):
        raise ValueError(f"{best_path}: tuned for another dataset or variant (Optuna study "
                         f"{study}), not {dataset} {variant}; pass runs/{dataset}/{variant}/"
                         "best.json")
    expected = cfg.tune.sampler_seed  # the replicate's (StudyConfig.for_replicate)
    if tuned.get("sampler_seed", expected) != expected:
        raise ValueError(f"{best_path}: tuned with sampler seed {tuned['sampler_seed']}, but "
                         f"replicate {replicate} tunes with tune.sampler_seed + {replicate} = "
                         f"{expected}; pass that replicate's best.json")
    settings = tuned_settings(cfg, dataset, variant, data.fingerprint(), expected)
    if tuned.get("settings", settings) != settings:
        raise ValueError(f"{best_path}: tuned for other settings or data (fingerprint "
                         f"{tuned['settings']}) than these params and {tokens_dir} give "
                         f"({settings}); run lmablate tune (or dvc repro) again")
    model_cfg = resolve_model_config(cfg, variant, data.vocab_size, tuned["d_model"],
                                     data.line_length)
    data.check_fits(model_cfg.context_length, f"{dataset}")
    preflight(model_cfg, f"variant {variant!r}")
    steps = run_steps(cfg, dataset, model_cfg)
    return [SeedJob(cfg, dataset, variant, model_cfg, tuned["lr"], seed, steps, tokens_dir,
                    checkpoints_dir / f"seed_{seed}", replicate, label) for seed in cfg.seeds]


def _train_budget(jobs: list[SeedJob], device, cluster) -> list[dict]:
    """Train one budget's seeds (same model and lr) with :func:`train_seeds_of`: all as one
    batched group where :func:`~lmablate.train.batched.batched_on` the device and the model has
    no dropout (one job in this thread, or one task on a cluster), else one group per seed
    (concurrent jobs on a CPU, one task each on a cluster). Returns their ``result.json``
    contents in seed order."""
    first = jobs[0]
    name = f"train-{first.dataset}-{first.variant}" + (f"-{first.label}" if first.label else "")
    # one path per device type and model (both in the fingerprint), never per setting:
    # batched and per-seed results agree to fp32 rounding only
    batched = batched_on(device) and first.model_cfg.dropout == 0
    groups = [jobs] if batched else [[job] for job in jobs]
    done = run_jobs(functools.partial(train_seeds_of, batched=batched), groups, device=device,
                    runtime=first.cfg.runtime, cluster=cluster, all_at_once=True,
                    processes=use_processes(first.cfg.runtime, [first.model_cfg]),
                    inline=batched,
                    names=[name] if batched else [f"{name}-seed{j.seed}" for j in jobs],
                    # the files travel with a task where the workers do not see this workspace
                    inputs=lambda group: [p for j in group for p in (j.tokens_dir, j.seed_dir)],
                    outputs=lambda group: [j.seed_dir for j in group])
    return [result for group in done for result in group]


def main(cfg: StudyConfig, args: argparse.Namespace) -> str:
    """``lmablate train <dataset> <variant> --tokens DIR --best FILE --checkpoints DIR
    --history FILE --grad-stats FILE [--replicate N]``. Returns the stage's summary line:
    seeds, steps, width, lr and the range of final validation losses (nats/char); in a
    scaling study, of the headline budget."""
    cfg.check_variant(args.variant)
    runs = run(cfg, args.dataset, args.variant, args.tokens, args.best, args.checkpoints,
               args.history, args.grad_stats, replicate=getattr(args, "replicate", 0))
    losses = [r["val_loss"] for r in runs.values()]
    first = next(iter(runs.values()))
    budgets = [label for _, label in stage_budgets(cfg, args.dataset,
                                                   getattr(args, "replicate", 0)) if label]
    return ((f"budgets {', '.join(budgets)} FLOPs; at {budgets[-1]}: " if budgets else "")
            + f"{len(runs)} seeds x {first['steps']:,} steps at d_model {first['d_model']}, "
            f"lr {first['lr']:.3g}; final val_loss {min(losses):.4f} to {max(losses):.4f}")
