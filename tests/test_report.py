"""Tests of lmablate.analysis and the report stage on a synthetic runs/ tree whose truth is
known by construction.

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

import csv
import dataclasses
import itertools
import json
import math
import re
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from statsmodels.stats.multitest import multipletests

from lmablate import params
from lmablate.analysis import arithmetic as arith
from lmablate.analysis import (collect, curves, families, headline, model_figures, problems,
                               reference_points, sensitivity, statistics)
from lmablate.analysis import extrapolation as ex
from lmablate.analysis.families import family_palette, variant_family
from lmablate.arithmetic import generate_arithmetic, split_problem
from lmablate.references import answer_position_floor
from lmablate.stages import report
from lmablate.tokenizer import load_tokenizer
from lmablate.validation import DataError

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


def make_cfg(seeds=(0, 1, 2), variants=VARIANTS):
    raw = {
        "study": {"seeds": list(seeds), "variants": list(variants)},
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


def _test_loss(ds, var, i):
    return BASE_LOSS[ds] + SEED_OFFSET[i] + LOSS_SHIFT.get((ds, var), 0.0) + NOISE[var][i]


def _answer_loss(var, i):
    """nats per answer character, arithmetic only."""
    return 0.60 + SEED_OFFSET[i] + ANSWER_SHIFT[var] + NOISE[var][i]


def _length_em(var, i, digits):
    shift = EM_LENGTH_SHIFT[var] if digits > TRAIN_DIGITS else 0.0
    return EM_BY_DIGITS[digits] + shift + SEED_OFFSET[i] + NOISE[var][i]


def by_operand_digits(var, i):
    """A seed's ``by_operand_digits`` as the evaluate stage writes it."""
    out = {}
    for d in EM_BY_DIGITS:
        if var == "rmsnorm" and d == 4:
            out[str(d)] = NA_4
            continue
        em = _length_em(var, i, d)
        out[str(d)] = {"exact_match": em, "char_accuracy": min(em + 0.05, 1.0),
                       "answer_loss": 1.0 - em, "n": 40,
                       "split": "test" if d <= TRAIN_DIGITS else "length"}
    return out


def write_runs(root: Path, seeds=(0, 1, 2), variants=VARIANTS, grad_for=("shakespeare",)):
    """Write runs/<ds>/<var>/{metrics.json, history.csv, trials.csv, ...} like the stages do."""
    for ds in DATASETS:
        for v_idx, var in enumerate(variants):
            run_dir = root / ds / var
            run_dir.mkdir(parents=True)
            runs, hist, grads, samples, preds = {}, [], [], {}, {}
            for i, seed in enumerate(seeds):
                test = _test_loss(ds, var, i)
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
                             "answer_loss": _answer_loss(var, i) + 0.1 * k, "n": 50}
                        for k, op in enumerate(OPS)}, answer_loss=_answer_loss(var, i),
                        by_operand_digits=by_operand_digits(var, i), by_answer_digits={
                            str(d): {"answer_loss": _answer_loss(var, i) + 0.1 * d,
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


@pytest.fixture(scope="module")
def study_root(tmp_path_factory):
    """runs/ of the configured study plus a stale variant "old" that is not part of it."""
    root = tmp_path_factory.mktemp("study")
    write_runs(root / "runs")
    # a stale variant directory that is not part of the configured study
    write_runs(root / "stale", variants=("baseline",))
    (root / "stale" / "shakespeare" / "baseline").rename(root / "runs" / "shakespeare" / "old")
    doc = json.loads((root / "runs/shakespeare/old/metrics.json").read_text())
    doc["variant"] = "old"
    (root / "runs/shakespeare/old/metrics.json").write_text(json.dumps(doc))
    write_replicate(root / "runs" / "shakespeare" / "baseline")
    return root


REPLICATE_SHIFT = (0.01, 0.02, 0.06)  # test-loss change per seed of the re-tuned baseline


def write_replicate(variant_dir: Path) -> None:
    """``replicate_1/metrics.json`` beside a variant's runs, as ``lmablate evaluate
    --replicate 1`` writes it: the same seeds, another lr and width, shifted test losses."""
    doc = json.loads((variant_dir / "metrics.json").read_text())
    for shift, run in zip(REPLICATE_SHIFT, doc["runs"].values()):
        run.update(lr=0.004, d_model=32, test_loss=run["test_loss"] + shift)
    doc["replicate"] = 1
    (variant_dir / "replicate_1").mkdir()
    (variant_dir / "replicate_1" / "metrics.json").write_text(json.dumps(doc))


@pytest.fixture(scope="module")
def built(study_root):
    root = study_root
    cfg = make_cfg()
    out = report.build_report(cfg, root / "runs", root / "reports", environment=ENV)
    return cfg, root / "reports", out


def test_ablation_csv_schema_and_one_row_per_run(built):
    _, out_dir, out = built
    df = pd.read_csv(out["ablation"])
    assert list(df.columns) == collect.ABLATION_COLUMNS == [
        "dataset", "variant", "seed", "n_params", "n_params_non_embedding", "flops_per_token",
        "lr", "d_model", "steps", "tokens", "train_flops", "val_loss", "test_loss",
        "answer_loss", "perplexity", "bits_per_char", "char_accuracy", "exact_match",
        "train_seconds", "tokens_per_second"]
    assert len(df) == 2 * 3 * 3
    assert not df.duplicated(["dataset", "variant", "seed"]).any()
    assert set(df["variant"]) == set(VARIANTS)  # the stale "old" variant is ignored
    text = df["dataset"] == "shakespeare"
    assert df.loc[text, ["exact_match", "char_accuracy", "answer_loss"]].isna().all().all()
    assert df.loc[~text, ["exact_match", "answer_loss"]].notna().all().all()
    # config order: datasets as configured, baseline first
    assert list(pd.unique(df["dataset"])) == ["shakespeare", "arithmetic"]
    assert list(pd.unique(df["variant"])) == list(VARIANTS)
    assert (out_dir / "ablation.csv").read_text().splitlines()[1].split(",")[3] == "105000"


def test_summary_csv_schema_and_interval(built):
    _, _, out = built
    s = pd.read_csv(out["summary"])
    assert list(s.columns) == ["dataset", "variant", "metric", "n", "mean", "std",
                               "ci95_low", "ci95_high"]
    assert not ((s["dataset"] == "shakespeare") & (s["metric"] == "exact_match")).any()
    cell = s[(s["dataset"] == "arithmetic") & (s["variant"] == "gelu")
             & (s["metric"] == "test_loss")].iloc[0]
    x = np.array([_test_loss("arithmetic", "gelu", i) for i in range(3)])
    low, high = stats.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=stats.sem(x))
    assert cell["n"] == 3
    assert cell["mean"] == pytest.approx(x.mean(), abs=1e-12)
    assert cell["std"] == pytest.approx(x.std(ddof=1), abs=1e-12)
    assert cell["ci95_low"] == pytest.approx(low, abs=1e-12)
    assert cell["ci95_high"] == pytest.approx(high, abs=1e-12)


def test_summary_single_seed_has_no_interval():
    df = pd.DataFrame({"dataset": ["d"], "variant": ["baseline"], "seed": [0],
                       "test_loss": [1.5]})
    s = statistics.summarise(df)
    assert s.loc[0, "n"] == 1 and s.loc[0, "mean"] == 1.5
    assert np.isnan(s.loc[0, "std"]) and np.isnan(s.loc[0, "ci95_low"])


def test_comparisons_schema_and_verdicts(built):
    _, _, out = built
    c = pd.read_csv(out["comparisons"])
    assert list(c.columns) == statistics.COMPARISON_COLUMNS
    got = {(r.dataset, r.metric, r.variant): r.verdict for r in c.itertuples()}
    assert got == EXPECTED_VERDICTS
    assert (c["baseline"] == "baseline").all()
    assert c.loc[c["metric"] == "test_loss", "higher_is_better"].eq(False).all()
    assert c.loc[c["metric"] == "exact_match", "higher_is_better"].all()


def test_comparison_numbers_match_scipy(built):
    _, _, out = built
    c = pd.read_csv(out["comparisons"])
    row = c[(c["dataset"] == "arithmetic") & (c["metric"] == "test_loss")
            & (c["variant"] == "rmsnorm")].iloc[0]
    base = np.array([_test_loss("arithmetic", "baseline", i) for i in range(3)])
    var = np.array([_test_loss("arithmetic", "rmsnorm", i) for i in range(3)])
    d = var - base
    res = stats.ttest_rel(var, base)
    low, high = stats.t.interval(0.95, 2, loc=d.mean(), scale=stats.sem(d))
    assert row["n_pairs"] == 3
    assert row["mean_diff"] == pytest.approx(0.15 + d.mean() - 0.15, abs=1e-12)
    assert row["mean_diff"] == pytest.approx(0.15, abs=0.01)
    assert row["p_value"] == pytest.approx(res.pvalue, rel=1e-9)
    assert row["t_stat"] == pytest.approx(res.statistic, rel=1e-9)
    assert (row["ci95_low"], row["ci95_high"]) == pytest.approx((low, high), abs=1e-12)


def test_holm_correction_within_dataset_and_metric(built):
    _, _, out = built
    c = pd.read_csv(out["comparisons"])
    for _, fam in c.groupby(["dataset", "metric"]):
        p = fam["p_value"].to_numpy()
        m = len(p)
        idx = np.argsort(p)
        # Holm step-down, written out: p_(i) * (m - i), running max, capped at 1
        adj_sorted = np.minimum(np.maximum.accumulate(p[idx] * (m - np.arange(m))), 1.0)
        adj = np.empty(m)
        adj[idx] = adj_sorted
        np.testing.assert_allclose(fam["p_holm"].to_numpy(), adj, rtol=1e-12)
        assert (fam["reject_holm"].to_numpy() == (adj < 0.05)).all()
    # the correction matters: in each 2-member family the smallest p is doubled
    fam = c[(c["dataset"] == "shakespeare") & (c["metric"] == "test_loss")]
    assert fam["p_holm"].min() == pytest.approx(2 * fam["p_value"].min())


def test_too_few_seeds(tmp_path):
    write_runs(tmp_path / "runs", seeds=(0, 1))
    cfg = make_cfg(seeds=(0, 1))
    out = report.build_report(cfg, tmp_path / "runs", tmp_path / "reports")
    c = pd.read_csv(out["comparisons"])
    assert len(c) == len(EXPECTED_VERDICTS)
    assert (c["verdict"] == "too few seeds").all()
    assert c["p_value"].isna().all() and c["p_holm"].isna().all() and not c["reject_holm"].any()
    assert c["mean_diff"].notna().all()  # still described
    md = out["report"].read_text()
    assert "Too few seeds to conclude" in md
    assert "Environment not recorded" in md


def test_missing_runs_are_reported_and_no_runs_raise(tmp_path):
    write_runs(tmp_path / "runs", seeds=(0, 1, 2))
    cfg = make_cfg(seeds=(0, 1, 2, 3))
    out = report.build_report(cfg, tmp_path / "runs", tmp_path / "reports")
    md = out["report"].read_text()
    assert "6 configured run(s) have no results" in md  # seed 3 of 2 datasets x 3 variants
    with pytest.raises(FileNotFoundError, match="no results"):
        report.build_report(cfg, tmp_path / "empty", tmp_path / "r2")


# no params_vs_loss_*.png: the variants' parameter counts (PARAMS) are 0.2% apart
EXPECTED_FIGURES = [
    "val_loss_curves_shakespeare.png", "test_loss_shakespeare.png", "forest_shakespeare.png",
    "tuning_shakespeare.png", "grad_flow_shakespeare.png",
    "val_loss_curves_arithmetic.png", "test_loss_arithmetic.png", "forest_arithmetic.png",
    "exact_match_by_op.png", "char_accuracy_by_op.png", "tuning_arithmetic.png",
    "length_generalisation_arithmetic.png",
]


def test_every_figure_is_a_png(built):
    _, out_dir, out = built
    names = [p.name for p in out["figures"]]
    assert sorted(names) == sorted(EXPECTED_FIGURES)
    assert "grad_flow_arithmetic.png" not in names  # no grad_stats.csv for arithmetic
    on_disk = sorted(p.name for p in (out_dir / "figures").iterdir())
    assert on_disk == sorted(EXPECTED_FIGURES)  # and no temp files left behind
    for p in out["figures"]:
        data = p.read_bytes()
        assert len(data) > 5000 and data[:8] == b"\x89PNG\r\n\x1a\n", p


def test_a_figure_not_drawn_leaves_its_reason_in_the_figures_section(built):
    _, _, out = built
    md = out["report"].read_text()
    for ds in ("shakespeare", "arithmetic"):
        section = md.split(f"## {ds}\n")[1].split("### Figures")[1].split("\n## ")[0]
        assert (f"{ds}: non-embedding parameters vs test loss not drawn: the parameter counts "
                "span 99,800 to 100,000 (0.2% apart)") in section
    assert "params_vs_loss" not in md


def test_forest_plots_are_in_each_datasets_headline_loss_with_the_tuning_luck_band(built):
    _, _, out = built
    md = out["report"].read_text()
    # shakespeare's baseline was tuned again (write_replicate): a band; arithmetic's was not
    assert ("**shakespeare: test loss difference to baseline, the loss of this dataset's "
            "verdicts (paired by seed: raw 95% t-interval and Holm-adjusted interval; shaded "
            "band: tuning luck") in md
    assert ("**arithmetic: answer loss difference to baseline, the loss of this dataset's "
            "verdicts (paired by seed: raw 95% t-interval and Holm-adjusted interval)**") in md


def test_no_exact_match_figure_when_no_variant_solved_any_problem(tmp_path):
    write_runs(tmp_path / "runs")
    for path in (tmp_path / "runs" / "arithmetic").glob("*/metrics.json"):
        doc = json.loads(path.read_text())
        for run in doc["runs"].values():
            for values in run["per_op"].values():
                values["exact_match"] = 0.0
        path.write_text(json.dumps(doc))
    out = report.build_report(make_cfg(), tmp_path / "runs", tmp_path / "reports")
    names = {p.name for p in out["figures"]}
    assert "exact_match_by_op.png" not in names and "char_accuracy_by_op.png" in names
    assert not (tmp_path / "reports" / "figures" / "exact_match_by_op.png").exists()
    md = out["report"].read_text()
    figures_section = md.split("## arithmetic\n")[1].split("### Figures")[1]
    assert ("arithmetic: exact match by operation not drawn: no variant solved any problem "
            "(exact match 0 on every operation, variant and seed).") in figures_section


def test_report_markdown(built):
    cfg, out_dir, out = built
    md = out["report"].read_text()
    assert out["report"] == out_dir / "report.md"
    # every figure written is linked relatively
    for p in out["figures"]:
        assert f"](figures/{p.name})" in md
    # tables
    assert "| variant | seeds | test loss (nats/char) |" in md
    assert "Δ (variant − baseline)" in md and "p (Holm)" in md
    assert "**▲ better**" in md and "**▼ worse**" in md
    assert "How to read this report" in md
    # the answer first: findings, then how to read, the limits, the methods (with the compute)
    heads = [md.index(h) for h in ("## Findings", "How to read this report",
                                   "## What this study can and cannot say", "## Methodology",
                                   "Compared at equal training compute", "## shakespeare")]
    assert heads == sorted(heads)
    findings = md.split("## Findings\n", 1)[1].split("**How to read", 1)[0]
    comparisons = pd.read_csv(out["comparisons"])
    for r in comparisons[comparisons["metric"] == "test_loss"].itertuples():
        if r.dataset == "shakespeare":  # the dataset's headline loss
            assert f"{r.variant}: " in findings and f"{r.mean_diff:+.3f} nats/char" in findings
    assert "![shakespeare: test loss, difference to the baseline" in findings
    # methodology from the config and the environment, not typed by hand
    assert "| shakespeare | baseline | 64 | 1,000 | 576,000 | 3.46e+11 | 144.0% |" in md
    assert f"optimizer steps of {cfg.train.batch_size} sequences x 48 tokens" in md
    assert "FLOPs: shakespeare 2.4e+11, arithmetic 1.2e+11" in md
    assert f"context of {cfg.model.context_length} characters" in md
    assert ("successive halving with Optuna: 6 configurations at 0.2 of the budget, then the "
            "best 1 at 1, every trial on seed 1000") in md
    assert "3 learning rates evenly spaced in log over the range at the width nearest 20" in md
    assert "3 seeds (0, 1, 2)" in md
    assert "2-core test CPU" in md and "torch 9.9.9-test" in md
    # tuned lr / d_model, parameter counts, throughput
    assert "| baseline | 0.002 | 64 | 1,000 | 105,000 | 100,000 | 600,000 | 40,000 |" in md
    # samples in a code block whose fence survives the ``` inside the sample
    assert "````text\nROMEO (gelu, seed 0):" in md
    assert "`$(0000000782+0000000021)=`" in md and "✗" in md
    # the ignored stale run is mentioned
    assert "not part of the configured study" in md and "shakespeare/old" in md


def _lr_section(md: str, dataset: str) -> str:
    """The learning-rate section of ``dataset`` in ``md``."""
    part = md.split(f"## {dataset}\n", 1)[1].split("\n## ", 1)[0]
    return part.split("### How each variant responds to the learning rate\n", 1)[1].split(
        "\n### ", 1)[0]


def test_each_dataset_has_a_learning_rate_section_with_its_tuning_and_figure(built):
    cfg, out_dir, out = built
    md = out["report"].read_text()
    for ds in DATASETS:
        section = _lr_section(md, ds)
        assert "Wortsman et al. 2023" in section and "sec. 2.2" in section
        assert "3 learning rates evenly spaced in log over [0.001, 0.1] at d_model 32 (24 " \
               "training tokens per parameter), the same points for every variant, so the " \
               "curves are paired, each trial trained for 0.2 of the budget" in section
        assert "one training seed (1000)" in section and "not a finding" in section
        # no tokens given to this report: no loss at initialisation, so no S, and it says so
        assert "not given to this report, so S is not computed" in section
        assert ("| variant | LR sensitivity S (nats) | design points (diverged) | best design lr "
                "| tuned lr | tuned d_model (tokens/param) | trained at full budget | range "
                "extended | on edge |") in section
        assert "| baseline | – | 3 (0) | 0.007 | 0.002 | 64 (6.5) | yes | – | – |" in section
        assert "| gelu | – | 3 (0) | 0.007 | 0.003 | 64 (6.5) | yes | lr up to 1 | – |" in section
        assert "| rmsnorm | – | 3 (1) | 0.007 | 0.004 | 64 (6.5) | yes | – | – |" in section
        # the figure is in the section, and only there
        assert f"](figures/tuning_{ds}.png)" in section
        assert md.count(f"](figures/tuning_{ds}.png)") == 1
    sens = pd.read_csv(out["lr_sensitivity"])
    assert list(sens.columns) == sensitivity.SENSITIVITY_COLUMNS
    assert [tuple(r) for r in sens[["dataset", "variant"]].values] == [
        (d, v) for d in DATASETS for v in VARIANTS]
    assert sens["lr_sensitivity"].isna().all()
    assert set(sens["note"]) == {sensitivity.NO_UNIFORM}


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


def test_the_learning_rate_sensitivity_uses_ln_of_the_vocabulary_size(study_root, tmp_path):
    cfg = make_cfg()
    tokens = write_tokens(tmp_path, cfg)
    out = report.build_report(cfg, study_root / "runs", tmp_path / "reports", tokens_dir=tokens)
    vocab = {ds: load_tokenizer(tokens / ds).vocab_size for ds in DATASETS}
    sens = pd.read_csv(out["lr_sensitivity"]).set_index(["dataset", "variant"])
    for ds in DATASETS:
        l0 = math.log(vocab[ds])
        for v_idx, var in enumerate(VARIANTS):
            losses = [design_loss(ds, v_idx, lr) for lr in DESIGN_LRS]
            best = min(losses[:2] if var == "rmsnorm" else losses)
            if var == "rmsnorm":
                losses[2] = l0  # its largest lr diverged: counted at the loss at initialisation
            want = sum(min(x, l0) - best for x in losses) / 3
            row = sens.loc[(ds, var)]
            assert row["lr_sensitivity"] == pytest.approx(want, abs=1e-12), (ds, var)
            assert row["uniform_loss"] == l0 and pd.isna(row["note"])
    md = out["report"].read_text()
    section = _lr_section(md, "arithmetic")
    s = sens.loc[("arithmetic", "rmsnorm"), "lr_sensitivity"]
    assert f"| rmsnorm | {s:.3f} | 3 (1) | 0.007 |" in section
    assert f"L0 = ln V = {math.log(vocab['arithmetic']):.3f} nats" in section
    assert f"the V = {vocab['arithmetic']} tokens of the vocabulary" in section


def test_study_metrics_are_one_small_file_per_dataset_and_variant(built):
    cfg, out_dir, out = built
    files = sorted(p.relative_to(out["metrics"]).as_posix()
                   for p in out["metrics"].glob("*/*.json"))
    assert files == sorted(f"{d}/{v}.json" for d in DATASETS for v in VARIANTS)
    summary = pd.read_csv(out["summary"])
    comparisons = pd.read_csv(out["comparisons"])
    for ds in DATASETS:
        for var in VARIANTS:
            doc = json.loads((out["metrics"] / ds / f"{var}.json").read_text())

            def mean(metric):
                return summary[(summary["dataset"] == ds) & (summary["variant"] == var)
                               & (summary["metric"] == metric)]["mean"].item()
            # the verdict is on the headline loss: the answer loss on arithmetic
            head = "answer_loss" if ds == "arithmetic" else "test_loss"
            assert set(doc) == ({"seeds", "test_loss", "answer_loss", "delta_answer_loss",
                                 "verdict", "exact_match"} if ds == "arithmetic" else
                                {"seeds", "test_loss", "delta_test_loss", "verdict"})
            assert doc["seeds"] == 3 and doc["test_loss"] == mean("test_loss")
            assert doc[head] == mean(head)
            if var == "baseline":
                assert (doc[f"delta_{head}"], doc["verdict"]) == (0.0, "baseline")
            else:
                c = comparisons[(comparisons["dataset"] == ds) & (comparisons["variant"] == var)
                                & (comparisons["metric"] == head)].iloc[0]
                assert doc[f"delta_{head}"] == c["mean_diff"]
                assert doc["verdict"] == EXPECTED_VERDICTS[(ds, head, var)]


def test_each_dataset_has_one_metrics_row_naming_its_better_and_worse_variants(built):
    cfg, out_dir, out = built
    assert sorted(p.name for p in out["metrics"].glob("*.json")) == sorted(
        f"{d}.json" for d in DATASETS)
    docs = {ds: json.loads((out["metrics"] / f"{ds}.json").read_text()) for ds in DATASETS}
    # arithmetic in answer loss (its test loss would say "better: gelu; worse: rmsnorm")
    assert docs == {"shakespeare": {"seeds": 3, "verdict": "better: gelu"},
                    "arithmetic": {"seeds": 3, "verdict": "better: rmsnorm"}}
    # the variants' rows use the same keys, so the dataset rows add no `dvc metrics show` column
    variant_keys = set(json.loads((out["metrics"] / "arithmetic" / "gelu.json").read_text()))
    assert set(docs["arithmetic"]) <= variant_keys


def test_dataset_verdicts_say_so_when_no_variant_differs():
    summary = pd.DataFrame({"dataset": ["d", "d"], "variant": ["baseline", "x"],
                            "metric": ["test_loss"] * 2, "n": [4, 4], "mean": [1.0, 1.0]})
    comparisons = pd.DataFrame({"dataset": ["d", "d"], "variant": ["x", "x"],
                                "metric": ["test_loss", "exact_match"],
                                "verdict": ["no significant difference", "better"]})
    assert headline.dataset_verdicts(summary, comparisons) == {
        "d": {"seeds": 4, "verdict": "none better or worse"}}


def test_mean_curves_average_the_seeds_at_each_step_in_study_order(built):
    cfg, out_dir, out = built
    curve = pd.read_csv(out["curves"] / "arithmetic.csv")
    assert list(curve.columns) == curves.CURVE_COLUMNS
    assert list(dict.fromkeys(curve["variant"])) == list(VARIANTS)
    history = collect.collect(out_dir.parent / "runs").history
    h = history[(history["dataset"] == "arithmetic") & (history["variant"] == "gelu")]
    row = curve[(curve["variant"] == "gelu") & (curve["step"] == 50)].iloc[0]
    assert row["val_loss"] == pytest.approx(h.loc[h["step"] == 50, "val_loss"].mean())
    assert row["seeds"] == 3
    for _, c in curve.groupby("variant"):
        assert c["step"].is_monotonic_increasing


def test_limits_section_is_written_from_the_report_tables(built):
    cfg, out_dir, out = built
    md = out["report"].read_text()
    assert md.index("## What this study can and cannot say") < md.index("## Methodology")
    section = md.split("## What this study can and cannot say")[1].split("## Methodology")[0]
    parts = dict(zip(*[iter(re.split(r"\*\*(shakespeare|arithmetic)\*\*", section)[1:])] * 2))
    assert set(parts) == {"shakespeare", "arithmetic"}
    detectable = pd.read_csv(out["detectable_effects"])
    for r in detectable.itertuples():  # the minimum detectable effects, as in the CSV
        assert f"{r.mde:.3g} {statistics.METRICS[r.metric][1]}" in parts[r.dataset]
        assert f"With {r.n_seeds} seeds per variant" in parts[r.dataset]
    # the better/worse verdicts, and nothing else, are what the study can say
    for ds in DATASETS:
        called = [f"{v} {verdict} in {statistics.METRICS[m][0]}"
                  for (d, m, v), verdict in EXPECTED_VERDICTS.items()
                  if d == ds and verdict in ("better", "worse")]
        listing = called[0] if len(called) == 1 else ", ".join(called[:-1]) + " and " + called[-1]
        assert f"over training seeds (paired by seed, Holm at family-wise α = 0.05): {listing} " \
               "than the baseline." in parts[ds]
    assert "Every variant trained at the baseline's width (d_model 64)." in parts["shakespeare"]
    assert "tokens (" in parts["shakespeare"] and "at d_model 64" in parts["shakespeare"]


def test_limits_section_flags_edges_identical_seeds_and_other_widths(tmp_path):
    write_runs(tmp_path / "runs")
    run_dir = tmp_path / "runs" / "shakespeare" / "rmsnorm"
    doc = json.loads((run_dir / "metrics.json").read_text())
    base = json.loads((tmp_path / "runs/shakespeare/baseline/metrics.json").read_text())
    for key, run in doc["runs"].items():  # 0.05 worse on every seed, at another width
        run["test_loss"] = base["runs"][key]["test_loss"] + 0.05
        run["d_model"] = 32
    (run_dir / "metrics.json").write_text(json.dumps(doc))
    (run_dir / "best.json").write_text(json.dumps(
        {"lr": 0.03, "d_model": 32, "val_loss": 2.0, "full_budget": True,
         "on_edge": ["lr at upper bound"], "extended": [], "lr_range": [1e-3, 1e-1],
         "d_model_choices": [32, 64], "n_trials": 7, "n_complete": 6, "n_diverged": 1}))
    out = report.build_report(make_cfg(), tmp_path / "runs", tmp_path / "reports")
    md = out["report"].read_text()
    section = md.split("## What this study can and cannot say")[1].split("## Methodology")[0]
    assert "lr at upper bound for rmsnorm" in section
    assert "rmsnorm in test loss (Δ = 0.05)" in section and "identical on every seed" in section
    assert "Trained at another width than the baseline (d_model 64): rmsnorm at 32" in section
    tuned = pd.read_csv(out["tuned"])
    assert list(tuned.columns) == collect.TUNED_COLUMNS
    row = tuned[(tuned["dataset"] == "shakespeare") & (tuned["variant"] == "rmsnorm")]
    assert row.fillna({"extended": ""}).to_dict("records") == [
        {"dataset": "shakespeare", "variant": "rmsnorm", "lr": 0.03, "d_model": 32,
         "val_loss": 2.0, "full_budget": True, "on_edge": "lr at upper bound",
         "extended": "", "lr_low": 0.001, "lr_high": 0.1, "d_model_choices": "32 64",
         "n_trials": 7, "n_complete": 6, "n_diverged": 1}]


def test_the_report_stage_ends_with_the_report_path_and_the_mlflow_ui_command(monkeypatch):
    paths = {"report": Path("reports/report.md"), "figures": [Path("a.png"), Path("b.png")]}
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = make_cfg()
    view = "#/experiments/3/runs?viewStateShareKey=final-runs&workflowType=machine_learning"
    assert report.where_to_look(cfg, paths, view).splitlines() == [
        "report: reports/report.md (2 figures, tables next to it)",
        "MLflow UI: mlflow ui --backend-store-uri sqlite:///mlflow.db",
        f"  then open http://127.0.0.1:5000/{view}"]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://10.0.0.5:5000/")
    assert report.where_to_look(cfg, paths, view).splitlines()[1:] == [
        f"MLflow UI: http://10.0.0.5:5000/{view}"]
    charts = {"arithmetic": "#/experiments/3/runs?viewStateShareKey=final-runs-arithmetic"
                            "&workflowType=machine_learning&compareRunsMode=CHART"}
    assert report.where_to_look(cfg, paths, view, charts).splitlines()[2:] == [
        f"  validation loss, arithmetic: http://10.0.0.5:5000/{charts['arithmetic']}"]
    off = dataclasses.replace(cfg, tracking=dataclasses.replace(cfg.tracking, enabled=False))
    assert len(report.where_to_look(off, paths, view, charts).splitlines()) == 1


def test_mlflow_run_colours_are_the_figures_family_colours():
    cfg = make_cfg()
    colours = families.variant_colours(cfg)
    assert list(colours)[0] == "baseline" and colours["baseline"] == "#1a1a1a"
    palette = family_palette({v: variant_family(cfg.variants.get(v) or {}) for v in colours})
    for variant, rgb in palette.items():
        assert colours[variant] == "#" + "".join(f"{round(c * 255):02x}" for c in rgb)


def test_attention_and_embedding_hooks(tmp_path):
    rng = np.random.default_rng(0)
    tokens = list("To be, or not\nto be")
    t = len(tokens)
    logits = rng.normal(size=(5, t, t)) + np.triu(np.full((t, t), -1e9), 1)
    maps = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    panels = {f"variant {i}": m for i, m in enumerate(maps)}
    p = model_figures.plot_attention(panels, tokens, "test, seed 0", tmp_path / "attn.png")
    assert p.read_bytes()[:4] == b"\x89PNG"
    chars = list("abcXYZ019 .,\n")
    embs = {"a": rng.normal(size=(len(chars), 8)), "b": rng.normal(size=(len(chars), 4))}
    p = model_figures.plot_embedding_pca(embs, chars, "emb", tmp_path / "emb.png")
    assert p.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError):
        model_figures.plot_attention({"x": maps[0][:-1]}, tokens, "bad", tmp_path / "bad.png")
    with pytest.raises(ValueError):
        model_figures.plot_attention({}, tokens, "bad", tmp_path / "bad.png")
    with pytest.raises(ValueError):
        model_figures.plot_embedding_pca({"x": rng.normal(size=(3, 8))}, chars, "bad",
                                  tmp_path / "bad.png")
    assert not (tmp_path / "bad.png").exists()


def test_collect_returns_typed_run_outputs_in_default_order(study_root):
    runs = collect.collect(study_root / "runs")
    assert isinstance(runs, collect.RunOutputs) and dataclasses.is_dataclass(runs)
    with pytest.raises(dataclasses.FrozenInstanceError):
        runs.ablation = pd.DataFrame()
    for name in ("ablation", "history", "trials", "grad", "per_op"):
        frame = getattr(runs, name)
        assert isinstance(frame, pd.DataFrame) and len(frame), name
        for col in ("dataset", "variant"):
            assert isinstance(frame[col].dtype, pd.CategoricalDtype), (name, col)
            assert frame[col].cat.ordered, (name, col)
    assert list(runs.ablation.columns) == collect.ABLATION_COLUMNS
    assert list(runs.per_op.columns) == collect.PER_OP_COLUMNS
    assert len(runs.ablation) == 2 * 3 * 3 + 3  # the study plus the stale "old" variant
    assert len(runs.per_op) == 3 * 3 * len(OPS)  # arithmetic only
    # without a config: datasets alphabetically, baseline first, other variants alphabetically
    assert list(runs.ablation["dataset"].cat.categories) == sorted(DATASETS)
    assert list(runs.ablation["variant"].cat.categories) == ["baseline", "gelu", "old", "rmsnorm"]
    assert list(runs.ablation[["dataset", "variant", "seed"]].itertuples(index=False)) == sorted(
        runs.ablation[["dataset", "variant", "seed"]].itertuples(index=False),
        key=lambda r: (sorted(DATASETS).index(r[0]),
                       ["baseline", "gelu", "old", "rmsnorm"].index(r[1]), r[2]))
    assert set(runs.samples) == {("shakespeare", v) for v in (*VARIANTS, "old")}
    assert set(runs.predictions) == {("arithmetic", v) for v in VARIANTS}
    assert runs.predictions[("arithmetic", "gelu")]["seed_1"][1]["prediction"] == "6310000000$"
    assert runs.samples[("shakespeare", "rmsnorm")]["seed_2"][1] == "second"


def test_restrict_to_study_sets_config_order_with_baseline_first(study_root):
    cfg = make_cfg(variants=("rmsnorm", "baseline", "gelu"))
    runs, notes = collect.restrict_to_study(cfg, collect.collect(study_root / "runs"))
    want = ["baseline", "rmsnorm", "gelu"]
    for name in ("ablation", "history", "trials", "grad", "per_op"):
        frame = getattr(runs, name)
        assert list(frame["dataset"].cat.categories) == list(DATASETS), name
        assert list(frame["variant"].cat.categories) == want, name
        assert "old" not in set(frame["variant"]), name
    assert collect.present(runs.ablation["variant"]) == want
    assert list(pd.unique(runs.ablation["variant"].astype(str))) == want
    assert ("shakespeare", "old") not in runs.samples
    assert len(notes) == 1 and "shakespeare/old/seed 0" in notes[0]


def test_variant_order_helpers():
    assert collect.variant_order(["z", "a", "baseline", "m", "a"], ["m", "z"]) == [
        "baseline", "m", "z", "a"]
    assert collect.variant_order(["b", "a"]) == ["a", "b"]
    cat = pd.Series(pd.Categorical(["y", "x", "y"], categories=["z", "y", "x"], ordered=True))
    assert collect.present(cat) == ["y", "x"]  # unobserved "z" left out, category order kept
    assert collect.present(pd.Series(["y", "x", "y"])) == ["y", "x"]  # plain: first appearance
    with pytest.raises(ValueError, match="not among"):
        collect.with_order(pd.DataFrame({"variant": ["a", "b"]}), variants=["a"])


def _random_ablation(rng, n_seeds, variants=("baseline", "v1", "v2"), datasets=("d1", "d2")):
    """An ablation-like table of random test losses and accuracies."""
    rows = []
    for ds in datasets:
        for var in variants:
            for seed in range(n_seeds):
                rows.append({"dataset": ds, "variant": var, "seed": seed,
                             "test_loss": rng.normal(1.5, 0.1),
                             "char_accuracy": rng.uniform(0, 1)})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("seed", range(5))
def test_summarise_interval_is_scipy_t_interval(seed):
    rng = np.random.default_rng(seed)
    df = _random_ablation(rng, n_seeds=int(rng.integers(2, 9)))
    # a constant cell (zero variance) and a single-seed cell
    df.loc[(df["dataset"] == "d1") & (df["variant"] == "v1"), "test_loss"] = 1.25
    df.loc[(df["dataset"] == "d2") & (df["variant"] == "v2") & (df["seed"] > 0),
           "char_accuracy"] = np.nan
    s = statistics.summarise(df, ["test_loss", "char_accuracy"])
    assert len(s) == 2 * 3 * 2
    for r in s.itertuples():
        x = df.loc[(df["dataset"] == r.dataset) & (df["variant"] == r.variant),
                   r.metric].dropna().to_numpy()
        assert r.n == len(x)
        assert r.mean == pytest.approx(x.mean(), rel=1e-14)
        if len(x) < 2:
            assert np.isnan(r.std) and np.isnan(r.ci95_low) and np.isnan(r.ci95_high)
            assert statistics.t_interval(x) == pytest.approx((math.nan, math.nan), nan_ok=True)
            continue
        assert r.std == pytest.approx(x.std(ddof=1), rel=1e-12, abs=1e-15)
        if np.ptp(x) == 0:  # scipy rejects a zero scale: the interval is the point itself
            assert r.ci95_low == r.ci95_high == r.mean
            assert statistics.t_interval(x) == (x[0], x[0])
            continue
        want = stats.t.interval(statistics.CONFIDENCE, len(x) - 1, loc=x.mean(),
                                scale=stats.sem(x))
        assert (r.ci95_low, r.ci95_high) == pytest.approx(want, rel=1e-12)
        assert r.ci95_low < r.mean < r.ci95_high
        # the figures' errorbar callable is the same interval, computed the same way
        assert statistics.t_interval(x) == tuple(float(v) for v in want)


@pytest.mark.filterwarnings("ignore:Precision loss:RuntimeWarning")  # scipy, zero variance
@pytest.mark.parametrize("seed", range(5))
def test_compare_interval_is_ttest_rel_confidence_interval(seed):
    rng = np.random.default_rng(100 + seed)
    n_seeds = int(rng.integers(statistics.MIN_SEEDS_FOR_TEST, 9))
    df = _random_ablation(rng, n_seeds, variants=("baseline", "v1", "v2", "same", "shifted"))
    base = df["variant"] == "baseline"
    for var, shift in (("same", 0.0), ("shifted", 0.25)):
        # zero-variance differences: all zero (test undefined) and all equal to `shift`
        df.loc[df["variant"] == var, "test_loss"] = df.loc[base, "test_loss"].to_numpy() + shift
    c = statistics.compare(df, metrics=("test_loss", "char_accuracy"))
    assert len(c) == 2 * 2 * 4
    for r in c.itertuples():
        pick = lambda v: (df.loc[(df["dataset"] == r.dataset) & (df["variant"] == v)]
                          .sort_values("seed")[r.metric].to_numpy())
        a, b = pick(r.variant), pick("baseline")
        res = stats.ttest_rel(a, b)
        with np.errstate(all="ignore"):
            low, high = res.confidence_interval(confidence_level=statistics.CONFIDENCE)
        assert r.n_pairs == n_seeds
        assert r.mean_diff == pytest.approx((a - b).mean(), rel=1e-12, abs=1e-15)
        if r.metric == "test_loss" and r.variant in ("same", "shifted"):
            # a difference with no spread: no test, no p-value, no Holm family member
            shift = 0.0 if r.variant == "same" else 0.25
            assert r.verdict == statistics.VERDICT_IDENTICAL
            assert np.isnan(r.p_value) and np.isnan(r.p_holm) and np.isnan(r.mde)
            assert not r.reject_holm and r.sd_diff == 0.0
            for bound in (r.ci95_low, r.ci95_high, r.ci_holm_low, r.ci_holm_high):
                assert bound == pytest.approx(shift, abs=1e-12)
            continue
        assert (r.ci95_low, r.ci95_high) == (float(low), float(high))
        assert (r.t_stat, r.p_value) == (float(res.statistic), float(res.pvalue))
        assert r.ci95_low < r.mean_diff < r.ci95_high
        # the Holm-adjusted interval holds the raw one and excludes 0 exactly on rejection
        slack = 1e-12 * max(1.0, abs(r.ci95_low), abs(r.ci95_high))  # two ways to round
        assert r.ci_holm_low <= r.ci95_low + slack and r.ci95_high <= r.ci_holm_high + slack
        assert (r.ci_holm_low > 0 or r.ci_holm_high < 0) == r.reject_holm
    # the identical rows (test loss of same and shifted) are left out of the Holm family
    for (ds, metric), g in c.groupby(["dataset", "metric"], observed=True):
        tested = g[g["verdict"] != statistics.VERDICT_IDENTICAL]
        assert len(tested) == (2 if metric == "test_loss" else 4)
        _, want, _, _ = multipletests(tested["p_value"], alpha=statistics.ALPHA, method="holm")
        assert list(tested["p_holm"]) == pytest.approx(list(want), rel=1e-12)


def test_a_constant_nonzero_difference_gets_no_verdict_and_no_p_value():
    # the reported case: baseline exact match 0 on every seed, a variant 0.001 on every seed
    df = pd.DataFrame({"dataset": "arithmetic", "seed": [0, 1, 2] * 2,
                       "variant": ["baseline"] * 3 + ["v"] * 3,
                       "exact_match": [0.0] * 3 + [0.001] * 3})
    r = statistics.compare(df, metrics=("exact_match",)).iloc[0]
    assert r["verdict"] == "identical on every seed"
    assert np.isnan(r["p_value"]) and np.isnan(r["p_holm"]) and not r["reject_holm"]
    assert r["mean_diff"] == pytest.approx(0.001)


def test_holm_interval_is_the_plain_interval_for_one_comparison_and_bonferroni_at_m_p():
    mean, sem, df = 0.3, 0.1, 4
    plain = stats.t.interval(0.95, df, loc=mean, scale=sem)
    assert statistics.holm_interval(mean, sem, df, 0.02, 0.02) == pytest.approx(plain)
    bonferroni = stats.t.interval(1 - 0.05 / 3, df, loc=mean, scale=sem)
    assert statistics.holm_interval(mean, sem, df, 0.01, 0.03) == pytest.approx(bonferroni)


def test_minimum_detectable_effect_is_detected_with_the_stated_power():
    # the noncentral t power of the paired test at the MDE is the stated 80%
    sd, n, alpha = 0.02, 5, 0.05 / 4
    mde = statistics.min_detectable_effect(sd, n, alpha)
    df, nc = n - 1, mde / (sd / math.sqrt(n))
    crit = stats.t.ppf(1 - alpha / 2, df)
    power = stats.nct.sf(crit, df, nc) + stats.nct.cdf(-crit, df, nc)
    assert power == pytest.approx(statistics.POWER, abs=1e-6)
    # more seeds detect smaller effects; twice the spread doubles the MDE
    assert statistics.min_detectable_effect(sd, 10, alpha) < mde
    assert statistics.min_detectable_effect(2 * sd, n, alpha) == pytest.approx(2 * mde)
    assert math.isnan(statistics.min_detectable_effect(sd, 1))


def _decoded(solved: Sequence[bool], width: int = 3) -> list[dict]:
    """Decoded problems: problem i is right when solved[i], else wrong in every character."""
    return [{"prompt": f"q{i}", "target": "12$"[:width],
             "prediction": "12$"[:width] if ok else "xy#"[:width]}
            for i, ok in enumerate(solved)]


def test_problem_by_problem_comparison_on_a_constructed_example_with_a_known_answer():
    # 100 problems, 2 seeds. The baseline solves problems 0-9 on both seeds; the variant solves
    # problems 0-29 on both seeds: 20 problems differ, all in the variant's favour.
    n = 100
    base = [i < 10 for i in range(n)]
    var = [i < 30 for i in range(n)]
    few = [i < 20 for i in range(n)]  # 10 problems differ: few enough to enumerate the flips
    predictions = {("arith", "baseline"): {"seed_0": _decoded(base), "seed_1": _decoded(base)},
                   ("arith", "v"): {"seed_0": _decoded(var), "seed_1": _decoded(var)}}
    c = problems.compare_problems(predictions).set_index("metric")
    em = c.loc["exact_match"]
    assert (em["baseline_count"], em["variant_count"], em["total"]) == (20, 60, 200)
    assert em["n_differing"] == 20 and em["mean_diff"] == pytest.approx(0.2)
    assert em["verdict"] == statistics.VERDICT_BETTER
    # 2**20 sign flips are too many to enumerate: drawn; no draw is as extreme, and scipy's
    # two-sided p is twice the one-sided (hits + 1) / (resamples + 1)
    assert em["p_value"] == pytest.approx(2 / (problems.PERMUTATION_RESAMPLES + 1))
    # with 10 differences, all positive, the flips are enumerated: p = 2 * 2**-10 exactly, the
    # exact McNemar (binomial) test on 10 discordant problems, none against the variant
    exact = problems.compare_problems(
        {**predictions, ("arith", "v"): {"seed_0": _decoded(few), "seed_1": _decoded(few)}})
    assert exact["p_value"].iloc[0] == pytest.approx(2 * 0.5 ** 10, rel=1e-9)
    assert exact["p_value"].iloc[0] == pytest.approx(stats.binomtest(10, 10).pvalue, rel=1e-9)
    d = np.array([1.0] * 20 + [0.0] * 80)  # per-problem differences, averaged over seeds
    want = stats.t.interval(0.95, n - 1, loc=d.mean(), scale=d.std(ddof=1) / math.sqrt(n))
    assert (em["ci95_low"], em["ci95_high"]) == pytest.approx(want, rel=1e-12)
    ca = c.loc["char_accuracy"]  # a wrong answer here is wrong in all 3 characters
    assert (ca["baseline_count"], ca["variant_count"], ca["total"]) == (60, 180, 600)


def test_problem_by_problem_counts_a_split_decision_on_two_seeds_as_half_a_problem():
    # problem 0: the variant solves it on seed 0 only; problem 1: the baseline on seed 1 only
    base = {"seed_0": _decoded([False, False, False]), "seed_1": _decoded([False, True, False])}
    var = {"seed_0": _decoded([True, False, False]), "seed_1": _decoded([False, False, False])}
    c = problems.compare_problems({("a", "baseline"): base, ("a", "v"): var})
    em = c[c["metric"] == "exact_match"].iloc[0]
    assert em["n_differing"] == 2 and em["mean_diff"] == 0.0
    # two differences of +0.5 and -0.5: of the 4 sign flips, all have |sum| >= 0, p = 1
    assert em["p_value"] == 1.0 and em["verdict"] == statistics.VERDICT_NSD


def test_problem_by_problem_with_one_differing_problem_has_p_1():
    # one discordant problem (the default study met it: exact match 0.0004 against 0.0002):
    # its two sign flips are equally extreme, the exact McNemar p is binomtest(1, 1) = 1
    base = {"seed_0": _decoded([False, False, False])}
    var = {"seed_0": _decoded([True, False, False])}
    c = problems.compare_problems({("a", "baseline"): base, ("a", "v"): var})
    em = c[c["metric"] == "exact_match"].iloc[0]
    assert em["n_differing"] == 1 and em["p_value"] == stats.binomtest(1, 1).pvalue == 1.0
    assert em["verdict"] == statistics.VERDICT_NSD


@pytest.mark.parametrize("d", [[0.5, 1.0], [1.0, -0.5, 2.0], [0.25, 0.5, -1.0, 2.0, 3.0]])
def test_the_sign_flip_test_equals_enumerating_every_flip(d):
    d = np.array(d)
    flips = [np.array(signs) for signs in itertools.product((1, -1), repeat=d.size)]
    want = np.mean([abs((d * f).sum()) >= abs(d.sum()) - 1e-12 for f in flips])
    assert problems.sign_flip_test(d) == pytest.approx(want)


def test_problem_by_problem_identical_outcomes_get_no_test():
    same = {"seed_0": _decoded([True, False, False])}
    c = problems.compare_problems({("a", "baseline"): same, ("a", "v"): same})
    assert set(c["verdict"]) == {"identical on every problem"}
    assert c["p_value"].isna().all() and c["mean_diff"].eq(0).all()


def test_problem_by_problem_refuses_variants_decoded_on_different_problems():
    base = {"seed_0": _decoded([True, False])}
    other = {"seed_0": [dict(p, prompt="other") for p in _decoded([True, False])]}
    with pytest.raises(ValueError, match="problem 0 of v .*same test problems"):
        problems.compare_problems({("a", "baseline"): base, ("a", "v"): other})


def test_every_table_follows_the_configured_variant_order(tmp_path):
    write_runs(tmp_path / "runs")
    configured = ("rmsnorm", "baseline", "gelu")
    cfg = make_cfg(variants=configured)
    out = report.build_report(cfg, tmp_path / "runs", tmp_path / "reports")
    want = ["baseline", "rmsnorm", "gelu"]  # baseline first, then as configured
    datasets = list(cfg.datasets)
    assert datasets == ["shakespeare", "arithmetic"]  # not alphabetical: the order is tested
    tables = {name: list(csv.DictReader(out[name].open(encoding="utf-8")))
              for name in ("ablation", "summary", "comparisons")}
    for name, rows in tables.items():
        # plain strings in the files, blocks of datasets in config order
        assert all(type(r["variant"]) is str and type(r["dataset"]) is str for r in rows)
        assert list(dict.fromkeys(r["dataset"] for r in rows)) == datasets, name
    for ds in datasets:
        for name, key in (("ablation", "seed"), ("summary", "metric"),
                          ("comparisons", "metric")):
            rows = [r for r in tables[name] if r["dataset"] == ds]
            groups = list(dict.fromkeys(r[key] for r in rows))
            for g in groups:
                seq = [r["variant"] for r in rows if r[key] == g]
                expected = [v for v in want if v != "baseline"] if name == "comparisons" else want
                assert seq == expected, (name, ds, g)
            if name != "comparisons":  # variants outermost within a dataset
                blocks = list(dict.fromkeys(r["variant"] for r in rows))
                assert blocks == want, (name, ds)
        summary_metrics = [r["metric"] for r in tables["summary"]
                           if r["dataset"] == ds and r["variant"] == "baseline"]
        assert summary_metrics == [m for m in statistics.METRICS if m in summary_metrics]
    comp_metrics = list(dict.fromkeys(r["metric"] for r in tables["comparisons"]
                                      if r["dataset"] == "arithmetic"))
    assert comp_metrics == list(statistics.COMPARED_METRICS)
    md = out["report"].read_text(encoding="utf-8")
    for ds in datasets:
        section = md.split(f"## {ds}\n", 1)[1].split("\n## ", 1)[0]
        rows = [line.split(" | ")[0].lstrip("| ") for line in section.splitlines()
                if line.startswith(tuple(f"| {v} |" for v in want))]
        # arithmetic: headline and length tables first; then summary and tuned tables
        tables = 4 if ds == "arithmetic" else 2
        assert rows[:3 * tables] == want * tables, ds


def test_statistics_follow_the_categorical_order_not_the_row_order():
    rng = np.random.default_rng(7)
    df = _random_ablation(rng, n_seeds=3, variants=("v2", "baseline", "v1"), datasets=("b", "a"))
    df = df.sample(frac=1.0, random_state=3).reset_index(drop=True)  # rows in no order at all
    ordered = collect.with_order(df, ["a", "b"], ["baseline", "v1", "v2"])
    s = statistics.summarise(ordered, ["test_loss", "char_accuracy"])
    assert list(s[["dataset", "variant", "metric"]].itertuples(index=False, name=None)) == [
        (d, v, m) for d in ("a", "b") for v in ("baseline", "v1", "v2")
        for m in ("test_loss", "char_accuracy")]
    c = statistics.compare(ordered)
    assert list(c[["dataset", "metric", "variant"]].itertuples(index=False, name=None)) == [
        (d, m, v) for d in ("a", "b") for m in ("test_loss", "char_accuracy")
        for v in ("v1", "v2")]
    for table in (s, c):  # the order travels with the tables
        assert list(table["variant"].cat.categories) == ["baseline", "v1", "v2"]
    # every mean is pandas' groupby mean over the seeds in row order (as with plain columns and
    # sort=False), to the last bit: the group order does not change the order of the sums
    for metric in ("test_loss", "char_accuracy"):
        plain = df.groupby(["dataset", "variant"], sort=False)[metric].mean()
        got = s[s["metric"] == metric].set_index(["dataset", "variant"])["mean"]
        assert {k: got[k] for k in plain.index} == plain.to_dict()


def test_summary_means_are_groupby_means_over_seeds_in_row_order(built):
    # bit-for-bit: a groupby that reorders a group's rows changes the last bit of some means
    _, _, out = built
    a = pd.read_csv(out["ablation"])
    s = pd.read_csv(out["summary"]).set_index(["dataset", "variant", "metric"])
    for metric in statistics.METRICS:
        want = a.dropna(subset=[metric]).groupby(["dataset", "variant"], sort=False)[metric].mean()
        for (ds, var), mean in want.items():
            assert s.loc[(ds, var, metric), "mean"] == mean, (ds, var, metric)


def test_the_same_runs_give_byte_identical_reports(built, tmp_path):
    """Figures with random jitter included: the report is a pure function of the runs, and
    drawing it leaves numpy's global random state as it was."""
    cfg, out_dir, _ = built
    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    report.build_report(cfg, out_dir.parent / "runs", tmp_path / "again", environment=ENV)
    assert np.array_equal(np.random.get_state()[1], before)
    written = sorted(p.relative_to(tmp_path / "again") for p in (tmp_path / "again").rglob("*")
                     if p.is_file())
    assert Path("figures") / "test_loss_arithmetic.png" in written
    for rel in written:
        assert (tmp_path / "again" / rel).read_bytes() == (out_dir / rel).read_bytes(), rel


def test_a_retuned_baseline_is_measured_against_the_baseline_not_taken_for_a_variant(built):
    cfg, out_dir, out = built
    ablation = pd.read_csv(out["ablation"])
    assert len(ablation) == len(DATASETS) * len(VARIANTS) * 3  # no replicate row among them
    variation = pd.read_csv(out["tuning_variation"])
    assert list(variation.columns) == statistics.TUNING_VARIATION_COLUMNS
    # only Shakespeare's baseline has a re-tuning, and Shakespeare has test loss only
    assert variation[["dataset", "variant", "replicate", "metric"]].values.tolist() == [
        ["shakespeare", "baseline", 1, "test_loss"]]
    row = variation.iloc[0]
    original = ablation[(ablation["dataset"] == "shakespeare")
                        & (ablation["variant"] == "baseline")]
    assert (row["lr"], row["d_model"]) == (original["lr"].iloc[0], 64)
    assert (row["replicate_lr"], row["replicate_d_model"]) == (0.004, 32)
    assert row["n_pairs"] == 3
    assert row["mean_diff"] == pytest.approx(np.mean(REPLICATE_SHIFT), abs=1e-12)
    low, high = stats.t.interval(0.95, 2, loc=np.mean(REPLICATE_SHIFT),
                                 scale=stats.sem(REPLICATE_SHIFT))
    assert (row["ci95_low"], row["ci95_high"]) == (pytest.approx(low), pytest.approx(high))
    md = out["report"].read_text()
    shakespeare, arithmetic = md.split("## shakespeare")[1], md.split("## arithmetic")[1]
    shakespeare = shakespeare.split("## arithmetic")[0]
    assert "### How much the tuning varies" in shakespeare
    assert "### How much the tuning varies" not in arithmetic
    assert f"| baseline | 1 | test loss (lower is better) | {row['lr']:.3g}, 64 | 0.004, 32 | 3 |" \
        in shakespeare


def test_tuning_variation_of_an_identical_retuning_is_zero():
    rng = np.random.default_rng(0)
    ablation = _random_ablation(rng, 4).assign(lr=0.003, d_model=64)
    same = ablation[ablation["variant"] == "v1"].assign(replicate=1)
    variation = statistics.tuning_variation(ablation, same)
    metrics = [m for m in statistics.COMPARED_METRICS if m in ablation]
    assert len(variation) == 2 * len(metrics) > 0  # d1, d2 x every compared metric
    assert (variation["mean_diff"] == 0).all()
    assert (variation["ci95_low"] == 0).all() and (variation["ci95_high"] == 0).all()
    assert statistics.tuning_variation(ablation, same.iloc[:0]).empty


def _extrapolation(seed_index: int, shift: float, learned: bool) -> dict:
    """A seed's ``extrapolation`` result as the evaluate stage writes it (context 48)."""
    out = {}
    for f in (1, 2, 4):
        if learned and f > 1:
            out[f"x{f}"] = "n/a (learned table of 48 positions)"
            continue
        loss = 1.5 + shift * (f - 1) + 0.01 * seed_index
        out[f"x{f}"] = {"test_loss": loss, "length": 48 * f, "bucket": 16, "windows": 10,
                        "position_loss": [loss] * (3 * f)}
    return out


def test_extrapolation_statistics_compare_each_scheme_with_rope_at_each_length():
    rows = []
    for var, shift in (("baseline", None), ("rope", 0.5), ("alibi", 0.0), ("none", 0.6)):
        for i, seed in enumerate((0, 1, 2, 3)):
            for f, r in _extrapolation(i, shift or 0.0, shift is None).items():
                noise = 0.003 * ((i * {"baseline": 3, "rope": 1, "alibi": 2, "none": 5}[var])
                                 % 3)  # differences that vary from seed to seed
                rows.append({"dataset": "d", "variant": var, "seed": seed,
                             "factor": int(f[1:]), "length": None if isinstance(r, str)
                             else r["length"], "test_loss": None if isinstance(r, str)
                             else r["test_loss"] + noise,
                             "note": r if isinstance(r, str) else ""})
    df = collect.with_order(pd.DataFrame(rows), ["d"], ["baseline", "rope", "alibi", "none"])
    table = ex.extrapolation_table(df)
    b = table[table["variant"] == "baseline"].set_index("factor")
    assert b.loc[1, "n"] == 4 and b.loc[4, "note"] == "n/a (learned table of 48 positions)"
    assert pd.isna(b.loc[4, "mean"]) and pd.isna(b.loc[4, "length"])
    r4 = table[(table["variant"] == "rope") & (table["factor"] == 4)].iloc[0]
    assert r4["length"] == 192 and r4["ci95_low"] < r4["mean"] < r4["ci95_high"]
    c = ex.extrapolation_comparisons(df)
    assert set(c["reference"]) == {"rope"}
    at4 = c[c["metric"] == "test_loss_x4"].set_index("variant")
    assert sorted(at4.index) == ["alibi", "none"]  # the learned table is not compared past 1x
    assert at4.loc["alibi", "verdict"] == "better" and at4.loc["none", "verdict"] == "worse"
    assert at4.loc["alibi", "mean_diff"] == pytest.approx(-1.5, abs=0.01)
    at1 = c[c["metric"] == "test_loss_x1"]
    assert sorted(at1["variant"]) == ["alibi", "baseline", "none"]


def test_the_report_shows_length_extrapolation_with_na_for_learned_tables(tmp_path):
    write_runs(tmp_path / "runs")
    for path in (tmp_path / "runs").glob("*/*/metrics.json"):
        doc = json.loads(path.read_text())
        for i, run in enumerate(doc["runs"].values()):
            run["extrapolation"] = _extrapolation(i, 0.0, learned=True)
        path.write_text(json.dumps(doc))
    out = report.build_report(make_cfg(), tmp_path / "runs", tmp_path / "reports")
    table = pd.read_csv(out["extrapolation"])
    assert len(table) == len(DATASETS) * len(VARIANTS) * 3
    assert set(table.loc[table["factor"] > 1, "note"]) == {"n/a (learned table of 48 positions)"}
    md = out["report"].read_text()
    section = md.split("### Length extrapolation")[1].split("###")[0]
    assert "| baseline | learned | 1.510 ± 0.025 | n/a (learned table of 48 positions) |" in section
    assert "Δ vs baseline at 1x" in section
    doc = json.loads((out["metrics"] / "arithmetic" / "gelu.json").read_text())
    assert doc["test_loss_x4"] == "n/a"
    assert (tmp_path / "reports" / "figures" / "extrapolation_shakespeare.png").is_file()
    positions = pd.read_csv(out["extrapolation_positions"])
    # learned tables: factor 1 only, 48 positions in buckets of 16, the mean of 3 seeds
    assert len(positions) == len(DATASETS) * len(VARIANTS) * 3
    assert set(positions["factor"]) == {1} and set(positions["position"]) == {0, 16, 32}
    assert set(positions["seeds"]) == {3}
    assert positions["loss"].tolist() == pytest.approx(
        [1.5 + 0.01 * (0 + 1 + 2) / 3] * len(positions))


# ---------------------------------------------------------------------------------------------
# Arithmetic: the headline loss, its floors and length generalisation
# ---------------------------------------------------------------------------------------------

def _section(md: str, dataset: str) -> str:
    return md.split(f"## {dataset}\n", 1)[1].split("\n## ", 1)[0]


def test_the_headline_loss_is_the_answer_loss_where_a_dataset_has_one(built):
    _, _, out = built
    summary, ablation = pd.read_csv(out["summary"]), pd.read_csv(out["ablation"])
    for frame in (summary, ablation, pd.read_csv(out["comparisons"])):
        assert headline.headline_loss(frame, "arithmetic") == "answer_loss"
        assert headline.headline_loss(frame, "shakespeare") == "test_loss"
    # runs evaluated before the answer loss existed keep the test loss as the headline
    assert headline.headline_loss(ablation.drop(columns="answer_loss"), "arithmetic") == \
        "test_loss"
    assert headline.headline_loss(summary[summary["metric"] != "answer_loss"],
                                  "arithmetic") == "test_loss"
    assert headline.headline_loss(summary.iloc[:0], "arithmetic") == "test_loss"


def test_collect_reads_the_answer_loss_and_the_results_by_operand_and_answer_digits(study_root):
    runs, _ = collect.restrict_to_study(make_cfg(), collect.collect(study_root / "runs"))
    a = runs.ablation[runs.ablation["dataset"] == "arithmetic"]
    assert a["answer_loss"].tolist() == pytest.approx(
        [_answer_loss(v, i) for v in VARIANTS for i in range(3)])
    assert list(runs.per_op.columns) == collect.PER_OP_COLUMNS
    assert runs.per_op["n"].eq(50).all()
    assert runs.per_op.loc[runs.per_op["op"] == "mul", "answer_loss"].tolist() == \
        pytest.approx([_answer_loss(v, i) + 0.2 for v in VARIANTS for i in range(3)])
    digits = runs.by_operand_digits
    assert list(digits.columns) == collect.OPERAND_DIGITS_COLUMNS
    assert len(digits) == len(VARIANTS) * 3 * len(EM_BY_DIGITS)
    assert list(digits["variant"].cat.categories) == list(VARIANTS)
    assert digits[["variant", "seed", "digits"]].values.tolist() == [
        [v, s, d] for v in VARIANTS for s in (0, 1, 2) for d in EM_BY_DIGITS]
    na = digits[digits["note"] != ""]
    assert na[["variant", "digits", "note"]].drop_duplicates().values.tolist() == [
        ["rmsnorm", 4, NA_4]]
    assert na["exact_match"].isna().all() and na["split"].isna().all()
    ok = digits[digits["note"] == ""]
    assert set(zip(ok["digits"], ok["split"])) == {(1, "test"), (2, "test"), (3, "length"),
                                                  (4, "length")}
    answers = runs.by_answer_digits
    assert list(answers.columns) == collect.ANSWER_DIGITS_COLUMNS
    assert len(answers) == len(VARIANTS) * 3 * 3 and answers["n"].tolist()[:3] == [10, 20, 30]
    # empty frames, with their columns, where no run wrote any
    bare = collect.RunOutputs(*(pd.DataFrame(),) * 5, samples={}, predictions={})
    assert list(bare.by_operand_digits.columns) == collect.OPERAND_DIGITS_COLUMNS


def test_the_length_table_has_na_rows_where_a_learned_table_cannot_reach(built):
    _, _, out = built
    table = pd.read_csv(out["length_generalisation"], keep_default_na=False,
                        na_values=[""])
    assert list(table.columns) == arith.LENGTH_COLUMNS
    assert table[["variant", "digits"]].values.tolist() == [
        [v, d] for v in VARIANTS for d in EM_BY_DIGITS]
    assert dict(zip(table["digits"], table["split"])) == {1: "test", 2: "test", 3: "length",
                                                          4: "length"}
    na = table[table["note"].notna()]
    assert na[["variant", "digits", "n_seeds", "note"]].values.tolist() == [
        ["rmsnorm", 4, 0, NA_4]]
    assert na[["mean", "ci95_low", "ci95_high"]].isna().all().all()
    gelu3 = table[(table["variant"] == "gelu") & (table["digits"] == 3)].iloc[0]
    x = np.array([_length_em("gelu", i, 3) for i in range(3)])
    assert gelu3["n_seeds"] == 3 and gelu3["mean"] == pytest.approx(x.mean())
    assert (gelu3["ci95_low"], gelu3["ci95_high"]) == pytest.approx(
        stats.t.interval(0.95, 2, loc=x.mean(), scale=stats.sem(x)))


def test_length_comparisons_pair_each_variant_with_the_baseline_at_each_length(built):
    _, _, out = built
    c = pd.read_csv(out["length_generalisation_comparisons"])
    assert list(c.columns) == arith.LENGTH_COMPARISON_COLUMNS
    got = {(r.variant, r.digits): r.verdict for r in c.itertuples()}
    nsd = statistics.VERDICT_NSD
    # gelu better only past the training length; rmsnorm not compared where it is n/a
    assert got == {("gelu", 1): nsd, ("gelu", 2): nsd, ("gelu", 3): "better",
                   ("gelu", 4): "better", ("rmsnorm", 1): nsd, ("rmsnorm", 2): nsd,
                   ("rmsnorm", 3): nsd}
    assert set(c["metric"]) == {f"exact_match_d{d}" for d in EM_BY_DIGITS}
    row = c[(c["variant"] == "gelu") & (c["digits"] == 4)].iloc[0]
    assert row["split"] == "length" and row["n_pairs"] == 3
    diff = [_length_em("gelu", i, 4) - _length_em("baseline", i, 4) for i in range(3)]
    assert row["mean_diff"] == pytest.approx(np.mean(diff))
    # one Holm family per length: at 3 digits gelu and rmsnorm, at 4 gelu alone (p = p_Holm)
    at3 = c[c["digits"] == 3]
    _, want, _, _ = multipletests(at3["p_value"], method="holm")
    assert at3["p_holm"].tolist() == pytest.approx(list(want))
    assert row["p_holm"] == row["p_value"]


def test_a_length_the_baseline_cannot_reach_has_no_comparison():
    rows = [{"dataset": "a", "variant": v, "seed": s, "digits": d,
             "split": None if (v, d) == ("baseline", 3) else ("test" if d < 3 else "length"),
             "exact_match": None if (v, d) == ("baseline", 3) else 0.5 + 0.01 * s * (v == "x"),
             "note": "n/a (learned table of 8 positions)" if (v, d) == ("baseline", 3) else ""}
            for v in ("baseline", "x") for s in range(3) for d in (1, 2, 3)]
    frame = collect.with_order(pd.DataFrame(rows), ["a"], ["baseline", "x"])
    c = arith.length_comparisons(frame)
    assert c["digits"].tolist() == [1, 2]
    table = arith.length_table(frame)
    assert table.loc[table["note"] != "", ["variant", "digits", "split"]].values.tolist() == [
        ["baseline", 3, "length"]]  # the split of the length, from the variants that ran it
    assert arith.unreachable(frame, "a") == [
        "baseline at 3 digits, n/a (learned table of 8 positions)"]
    assert arith.training_digits(None, frame, "a") == 2


def test_the_arithmetic_section_opens_with_the_headline_then_length_generalisation(built):
    _, out_dir, out = built
    md = out["report"].read_text()
    section = _section(md, "arithmetic")
    assert section.startswith("\n### Headline\n")
    assert (section.index("### Headline") < section.index("### Length generalisation")
            < section.index("### Summary"))
    assert "### Headline" not in _section(md, "shakespeare")
    assert "### Length generalisation" not in _section(md, "shakespeare")
    head = section.split("### Headline\n", 1)[1].split("\n### ", 1)[0]
    table = [line for line in head.splitlines() if line.startswith("|")]
    assert table[0] == ("| variant | seeds | answer loss (nats/answer char) | exact match "
                        "(fraction) | char accuracy (fraction) |")
    s = pd.read_csv(out["summary"]).set_index(["dataset", "variant", "metric"])
    cells = []
    for m in ("answer_loss", "exact_match", "char_accuracy"):
        r = s.loc[("arithmetic", "rmsnorm", m)]
        cells.append(f"{r['mean']:.3f} ± {(r['ci95_high'] - r['ci95_low']) / 2:.3f}")
    assert table[4] == f"| rmsnorm | 3 | {' | '.join(cells)} |"
    assert "No floors: they need the tokenized data" in head  # no tokens given to `built`
    assert ("In answer loss against the baseline (paired by seed, Holm-corrected): better: "
            "rmsnorm.") in head
    length = section.split("### Length generalisation\n", 1)[1].split("\n### ", 1)[0]
    assert "Trained on operands of up to 2 digits; tested on longer ones" in length
    assert "| variant | 1 digit (test) | 2 digits (test) | 3 digits (length) | 4 digits " \
           "(length) | Δ vs baseline at 1 |" in length
    rmsnorm = next(line for line in length.splitlines() if line.startswith("| rmsnorm |"))
    assert rmsnorm.split(" | ")[4] == NA_4 and rmsnorm.endswith("| – |")
    gelu = next(line for line in length.splitlines() if line.startswith("| gelu |"))
    assert gelu.count("**▲ better**") == 2
    assert "](figures/length_generalisation_arithmetic.png)" in length
    assert md.count("](figures/length_generalisation_arithmetic.png)") == 1
    assert "left out: rmsnorm at 4 digits, n/a (learned table of 48 positions)" in length


@pytest.mark.parametrize("strip_newlines", [True, False])
def test_train_answers_cut_the_train_split_into_its_problems(tmp_path, strip_newlines):
    tokens = write_tokens(tmp_path, make_cfg(), strip_newlines)
    want = train_part(tokens, newline=not strip_newlines)
    assert len(want) > 10
    assert arith.train_answers(tokens / "arithmetic") == [split_problem(p)[1] for p in want]
    meta_path = tokens / "arithmetic" / "meta.json"
    meta = json.loads(meta_path.read_text())
    if strip_newlines:  # a line_length that does not divide the split is an error, not a floor
        meta_path.write_text(json.dumps({**meta, "line_length": 35}))
        with pytest.raises(DataError, match="not a whole number of problems"):
            arith.train_answers(tokens / "arithmetic")
    del meta["line_length"]  # tokens written before it was recorded: no floor
    meta_path.write_text(json.dumps(meta))
    assert arith.train_answers(tokens / "arithmetic") == []


def test_the_answer_loss_floor_comes_from_the_train_answers_and_stands_in_the_headline(
        study_root, tmp_path):
    cfg = make_cfg()
    tokens = write_tokens(tmp_path, cfg)
    out = report.build_report(cfg, study_root / "runs", tmp_path / "reports", tokens_dir=tokens)
    refs = pd.read_csv(out["references"])
    floor = refs[(refs["dataset"] == "arithmetic") & (refs["metric"] == "answer_loss")]
    assert floor["reference"].tolist() == [arith.ANSWER_FLOOR]
    targets = ["3080000000$", "6300000000$"]  # the baseline's decoded test problems
    train = [split_problem(p)[1] for p in train_part(tokens, newline=True)]
    value = answer_position_floor(train, targets)
    assert floor["value"].item() == pytest.approx(value, abs=1e-12)
    assert value > 0.8  # above every variant's answer loss: all beat it
    em = refs[(refs["dataset"] == "arithmetic") & (refs["reference"] == "most frequent answer")]
    assert em["value"].item() == 0.5  # one of the two problems
    md = out["report"].read_text()
    head = _section(md, "arithmetic").split("### Headline\n", 1)[1].split("\n### ", 1)[0]
    assert f"| _floor: answer ignoring the question_ | – | {value:.3f} | – | – |" in head
    assert "| _floor: most frequent answer_ | – | – | 0.500 | – |" in head
    assert "| _floor: best constant answer_ | – | – | – | 0.864 |" in head  # 19 of 22 chars
    # gelu's exact match (0.507) is above the most frequent answer's 0.5; nobody's char
    # accuracy reaches the best constant answer's 19/22
    assert (f"Against the floors (answer loss below {value:.3f}, exact match above 0.500, "
            "char accuracy above 0.864), on the mean over seeds: beat some: baseline (answer "
            "loss), gelu (answer loss, exact match), rmsnorm (answer loss).") in head
    section = md.split("## What this study can and cannot say")[1].split("## Methodology")[0]
    assert "Answer loss against answers that ignore the question: answer ignoring the " \
           "question" in section and "3 of 3 beat the answer ignoring the question" in section


def test_tuning_luck_on_arithmetic_is_measured_in_the_answer_loss(tmp_path):
    write_runs(tmp_path / "runs")
    base = tmp_path / "runs" / "arithmetic" / "baseline"
    doc = json.loads((base / "metrics.json").read_text())
    for shift, run in zip(REPLICATE_SHIFT, doc["runs"].values()):  # the test loss moves 1.0
        run.update(lr=0.004, d_model=32, answer_loss=run["answer_loss"] + shift,
                   test_loss=run["test_loss"] + 1.0)
    (base / "replicate_1").mkdir()
    (base / "replicate_1" / "metrics.json").write_text(json.dumps({**doc, "replicate": 1}))
    out = report.build_report(make_cfg(), tmp_path / "runs", tmp_path / "reports")
    md = out["report"].read_text()
    section = md.split("## What this study can and cannot say")[1].split("## Methodology")[0]
    part = section.split("**arithmetic**")[1]
    moved = np.mean(REPLICATE_SHIFT)
    assert f"moved its answer loss by +{moved:.4f}" in part
    assert "nats/answer char may owe as much to the tuner" in part
    # gelu's answer-loss effect (+0.0007) is within that; rmsnorm's (-0.20) is not
    assert "Answer loss effects of that size or less here: gelu." in part


def test_runs_without_an_answer_loss_keep_the_test_loss_as_the_headline():
    rng = np.random.default_rng(5)
    ablation = _random_ablation(rng, 3, datasets=("arith",)).assign(exact_match=0.3)
    summary = statistics.summarise(ablation)
    comparisons = statistics.compare(ablation)
    lines = arith.headline_lines(summary, comparisons, pd.DataFrame(
        columns=reference_points.REFERENCE_COLUMNS), "arith", ["baseline", "v1", "v2"])
    assert lines[4].startswith("| variant | seeds | test loss (nats/char) | exact match")
    assert "on whole problems: these runs have no answer loss" in lines[2]
    assert lines[-2].startswith("In test loss against the baseline")
    assert statistics.METRICS["answer_loss"] == ("answer loss", "nats/answer char", False)


def test_the_answer_loss_is_broken_down_by_operation_and_answer_length_as_seed_means():
    per_op = pd.DataFrame([
        {"dataset": "arithmetic", "variant": v, "seed": s, "op": op, "answer_loss": x}
        for v, s, op, x in [("baseline", 0, "add", 0.1), ("baseline", 1, "add", 0.3),
                            ("baseline", 0, "sub", 0.5), ("baseline", 1, "sub", 0.7),
                            ("gelu", 0, "add", 0.2), ("gelu", 1, "add", 0.2)]])
    by_answer = pd.DataFrame([
        {"dataset": "arithmetic", "variant": v, "seed": s, "digits": d, "answer_loss": x}
        for v, s, d, x in [("baseline", 0, 2, 0.4), ("baseline", 1, 2, 0.6),
                           ("gelu", 0, 3, 0.9)]])
    lines = arith.breakdown_lines(per_op, by_answer, "arithmetic", ["baseline", "gelu"])
    table = [line for line in "\n".join(lines).splitlines() if line.startswith("|")]
    assert table[0] == "| variant | add | sub | 2-digit answers | 3-digit answers |"
    assert table[2] == "| baseline | 0.200 | 0.600 | 0.500 | – |"
    assert table[3] == "| gelu | 0.200 | – | – | 0.900 |"
    assert arith.breakdown_lines(per_op, by_answer, "shakespeare", ["baseline"]) == []


def test_every_file_the_report_writes_is_an_output_of_the_report_stage(built):
    """A table missing from dvc.yaml's outs is neither cached nor restored by DVC."""
    import yaml
    _, out_dir, out = built
    outs = yaml.safe_load((Path(__file__).resolve().parents[1] / "dvc.yaml").read_text())[
        "stages"]["report"]["outs"]
    declared = {Path(o).name for o in outs if isinstance(o, str)}
    written = {p.name for p in out_dir.iterdir()} - {"metrics"}  # metrics: DVC metrics
    assert written <= declared, sorted(written - declared)
