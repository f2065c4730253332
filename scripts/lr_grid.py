"""Brute force for the tuner: train variants at the dataset's full budget on a grid of learning
rates x widths x seeds and print each run's test loss, as the evaluate stage scores it.

The tuner's answer for a variant is right when this grid agrees with it: its lr within a factor
of 2 of the grid's best and its loss within the spread of the grid's seeds (4 seeds or more:
one run varies by ~0.01 nats/char, and the best of a few 2-seed means is biased low). Run from a
workspace where ``dvc repro tokenize`` (or the whole study) has run::

    python scripts/lr_grid.py shakespeare baseline rmsnorm --lr 0.007 0.01 0.014 0.02 0.028 \\
        --d-model 24 --seeds 0 1 2 3 [--csv grid.csv]

Prints one row per variant x width x lr: the test loss (nats/char) of each seed and their mean;
``--csv`` writes every run. Seeds run one after another on this process's threads.

On an arithmetic dataset each run also scores the answer probe at every evaluation (as the
train stage does) and the test problems at the end, as the evaluate stage does: a row adds
``answer_loss`` (nats per answer character), ``exact_match``, and ``tokens_to_learn``, the
training tokens at the first evaluation whose probe exact match reached ``--learned`` (0.5;
empty when never). ``--set key=value`` overrides a train param (e.g. ``budget_flops=4.5e11``).
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import dataclasses

from lmablate.config.params import load
from lmablate.data.token_data import TokenData
from lmablate.data.tokenizer import load_tokenizer
from lmablate.evaluate.answer_probe import answer_probe
from lmablate.evaluate.metrics import (answer_nats, arithmetic_predictions, arithmetic_scores,
                                       split_loss)
from lmablate.model.variants import preflight, resolve_model_config
from lmablate.train.budget import run_steps
from lmablate.train.device import resolve_device
from lmablate.train.training import train_model


def _tokens_to_learn(history: list[dict], tokens_per_step: int, learned: float) -> int | None:
    """Training tokens at the first evaluation whose probe exact match reached ``learned``."""
    for row in history:
        if row.get("val_exact_match", -1.0) >= learned:
            return int(row["step"]) * tokens_per_step
    return None


def grid(params: Path, dataset: str, variants: list[str], lrs: list[float],
         widths: list[int], seeds: list[int], learned: float = 0.5,
         overrides: dict[str, float] | None = None) -> list[dict]:
    """One row per run: ``variant``, ``d_model``, ``lr``, ``seed``, ``steps`` and
    ``test_loss`` (nats/char over the evaluate stage's test windows).

    Raises:
        ConfigError: unknown dataset or variant, or a width the budget cannot train.
    """
    cfg = load(params).for_dataset(dataset)  # its own context length and batch size
    data = TokenData.load(Path("data/tokens") / dataset)
    if overrides:
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **overrides))
    train_cfg = cfg.train.for_dataset(dataset)
    device = resolve_device(cfg.runtime.device)
    tokens_dir = Path("data/tokens") / dataset
    probe = answer_probe(tokens_dir, cfg.evaluate.batch_size, device)
    if probe is not None:
        tok = load_tokenizer(tokens_dir)
        problems = (Path("data/raw") / dataset / "test.txt").read_text().split("\n")
        problems = [p for p in problems if p][:cfg.evaluate.max_problems]
    models = {}
    for variant in variants:  # every model checked before the first step
        cfg.check_variant(variant)
        for d in widths:
            model_cfg = resolve_model_config(cfg, variant, data.vocab_size, d)
            preflight(model_cfg, f"variant {variant!r}")
            models[variant, d] = (model_cfg, run_steps(cfg, dataset, model_cfg))
    rows = []
    for (variant, d), (model_cfg, steps) in models.items():
        for lr in lrs:
            for seed in seeds:
                result = train_model(model_cfg, train_cfg, data, seed=seed, lr=lr, steps=steps,
                                     device=device, desc=f"{variant} d{d} lr{lr:g} s{seed}",
                                     probe=probe)
                loss = split_loss(result.model, data.test, cfg.evaluate.batch_size,
                                  cfg.evaluate.max_batches, device, stride=data.stride)
                row = {"variant": variant, "d_model": d, "lr": lr, "seed": seed,
                       "steps": steps, "test_loss": loss}
                if probe is not None:
                    bs = cfg.evaluate.batch_size
                    preds = arithmetic_predictions(result.model, tok, problems, bs, device,
                                                   show_progress=False)
                    scores = arithmetic_scores(problems, preds,
                                               answer_nats(result.model, tok, problems, bs,
                                                           device))
                    row.update(answer_loss=scores["answer_loss"],
                               exact_match=scores["exact_match"],
                               tokens_to_learn=_tokens_to_learn(
                                   result.history, train_cfg.batch_size
                                   * model_cfg.context_length, learned))
                rows.append(row)
                print(f"{variant:>10} d_model {d:>3} lr {lr:<8.3g} seed {seed}: "
                      + ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                                  for k, v in row.items() if k not in
                                  ("variant", "d_model", "lr", "seed")),
                      file=sys.stderr, flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dataset")
    ap.add_argument("variants", nargs="+")
    ap.add_argument("--lr", type=float, nargs="+", required=True)
    ap.add_argument("--d-model", type=int, nargs="+", required=True)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    ap.add_argument("--csv", type=Path)
    ap.add_argument("--learned", type=float, default=0.5)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a train param, e.g. batch_size=8 (a number)")
    args = ap.parse_args(argv)
    overrides = {}
    for item in args.set:
        key, _, value = item.partition("=")
        overrides[key] = int(value) if value.isdigit() else float(value)
    rows = grid(args.params, args.dataset, args.variants, args.lr, args.d_model, args.seeds,
                args.learned, overrides)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    print("variant,d_model,lr," + ",".join(f"seed_{s}" for s in args.seeds) + ",mean")
    for key in dict.fromkeys((r["variant"], r["d_model"], r["lr"]) for r in rows):
        losses = [r["test_loss"] for r in rows if (r["variant"], r["d_model"], r["lr"]) == key]
        print(f"{key[0]},{key[1]},{key[2]:g}," + ",".join(f"{x:.4f}" for x in losses)
              + f",{sum(losses) / len(losses):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
