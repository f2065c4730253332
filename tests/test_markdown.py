"""report.md (lmablate.report.text.content rendered by lmablate.report.text.render): its sections,
tables and methodology, from the synthetic study (synthetic_study.py)."""

from __future__ import annotations

import math
import pandas as pd


def test_report_markdown(built):
    cfg, out_dir, out = built
    md = out["report"].read_text()
    app = out["appendix"].read_text()
    assert out["report"] == out_dir / "report.md" and out["appendix"] == out_dir / "appendix.md"
    # every figure written is linked relatively, in the report or in its appendix
    for p in out["figures"]:
        assert f"](figures/{p.name})" in md + app
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
    findings = md.split("## Findings\n", 1)[1].split("### How to read", 1)[0]
    comparisons = pd.read_csv(out["comparisons"])
    for r in comparisons[comparisons["metric"] == "test_loss"].itertuples():
        if r.dataset == "shakespeare":  # the dataset's headline loss
            assert f"| {r.variant} | " in findings and f"| {r.mean_diff:+.3f} (" in findings
    assert "![shakespeare: test loss, difference to the baseline" in findings
    # methodology from the config and the environment, not typed by hand
    assert "| shakespeare | baseline | 64 | 1,000 | 576,000 | 3.46e+11 | 144.0% |" in md
    assert f"optimizer steps of {cfg.train.batch_size} sequences x 48 tokens" in md
    assert "FLOPs: shakespeare 2.4e+11, arithmetic 1.2e+11" in md
    assert f"context of {cfg.model.context_length} characters" in md
    assert ("successive halving with Optuna: 6 configurations at 0.2 of the budget, then the "
            "full-budget bracket on tuning seed 1000 ([How the learning rate was chosen]"
            "(appendix.md#how-the-learning-rate-was-chosen))") in md
    defined = app.split("\n## How the learning rate was chosen\n", 1)[1].split("\n## ", 1)[0]
    assert ("**The full-budget bracket**: 1 learning rate 2x apart, each on tuning seed 1000 "
            "(not final seeds)") in defined
    assert app.count("Wortsman et al. 2023") == 1 and app.count("1,000 bootstrap draws") == 1
    assert "Wortsman et al. 2023" not in md
    assert "every trial below the full budget on seed 1000" in md
    middle = math.sqrt(cfg.tune.tokens_per_parameter[0] * cfg.tune.tokens_per_parameter[1])
    assert ("3 learning rates evenly spaced in log over the range at the width nearest "
            f"{middle:g}") in md
    assert "3 seeds (0, 1, 2)" in md
    assert "2-core test CPU" in md and "torch 9.9.9-test" in md
    # tuned lr / d_model, parameter counts, throughput
    assert "| baseline | 0.002 | 64 | 1,000 | 105,000 | 100,000 | 600,000 | 40,000 |" in md
    # samples in a code block whose fence survives the ``` inside the sample
    assert "````text\nROMEO (gelu, seed 0):" in app
    assert "`$(0000000782+0000000021)=`" in app and "✗" in app
    # the ignored stale run is mentioned
    assert "not part of the configured study" in md and "shakespeare/old" in md


def test_the_problem_table_is_a_diagnostic_without_verdicts(built):
    cfg, out_dir, out = built
    md = out["report"].read_text()
    part = md.split("### Problem by problem (a diagnostic, not a verdict)\n", 1)[1]
    part = part.split("\n### ", 1)[0]
    assert "A diagnostic, not a verdict: the problems are scored by the same trained" in part
    assert "overstate the evidence" in part and "drawn over seeds" in part
    table = [x for x in part.splitlines() if x.startswith("|")]
    assert len(table) > 2 and "verdict" not in table[0]
    for mark in ("▲", "▼", "**", "better |", "worse |", "better**", "worse**"):
        assert mark not in "\n".join(table), mark


def test_a_problem_level_rejection_still_gets_no_mark_or_verdict_word():
    """A frame whose Holm test rejects (a ``better`` row of problem_comparisons.csv) is drawn
    with its p-values only."""
    from lmablate.report.text.dataset_tables import problem_diagnostic
    from lmablate.report.text.templating import macro_text
    row = {"dataset": "sums", "metric": "exact_match", "baseline": "baseline",
           "variant": "swiglu", "n_problems": 1000, "n_seeds": 5, "baseline_count": 2000,
           "variant_count": 2600, "total": 5000, "baseline_rate": 0.4, "variant_rate": 0.52,
           "n_differing": 300, "mean_diff": 0.12, "ci95_low": 0.1, "ci95_high": 0.14,
           "ci_holm_low": 0.09, "ci_holm_high": 0.15, "p_value": 1e-4, "p_holm": 2e-4,
           "reject_holm": True, "verdict": "better"}
    diagnostic = problem_diagnostic(pd.DataFrame([row, {**row, "variant": "rope",
                                                        "mean_diff": -0.1,
                                                        "verdict": "worse"}]), "sums")
    assert (diagnostic.n_problems, diagnostic.n_seeds) == (1000, 5)
    text = macro_text("_tables.md.j2", "problems", rows=diagnostic.rows)
    assert ("| exact match (higher is better) | swiglu | 2,000 → 2,600 of 5,000 | "
            "0.120 [0.090, 0.150] | 300 of 1,000 | <0.001 |") in text
    # character accuracy rows stay in problem_comparisons.csv when exact match is there
    chars = {**row, "metric": "char_accuracy"}
    assert len(problem_diagnostic(pd.DataFrame([row, chars]), "sums").rows) == 1
    for mark in ("▲", "▼", "**", "better |", "worse |"):
        assert mark not in text, mark


def test_gradient_shares_are_a_csv_not_a_finding_or_a_figure(built):
    cfg, out_dir, out = built
    md = out["report"].read_text()
    findings = md.split("## Findings\n", 1)[1].split("### How to read", 1)[0]
    assert "gradient" not in findings.lower() and "attention" not in findings.lower()
    assert "grad_flow" not in md.replace("`grad_flow.csv`", "")
    assert not list((out_dir / "figures").glob("grad_flow*"))
    grad = pd.read_csv(out["grad_flow"])
    assert set(grad["dataset"]) == {"shakespeare"} and grad["frac_near_zero"].between(0, 1).all()


def test_the_methods_text_names_one_tuning_seed_or_several():
    from lmablate.config.study import TuneConfig
    from lmablate.report.text.methods import METHODS
    from lmablate.report.text.mdtable import tuning_seeds
    from lmablate.report.text.templating import macro_text

    def rungs(tune: TuneConfig) -> str:
        return macro_text(METHODS, "rungs", tu=tune, seeds=tuning_seeds(tune))
    assert "bracket on tuning seed 1000 (" in rungs(TuneConfig(bracket_seeds=1))
    assert "bracket on tuning seeds 1000, 1001 (" in rungs(TuneConfig(bracket_seeds=2))


def test_the_comparison_table_gives_each_number_once_the_means_being_the_summary_s(built):
    _, _, out = built
    md = out["report"].read_text()
    table = md.split("## shakespeare\n", 1)[1].split("### Comparison with the baseline\n", 1)[1]
    header = next(x for x in table.splitlines() if x.startswith("|"))
    assert header == ("| metric | variant | paired seeds | Δ (variant − baseline) | 95% CI of Δ "
                      "(raw) | CI of Δ (Holm-adjusted) | p (Holm) | MDE (80% power) | verdict |")
