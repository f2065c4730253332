"""lmablate.analysis.markdown: report.md's sections, tables and methodology, from the synthetic
study (synthetic_study.py)."""

from __future__ import annotations

import pandas as pd


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
