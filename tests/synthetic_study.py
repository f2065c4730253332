"""A synthetic study for the tests of lmablate.analysis and the report stage: a runs/ tree whose
truth is known by construction, and helpers to read the report it gives.

The fixtures ``study_root`` (this runs/ tree) and ``built`` (its report) are in conftest.py.

Fixture (2 datasets x 3 variants x 3 seeds): every seed has its own offset shared by all
variants (so pairing by seed matters), then
  * gelu    = baseline - 0.10 test loss (+ tiny noise) on both datasets -> "better";
              exact match +0.20, char accuracy +0.10 on arithmetic        -> "better";
  * rmsnorm = baseline (+ tiny noise) on shakespeare                      -> "no significant difference";
              baseline + 0.15 test loss on arithmetic                      -> "worse";
              exact match = baseline (+ noise)                             -> "no significant difference";
              char accuracy - 0.10                                         -> "worse".
On arithmetic the headline is the answer loss, whose verdicts differ from the test loss's:
  * gelu    = baseline (+ tiny noise) answer loss                         -> "no significant difference";
  * rmsnorm = baseline - 0.20 answer loss                                 -> "better".
Exact match by operand length (training digits 2; 3 and 4 from the length split): gelu +0.30 at
3 and 4 digits -> "better" there; rmsnorm "n/a (learned table ...)" at 4 digits.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from lmablate.config import params
from lmablate.data.problem_sets import generate_arithmetic

VARIANTS = ("baseline", "gelu", "rmsnorm")
DATASETS = ("shakespeare", "arithmetic")
OPS = ("add", "sub", "mul", "div")
# Per-seed offsets shared by all variants, and small per-variant noise (deterministic).
SEED_OFFSET = [0.00, 0.05, -0.03, 0.02]
NOISE = {"baseline": [0.0, 0.0, 0.0, 0.0], "gelu": [0.004, -0.003, 0.001, 0.002],
         "rmsnorm": [0.004, -0.005, 0.002, -0.001]}
BASE_LOSS = {"shakespeare": 1.60, "arithmetic": 0.90}
LOSS_SHIFT = {("shakespeare", "gelu"): -0.10, ("shakespeare", "rmsnorm"): 0.0,
              ("arithmetic", "gelu"): -0.10, ("arithmetic", "rmsnorm"): 0.15}
EM_SHIFT = {"baseline": 0.0, "gelu": 0.20, "rmsnorm": 0.0}
CA_SHIFT = {"baseline": 0.0, "gelu": 0.10, "rmsnorm": -0.10}
PARAMS = {"baseline": 100_000, "gelu": 100_000, "rmsnorm": 99_800}
ANSWER_SHIFT = {"baseline": 0.0, "gelu": 0.0, "rmsnorm": -0.20}
TRAIN_DIGITS = 2  # most operand digits in training: 1-2 from the test split, 3-4 from "length"
EM_BY_DIGITS = {1: 0.90, 2: 0.60, 3: 0.20, 4: 0.05}
EM_LENGTH_SHIFT = {"baseline": 0.0, "gelu": 0.30, "rmsnorm": 0.0}  # at 3 and 4 digits
NA_4 = "n/a (learned table of 48 positions)"  # rmsnorm at 4 digits

EXPECTED_VERDICTS = {
    ("shakespeare", "test_loss", "gelu"): "better",
    ("shakespeare", "test_loss", "rmsnorm"): "no significant difference",
    ("arithmetic", "test_loss", "gelu"): "better",
    ("arithmetic", "test_loss", "rmsnorm"): "worse",
    ("arithmetic", "answer_loss", "gelu"): "no significant difference",
    ("arithmetic", "answer_loss", "rmsnorm"): "better",
    ("arithmetic", "exact_match", "gelu"): "better",
    ("arithmetic", "exact_match", "rmsnorm"): "no significant difference",
    ("arithmetic", "char_accuracy", "gelu"): "better",
    ("arithmetic", "char_accuracy", "rmsnorm"): "worse",
}


def make_cfg(seeds=(0, 1, 2), variants=VARIANTS, replicates=1):
    raw = {
        "study": {"seeds": list(seeds), "variants": list(variants), "replicates": replicates,
                  "replicate_stages": list(range(1, replicates))},
        "datasets": {
            "shakespeare": {"kind": "text", "source": "data/shakespeare.txt",
                            "split": {"val": 0.1, "test": 0.1}},
            "arithmetic": {"kind": "arithmetic", "n_train": 2000, "n_test": 200},
        },
        "model": {"n_layers": 2, "n_heads": 4, "d_model": 64, "context_length": 48},
        "variants": {"baseline": {}, "gelu": {"ffn": "gelu"}, "rmsnorm": {"norm": "rmsnorm"}},
        "train": {"budget_flops": {"shakespeare": 2.4e11, "arithmetic": 1.2e11},
                  "batch_size": 12, "eval_interval": 50},
        "tune": {"rungs": [[6, 0.2], [1, 1.0]], "trials_per_batch": 3,
                 "d_model_choices": [32, 64]},
    }
    return params.parse(raw)


def true_test_loss(ds, var, i, shift=0.0):
    return (BASE_LOSS[ds] + SEED_OFFSET[i] + LOSS_SHIFT.get((ds, var), 0.0) + NOISE[var][i]
            + shift)


def true_answer_loss(var, i, shift=0.0):
    """nats per answer character, arithmetic only."""
    return 0.60 + SEED_OFFSET[i] + ANSWER_SHIFT[var] + NOISE[var][i] + shift


def true_length_em(var, i, digits):
    shift = EM_LENGTH_SHIFT[var] if digits > TRAIN_DIGITS else 0.0
    return EM_BY_DIGITS[digits] + shift + SEED_OFFSET[i] + NOISE[var][i]


def by_operand_digits(var, i):
    """A seed's ``by_operand_digits`` as the evaluate stage writes it."""
    out = {}
    for d in EM_BY_DIGITS:
        if var == "rmsnorm" and d == 4:
            out[str(d)] = NA_4
            continue
        em = true_length_em(var, i, d)
        out[str(d)] = {"exact_match": em, "char_accuracy": min(em + 0.05, 1.0),
                       "answer_loss": 1.0 - em, "n": 40,
                       "split": "test" if d <= TRAIN_DIGITS else "length"}
    return out


def learn_step(v_idx: int, i: int, replicate: int) -> int:
    """The step at which seed index ``i`` of variant ``v_idx`` reaches exact match 0.5 in a
    probed synthetic history: later for later variants, and later still in replicate 1 for
    the last variant."""
    return 100 + 50 * v_idx + 25 * (i % 2) + (50 if replicate and v_idx == 2 else 0)


def write_runs(root: Path, seeds=(0, 1, 2), variants=VARIANTS, grad_for=("shakespeare",),
               replicate: int = 0, shift=None, probe: bool = False):
    """Write runs/<ds>/<var>/{metrics.json, history.csv, trials.csv, ...} like the stages do;
    replicate r > 0's under runs/<ds>/<var>/replicate_<r>/, each loss moved by ``shift``
    ((dataset, variant) -> nats). ``probe``: arithmetic histories carry the answer probe's
    ``val_exact_match``, reaching 0.5 at :func:`learn_step`."""
    shift = shift or {}
    for ds in DATASETS:
        for v_idx, var in enumerate(variants):
            run_dir = root / ds / var / (f"replicate_{replicate}" if replicate else "")
            run_dir.mkdir(parents=True)
            runs, hist, grads, samples, preds = {}, [], [], {}, {}
            for i, seed in enumerate(seeds):
                test = true_test_loss(ds, var, i, shift.get((ds, var), 0.0))
                run = {
                    "seed": seed, "n_params": PARAMS[var] + 5_000,
                    "n_params_non_embedding": PARAMS[var], "flops_per_token": 6 * PARAMS[var],
                    "lr": 0.002 + 0.001 * v_idx, "d_model": 64, "steps": 1000 + v_idx,
                    "tokens": (1000 + v_idx) * 12 * 48,
                    "train_flops": (1000 + v_idx) * 12 * 48 * 6 * PARAMS[var],
                    "val_loss": test - 0.01,
                    "test_loss": test, "perplexity": math.exp(test),
                    "bits_per_char": test / math.log(2), "train_seconds": 10.0 + i,
                    "tokens_per_second": 40_000.0 + 1000 * v_idx, "mlflow_run_id": f"r{i}{var}",
                }
                if ds == "arithmetic":
                    em = 0.30 + SEED_OFFSET[i] + EM_SHIFT[var] + NOISE[var][i]
                    ca = 0.70 + SEED_OFFSET[i] + CA_SHIFT[var] + NOISE[var][i]
                    run.update(char_accuracy=ca, exact_match=em, per_op={
                        op: {"char_accuracy": ca - 0.05 * k, "exact_match": max(em - 0.08 * k, 0),
                             "answer_loss": true_answer_loss(var, i, shift.get((ds, var), 0.0))
                             + 0.1 * k, "n": 50}
                        for k, op in enumerate(OPS)},
                        answer_loss=true_answer_loss(var, i, shift.get((ds, var), 0.0)),
                        by_operand_digits=by_operand_digits(var, i), by_answer_digits={
                            str(d): {"answer_loss": true_answer_loss(var, i) + 0.1 * d,
                                     "exact_match": em / d, "char_accuracy": ca, "n": 10 * d}
                            for d in (1, 2, 3)})
                    preds[f"seed_{seed}"] = [
                        {"prompt": "$(0000000782+0000000021)=", "target": "3080000000$",
                         "prediction": "3080000000$"},
                        {"prompt": "$(0000000012*0000000003)=", "target": "6300000000$",
                         "prediction": "6310000000$"},
                    ]
                else:
                    run.update(char_accuracy=None, exact_match=None)
                    samples[f"seed_{seed}"] = [f"ROMEO ({var}, seed {seed}):\nWhat light ``` "
                                               "through yonder window breaks?", "second"]
                runs[f"seed_{seed}"] = run
                for step in range(0, 301, 50):
                    val = test + (4.2 - test) * math.exp(-step / 60)
                    hist.append({"seed": seed, "step": step, "tokens": step * 12 * 48,
                                 "train_loss": val - 0.02, "val_loss": val, "lr": 0.002,
                                 "elapsed_seconds": step * 0.03})
                    if probe and ds == "arithmetic":
                        hist[-1]["val_exact_match"] = min(
                            1.0, 0.5 * step / learn_step(v_idx, i, replicate))
                for g, group in enumerate(["embed", "blocks.0.attn", "blocks.0.mlp",
                                           "blocks.1.attn", "blocks.1.mlp", "head"]):
                    grads.append({"seed": seed, "group": group,
                                  "frac_near_zero": 0.02 * g + 0.1 * v_idx,
                                  "grad_norm": 0.5 + 0.1 * g})
            doc = {"dataset": ds, "variant": var, "runs": runs}
            (run_dir / "metrics.json").write_text(json.dumps(doc))
            pd.DataFrame(hist).to_csv(run_dir / "history.csv", index=False)
            trials, best = tuning_outputs(ds, var, v_idx)
            trials.to_csv(run_dir / "trials.csv", index=False)
            (run_dir / "best.json").write_text(json.dumps(best))
            if ds in grad_for:
                pd.DataFrame(grads).to_csv(run_dir / "grad_stats.csv", index=False)
            if samples:
                (run_dir / "examples.json").write_text(json.dumps(samples))
            if preds:
                (run_dir / "examples.json").write_text(json.dumps(preds))


# The tuning (make_cfg: rungs [[6, 0.2], [1, 1.0]], 3 trials a batch): the shared design is 3
# learning rates at d_model 32, then 3 TPE trials, then the best at the full budget, whose lr and
# width are the final runs' (metrics.json). rmsnorm's largest design lr diverged.
DESIGN_LRS = (1.5e-3, 7e-3, 3.2e-2)
TOKENS_PER_PARAMETER = {32: 24.0, 64: 6.5}


def design_loss(ds: str, v_idx: int, lr: float) -> float:
    """The validation loss of a first-rung trial at ``lr`` (nats/char)."""
    return BASE_LOSS[ds] + 0.3 + 0.4 * abs(math.log10(lr / 7e-3)) + 0.01 * v_idx


def tuning_outputs(ds: str, var: str, v_idx: int) -> tuple[pd.DataFrame, dict]:
    """``trials.csv`` and ``best.json`` of a study, as the tune stage writes them."""
    lr = 0.002 + 0.001 * v_idx  # the final runs' lr (metrics.json), at d_model 64
    rows = [(0, 0, lr_i, 32, design_loss(ds, v_idx, lr_i)) for lr_i in DESIGN_LRS]
    rows += [(0, 1, lr, 64, min(r[4] for r in rows) - 0.02), (0, 1, 1e-2, 64, 2.9),
             (0, 1, 2e-3, 32, 2.8), (1, 2, lr, 64, BASE_LOSS[ds] + 0.01 * v_idx)]
    trials = pd.DataFrame([
        {"number": slot, "rung": rung, "batch": batch, "budget_fraction": (0.2, 1.0)[rung],
         "state": "COMPLETE", "value": value, "params_lr": lr_i, "params_d_model": d,
         "tokens_per_parameter": TOKENS_PER_PARAMETER[d], "steps": 100, "last_step": 100,
         "flops": 1e9, "fail_reason": ""}
        for slot, (rung, batch, lr_i, d, value) in enumerate(rows)])
    if var == "rmsnorm":
        trials.loc[2, ["state", "value", "fail_reason"]] = ["FAIL", np.nan, "loss is nan"]
    best = {"lr": lr, "d_model": 64, "val_loss": rows[-1][4], "slot": 6, "rung": 1,
            "budget_fraction": 1.0, "full_budget": True, "on_edge": [],
            "lr_range": [1e-3, 1e-1 if var != "gelu" else 1.0], "d_model_choices": [32, 64],
            "extended": ["lr up to 1"] if var == "gelu" else [], "rungs": [[6, 0.2], [1, 1.0]],
            "n_trials": 7, "n_complete": 7 - (var == "rmsnorm"),
            "n_diverged": int(var == "rmsnorm"), "steps": 1000, "flops": 1e10,
            "sampler_seed": 0, "study_name": f"{ds}-{var}-0123456789"}
    return trials, best


ENV = {"hardware": "2-core test CPU", "torch": "9.9.9-test", "wall_seconds": {"train": 123.4}}


# Replicate 1 of the synthetic study (write_runs(..., replicate=1)): its seeds are replicate 0's
# + 100,000, and on shakespeare rmsnorm is 0.10 lower than in replicate 0, so its verdict there
# turns from "no significant difference" to "better": the one verdict that does not replicate.
REPLICATE_1_SHIFT = {("shakespeare", "rmsnorm"): -0.10}
REPLICATE_1_SEEDS = (100_000, 100_001, 100_002)


ARITHMETIC_CORPUS = generate_arithmetic(60, 0, seed=3)[0]  # seed 000's format, 36 characters


def write_tokens(root: Path, cfg, strip_newlines: bool = False) -> Path:
    """A tiny tokenized copy of every dataset (``lmablate tokenize``) under ``root``; the
    arithmetic one of :data:`ARITHMETIC_CORPUS`, with ``line_length`` in its meta.json."""
    from lmablate.stages import tokenize
    for ds in cfg.datasets:
        raw = root / "raw" / ds
        raw.mkdir(parents=True)
        arithmetic = cfg.dataset(ds).kind == "arithmetic"
        (raw / "corpus.txt").write_text("".join(line + "\n" for line in ARITHMETIC_CORPUS)
                                        if arithmetic else
                                        "To be, or not to be: that is the question.\n" * 30)
        if arithmetic:
            (raw / "test.txt").write_text("$(0000000782+0000000021)=3080000000$\n" * 5)
        ds_cfg = dataclasses.replace(cfg.dataset(ds), strip_newlines=strip_newlines)
        meta = tokenize.run(ds_cfg, raw, root / "tokens" / ds)
        if arithmetic:  # as the tokenize stage records it: characters per problem
            meta["line_length"] = len(ARITHMETIC_CORPUS[0])
            (root / "tokens" / ds / "meta.json").write_text(json.dumps(meta))
    return root / "tokens"


def train_part(tokens: Path, newline: bool) -> list[str]:
    """The problems of ARITHMETIC_CORPUS in the arithmetic train split under ``tokens``."""
    chars = json.loads((tokens / "arithmetic" / "meta.json").read_text())["tokens"]["train"]
    return ARITHMETIC_CORPUS[:chars // (len(ARITHMETIC_CORPUS[0]) + newline)]


def random_ablation(rng, n_seeds, variants=("baseline", "v1", "v2"), datasets=("d1", "d2")):
    """An ablation-like table of random test losses and accuracies."""
    rows = []
    for ds in datasets:
        for var in variants:
            for seed in range(n_seeds):
                rows.append({"dataset": ds, "variant": var, "seed": seed,
                             "test_loss": rng.normal(1.5, 0.1),
                             "char_accuracy": rng.uniform(0, 1)})
    return pd.DataFrame(rows)


def dataset_section(md: str, dataset: str) -> str:
    return md.split(f"## {dataset}\n", 1)[1].split("\n## ", 1)[0]


def lr_section_of(md: str, dataset: str) -> str:
    """The learning-rate section of ``dataset`` in ``md``."""
    part = md.split(f"## {dataset}\n", 1)[1].split("\n## ", 1)[0]
    return part.split("### How each variant responds to the learning rate\n", 1)[1].split(
        "\n### ", 1)[0]
