"""Which seeds learned the arithmetic task (lmablate.report.stats.success): the threshold, the
Clopper-Pearson interval of their share at its ends, and the seeds named."""


import numpy as np
import pandas as pd
import pytest
from scipy import stats

from lmablate.report.stats import success
from lmablate.report.text import findings


def test_the_share_interval_is_clopper_pearson_and_closed_at_zero_and_all():
    for n in (1, 5, 12):
        # the exact interval's ends have closed forms at 0 and n successes
        assert success.share_interval(0, n) == pytest.approx((0.0, 1 - 0.025 ** (1 / n)))
        assert success.share_interval(n, n) == pytest.approx((0.025 ** (1 / n), 1.0))
    low, high = success.share_interval(3, 5)
    # inside: the beta quantiles (Clopper & Pearson 1934)
    assert (low, high) == pytest.approx((stats.beta.ppf(0.025, 3, 3), stats.beta.ppf(0.975, 4, 2)))
    with pytest.raises(ValueError):
        success.share_interval(6, 5)


def _ablation(values):
    return pd.DataFrame([{"dataset": "arithmetic", "variant": v, "seed": s, "exact_match": x}
                         for v, xs in values.items() for s, x in enumerate(xs)]
                        + [{"dataset": "shakespeare", "variant": "baseline", "seed": 0,
                            "exact_match": np.nan}])


def test_the_table_counts_the_seeds_that_learned_and_names_those_that_did_not():
    a = _ablation({"baseline": [0.477, 0.9, 0.51, 0.02, 0.8],
                   "swiglu": [0.018, 0.811, 0.811, 0.794, 0.505],
                   "rope": [0.6, 0.7, 0.8, 0.9, 1.0]})
    t = success.success_table(a).set_index("variant")
    assert list(t.index) == ["baseline", "swiglu", "rope"]  # the study order; no text rows
    assert t.loc["baseline", ["n_seeds", "n_learned", "share"]].tolist() == [5, 3, 0.6]
    assert t.loc["baseline", "not_learned"] == "0 (0.477); 3 (0.020)"
    assert t.loc["swiglu", "not_learned"] == "0 (0.018)"
    assert t.loc["rope", "not_learned"] == "" and t.loc["rope", "ci95_high"] == 1.0
    assert success.learned(success.LEARNED_EXACT_MATCH) and not success.learned(0.4999)
    line = findings.success_lines(t.reset_index(), "arithmetic")
    assert line == [
        "- **Seeds that learned the task** (test exact match ≥ 0.5; share with its 95% "
        "Clopper-Pearson interval): baseline 3/5 (0.60 [0.15, 0.95]), swiglu 4/5 (0.80 "
        "[0.28, 0.99]), rope 5/5 (1.00 [0.48, 1.00]). Did not learn (seed, exact match): "
        "baseline seeds 0 (0.477), 3 (0.020); swiglu seed 0 (0.018)."]
    assert findings.success_lines(t.reset_index(), "shakespeare") == []
    assert success.success_table(a.drop(columns="exact_match")).empty


def test_a_seed_status_says_its_exact_match_and_whether_it_learned():
    a = _ablation({"swiglu": [0.018, 0.811]})
    assert success.seed_status(a, "arithmetic", "swiglu", 0) == (
        "exact match 0.018: did not learn")
    assert success.seed_status(a, "arithmetic", "swiglu", 1) == "exact match 0.811: learned"
    assert success.seed_status(a, "arithmetic", "swiglu", 7) is None
    assert success.seed_status(a, "shakespeare", "baseline", 0) is None


def test_the_report_writes_the_share_names_failed_seeds_and_labels_predictions(built):
    """End to end on the synthetic study: success.csv, its findings bullet under the
    arithmetic dataset, and each prediction table headed by its seed's status."""
    _, reports, out = built
    table = pd.read_csv(out["success"], keep_default_na=False)
    assert list(table.columns) == success.SUCCESS_COLUMNS
    ablation = pd.read_csv(out["ablation"])
    arith = ablation[ablation["exact_match"].notna()]
    assert len(table) == arith.groupby(["dataset", "variant"]).ngroups
    for r in table.itertuples():
        em = arith[(arith["dataset"] == r.dataset) & (arith["variant"] == r.variant)]
        assert r.n_learned == int((em["exact_match"] >= success.LEARNED_EXACT_MATCH).sum())
    findings = (reports / "report.md").read_text().split("## Findings", 1)[1].split("\n## ", 1)[0]
    md = (reports / "appendix.md").read_text()  # the predictions: report.md links there
    assert findings.count("**Seeds that learned the task**") == len(set(table["dataset"]))
    predictions = md.split("### Predictions", 1)[1].split("\n## ", 1)[0]
    heads = [line for line in predictions.splitlines() if line.startswith("**")]
    assert heads and all(": learned):" in h or ": did not learn):" in h for h in heads)
