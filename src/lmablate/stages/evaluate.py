"""Stage ``evaluate``: the test metrics of every seed's checkpoint of one dataset x variant.

Metrics are defined in :mod:`lmablate.evaluate.metrics`. They are written as a DVC metrics file and
logged into each seed's MLflow training run, so one run per seed carries the same metric names
for every variant.
"""

from __future__ import annotations

import argparse
import functools
import math
from dataclasses import dataclass, field
from pathlib import Path

from lmablate.config.study import DataError, StudyConfig
from lmablate.core import fileio
from lmablate.core.tracker import Tracker
from lmablate.data.arithmetic import operand_digits, split_problem
from lmablate.data.token_data import TokenData
from lmablate.data.tokenizer import CharTokenizer, load_tokenizer
from lmablate.evaluate.metrics import (answer_nats, arithmetic_predictions, arithmetic_scores,
                                 by_operand_digits, extrapolation, not_reaching, split_loss,
                                 text_samples)
from lmablate.execution.cluster import resolve
from lmablate.execution.executor import run_jobs
from lmablate.model.gpt import check_causality
from lmablate.tracking.environment import result_environment
from lmablate.tracking.trackers import make_tracker, run_name
from lmablate.train.budget import stage_budgets
from lmablate.train.checkpoint import load_checkpoint, verify_checkpoint
from lmablate.train.device import resolve_device


# Summary fields of a training run that differ from run to run (timings, MLflow's random run
# id): kept in the seed's result.json and in MLflow, left out of metrics.json so that the same
# commit and params give the same bytes.
NOT_REPRODUCIBLE = ("train_seconds", "tokens_per_second", "mlflow_run_id")


@dataclass(frozen=True)
class EvalJob:
    """One seed's evaluation, picklable for a cluster task: its checkpoint folder, its
    training summary, the longest window (tokens) and, on arithmetic, the test problems and
    the longer problems by operand digits."""

    cfg: StudyConfig
    dataset: str
    variant: str
    tokens_dir: Path
    seed_dir: Path
    seed: int
    summary: dict = field(hash=False)
    longest: int = 0
    problems: tuple[str, ...] = ()
    lengths: tuple[tuple[int, tuple[str, ...]], ...] = ()
    replicate: int = 0
    label: str | None = None  # the budget's, in a scaling study (names the MLflow run)


def evaluate_seed(job: EvalJob, data: TokenData | None = None, tok: CharTokenizer | None = None,
                  tracker: Tracker | None = None) -> tuple[dict, object]:
    """Evaluate one seed's checkpoint: ``(metrics, examples)`` as :func:`run` describes them,
    its test metrics logged into the seed's MLflow training run. ``data``, ``tok`` and
    ``tracker`` are loaded from ``job`` when not given (on a cluster's worker).

    Raises:
        ValueError: the checkpoint's vocabulary is not the data's.
        CausalityError: a model that would see the future past its context.
    """
    cfg, dataset, variant, seed, seed_dir = (job.cfg, job.dataset, job.variant, job.seed,
                                              job.seed_dir)
    ds, summary, longest, problems = (cfg.dataset(dataset), job.summary, job.longest,
                                      list(job.problems))
    device = resolve_device(cfg.runtime.device)
    data = TokenData.load(job.tokens_dir) if data is None else data
    tok = load_tokenizer(job.tokens_dir) if tok is None else tok
    tracker = make_tracker(cfg.tracking) if tracker is None else tracker
    model, ckpt = load_checkpoint(seed_dir / "checkpoint.pt", device)
    if ckpt["model_config"]["vocab_size"] != tok.vocab_size:
        raise ValueError(f"{seed_dir / 'checkpoint.pt'}: vocab_size "
                         f"{ckpt['model_config']['vocab_size']} does not match the data's "
                         f"{tok.vocab_size} ({job.tokens_dir}); retrain")
    if model.position.max_positions is None:  # run past its context below: mask and
        check_causality(model.cfg, length=longest)  # positions must stay causal there
    loss = split_loss(model, data.test, cfg.evaluate.batch_size, cfg.evaluate.max_batches,
                      device, data.stride)
    reproducible = {k: v for k, v in summary.items() if k not in NOT_REPRODUCIBLE}
    metrics = {**reproducible, "test_loss": loss, "perplexity": math.exp(loss),
               "bits_per_char": loss / math.log(2)}
    ev = cfg.evaluate
    metrics["extrapolation"] = extrapolation(
        model, data.test, ev.extrapolation_factors, ev.position_bucket, ev.batch_size,
        ev.max_batches * ev.batch_size * model.cfg.context_length, device, data.stride)
    if ds.kind == "arithmetic":
        ev = cfg.evaluate
        name = f"{dataset}/{variant}/" + (f"{job.label}/" if job.label else "") + f"seed {seed}"
        preds = arithmetic_predictions(model, tok, problems, ev.batch_size, device,
                                       desc=f"{name}: decoding")
        nats = answer_nats(model, tok, problems, ev.batch_size, device)
        metrics.update(arithmetic_scores(problems, preds, nats))
        digits = by_operand_digits(problems, preds, nats, "test")
        for n, lines in job.lengths:  # longer than any training problem
            reason = not_reaching(model, len(lines[0]))
            if reason:
                digits[str(n)] = reason
                continue
            long_preds = arithmetic_predictions(model, tok, lines, ev.batch_size, device,
                                                desc=f"{name}: {n} digits")
            digits.update(by_operand_digits(
                lines, long_preds, answer_nats(model, tok, lines, ev.batch_size, device),
                "length"))
        metrics["by_operand_digits"] = digits
        # every problem, in test.txt's order: the report pairs variants problem by problem
        examples = [{"prompt": split_problem(p)[0], "target": split_problem(p)[1],
                     "prediction": q} for p, q in zip(problems, preds)]
    else:
        examples = text_samples(model, tok, cfg.evaluate.n_samples,
                                cfg.evaluate.sample_tokens, cfg.evaluate.temperature, seed,
                                device)
    # only what evaluation measured (the training summary is in the run already), at the
    # run's last step: a value without a step would be a point at step 0 of its curve
    flat = {k: v for k, v in metrics.items() if isinstance(v, float) and k not in summary}
    for op, s in metrics.get("per_op", {}).items():
        flat.update({f"{k}_{op}": v for k, v in s.items() if k != "n"})
    # exact match by operand length, e.g. exact_match_d4; NaN where the model cannot read
    # that long, so every variant's run has the same keys
    flat.update({f"exact_match_d{n}": r["exact_match"] if isinstance(r, dict) else math.nan
                 for n, r in metrics.get("by_operand_digits", {}).items()})
    # e.g. test_loss_x4; NaN past a learned table, so every variant's run has the same keys
    flat.update({f"test_loss_{x}": r["test_loss"] if isinstance(r, dict) else math.nan
                 for x, r in metrics["extrapolation"].items()})
    tags = {"dataset": dataset, "variant": variant, "seed": seed, "stage": "final",
            "replicate": job.replicate, "budget_flops": summary["budget_flops"]}
    with tracker.run(run_name(dataset, variant, seed, job.label, job.replicate), tags,
                     run_id=summary.get("mlflow_run_id")):
        tracker.set_tags(tags)
        tracker.log_metrics(flat, step=summary["steps"])
    return metrics, examples


def run(cfg: StudyConfig, dataset: str, variant: str, tokens_dir: Path, raw_dir: Path,
        checkpoints_dir: Path, metrics_path: Path, examples_path: Path,
        tracker: Tracker, replicate: int = 0) -> dict:
    """Evaluate every seed's checkpoint of ``dataset`` x ``variant``.

    Writes ``metrics_path`` (JSON ``{"dataset", "variant", "runs": {"seed_<s>": {...}}}``, in a
    scaling study keyed ``"<budget label>/seed_<s>"``, every budget's (each run's training
    summary has its ``budget_flops``); each seed's with its length extrapolation under
    ``"extrapolation"`` (:func:`lmablate.evaluate.metrics.extrapolation`); an arithmetic seed's with
    its answer loss, exact match and char accuracy overall, ``per_op`` and ``by_answer_digits``
    (:func:`lmablate.evaluate.metrics.arithmetic_scores`) and ``by_operand_digits``, the test
    split's lengths and each length of ``length.txt`` (``"split": "test"`` / ``"length"``;
    :func:`lmablate.evaluate.metrics.by_operand_digits`), or "n/a (...)" for a length the model
    cannot read (:func:`lmablate.evaluate.metrics.not_reaching`); plus
    ``"replicate": r`` for replicate r > 0 of the study, and the ``"environment"`` it
    was computed with (:func:`lmablate.tracking.environment.result_environment`); a DVC metrics
    file) and ``examples_path`` (JSON, per seed: text samples, or the prediction of every arithmetic
    test problem with its prompt and target, in the order of ``test.txt``; keyed as the runs). Test
    metrics are logged into each seed's MLflow training run, so one run per seed carries the
    same metric names for every variant. Seeds (of every budget) are evaluated concurrently
    on a CPU, or as tasks of a cluster (:func:`lmablate.execution.executor.run_jobs`).
    """
    ds = cfg.dataset(dataset)
    cfg.check_variant(variant)
    cfg = cfg.for_replicate(replicate).for_dataset(dataset)  # its own final seeds
    # a device this machine lacks, a cluster that does not answer or a worker of another kind:
    # before any work
    device, numerics, cluster = resolve(cfg)
    data = TokenData.load(tokens_dir)
    tok = load_tokenizer(tokens_dir)
    factors = list(cfg.evaluate.extrapolation_factors)
    longest = max(factors) * cfg.model.context_length
    if len(data.test) < longest + 1:  # before any checkpoint is read
        raise DataError(f"evaluate.extrapolation_factors: {factors} needs a test split of at "
                        f"least {longest + 1} tokens (the longest window, {longest}, plus one); "
                        f"{tokens_dir} has {len(data.test)}")
    # every budget's seeds (a scaling study's under checkpoints_dir/<budget label>/), every
    # checkpoint checked before any is evaluated or logged
    seeds = [(label, seed, (checkpoints_dir / label if label else checkpoints_dir)
              / f"seed_{seed}") for _, label in stage_budgets(cfg, dataset, replicate)
             for seed in cfg.seeds]
    trained = {}
    for label, seed, seed_dir in seeds:
        trained[label, seed] = fileio.read_json(seed_dir / "result.json")
        made_for = (trained[label, seed].get("dataset", dataset),
                    trained[label, seed].get("variant", variant),
                    trained[label, seed].get("summary", {}).get("seed", seed))
        if made_for != (dataset, variant, seed):
            raise DataError(f"{seed_dir}: trained for {made_for[0]} {made_for[1]} seed "
                            f"{made_for[2]}, not {dataset} {variant} seed {seed}; pass "
                            f"--checkpoints runs/{dataset}/{variant}/checkpoints")
        problem = verify_checkpoint(seed_dir / "checkpoint.pt",
                                    trained[label, seed].get("checkpoint_sha256"))
        if problem:
            raise DataError(f"{problem}; run lmablate train {dataset} {variant} (or dvc repro) "
                            f"again to retrain seed {seed}")
    problems, lengths = [], {}
    if ds.kind == "arithmetic":
        problems = (raw_dir / "test.txt").read_text(encoding="utf-8").split()
        problems = problems[:cfg.evaluate.max_problems]
        # the length-generalisation split: up to max_problems problems of each length
        long = raw_dir / "length.txt"
        for line in (long.read_text(encoding="utf-8").split() if long.is_file() else []):
            lengths.setdefault(operand_digits(line), []).append(line)
        lengths = {n: lines[:cfg.evaluate.max_problems] for n, lines in lengths.items()}

    jobs = [EvalJob(cfg, dataset, variant, tokens_dir, seed_dir, seed,
                    trained[label, seed]["summary"], longest, tuple(problems),
                    tuple((n, tuple(lines)) for n, lines in sorted(lengths.items())),
                    replicate, label) for label, seed, seed_dir in seeds]
    # Seeds in threads of this process (evaluation draws no global random numbers), or as
    # cluster tasks, which load the data, tokenizer and tracker on their worker
    local = functools.partial(evaluate_seed, data=data, tok=tok, tracker=tracker)
    done = run_jobs(evaluate_seed if cluster is not None else local, jobs, device=device,
                    runtime=cfg.runtime, cluster=cluster, all_at_once=True,
                    names=[f"evaluate-{dataset}-{variant}-" + (f"{j.label}-" if j.label else "")
                           + f"seed{j.seed}" for j in jobs],
                    inputs=lambda j: [j.tokens_dir, j.seed_dir / "checkpoint.pt"])
    keys = [(f"{label}/" if label else "") + f"seed_{seed}" for label, seed, _ in seeds]
    runs = {key: metrics for key, (metrics, _) in zip(keys, done)}
    examples = {key: ex for key, (_, ex) in zip(keys, done)}
    result = {"dataset": dataset, "variant": variant,
              **({"replicate": replicate} if replicate else {}),
              "environment": result_environment(numerics), "runs": runs}
    fileio.write_json(metrics_path, result)
    fileio.write_json(examples_path, examples)
    return result


def main(cfg: StudyConfig, args: argparse.Namespace) -> str:
    """``lmablate evaluate <dataset> <variant> --tokens DIR --raw DIR --checkpoints DIR
    --metrics FILE --examples FILE [--replicate N]``. Returns the stage's summary line: seeds
    and the range of test losses (nats/char), and of answer loss (nats per answer character)
    and exact match on arithmetic."""
    cfg.check_variant(args.variant)
    runs = run(cfg, args.dataset, args.variant, args.tokens, args.raw, args.checkpoints,
               args.metrics, args.examples, make_tracker(cfg.tracking),
               replicate=getattr(args, "replicate", 0))["runs"].values()
    line = (f"{len(runs)} seeds; test_loss {min(r['test_loss'] for r in runs):.4f} to "
            f"{max(r['test_loss'] for r in runs):.4f}")
    if all("answer_loss" in r for r in runs):
        line += (f", answer loss {min(r['answer_loss'] for r in runs):.4f} to "
                 f"{max(r['answer_loss'] for r in runs):.4f}")
    if all("exact_match" in r for r in runs):
        line += (f", exact match {min(r['exact_match'] for r in runs):.3f} to "
                 f"{max(r['exact_match'] for r in runs):.3f}")
    return line
