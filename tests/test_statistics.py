"""lmablate.report.stats.statistics: intervals over seeds, paired comparisons with the baseline,
Holm's correction, detectable effects and the tuning variation, against scipy and statsmodels
and on the synthetic study (synthetic_study.py), whose verdicts are known by construction."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from statsmodels.stats.multitest import multipletests

from lmablate.report import collect
from lmablate.report.stats import statistics
from lmablate.stages import report

from synthetic_study import (DATASETS, EXPECTED_VERDICTS, VARIANTS, make_cfg,
                             random_ablation, true_test_loss, write_runs)


def test_summary_csv_schema_and_interval(built):
    _, _, out = built
    s = pd.read_csv(out["summary"])
    assert list(s.columns) == ["dataset", "variant", "metric", "n", "mean", "std",
                               "ci95_low", "ci95_high"]
    assert not ((s["dataset"] == "shakespeare") & (s["metric"] == "exact_match")).any()
    cell = s[(s["dataset"] == "arithmetic") & (s["variant"] == "gelu")
             & (s["metric"] == "test_loss")].iloc[0]
    x = np.array([true_test_loss("arithmetic", "gelu", i) for i in range(3)])
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
    base = np.array([true_test_loss("arithmetic", "baseline", i) for i in range(3)])
    var = np.array([true_test_loss("arithmetic", "rmsnorm", i) for i in range(3)])
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
    assert "| machine | not recorded" in md


@pytest.mark.parametrize("seed", range(5))
def test_summarise_interval_is_scipy_t_interval(seed):
    rng = np.random.default_rng(seed)
    df = random_ablation(rng, n_seeds=int(rng.integers(2, 9)))
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
        if r.metric == "char_accuracy":  # a fraction: the interval within [0, 1]
            want = tuple(np.clip(want, 0.0, 1.0))
        assert (r.ci95_low, r.ci95_high) == pytest.approx(want, rel=1e-12)
        assert r.ci95_low < r.mean < r.ci95_high
        # the figures' errorbar callable is the same interval, computed the same way
        errorbar = (statistics.fraction_interval if r.metric == "char_accuracy"
                    else statistics.t_interval)
        assert errorbar(x) == tuple(float(v) for v in want)


@pytest.mark.filterwarnings("ignore:Precision loss:RuntimeWarning")  # scipy, zero variance
@pytest.mark.parametrize("seed", range(5))
def test_compare_interval_is_ttest_rel_confidence_interval(seed):
    rng = np.random.default_rng(100 + seed)
    n_seeds = int(rng.integers(statistics.MIN_SEEDS_FOR_TEST, 9))
    df = random_ablation(rng, n_seeds, variants=("baseline", "v1", "v2", "same", "shifted"))
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
        if r.metric == "char_accuracy":  # a difference of fractions: within [-1, 1]
            low, high = max(-1.0, low), min(1.0, high)
            assert -1 <= r.ci_holm_low and r.ci_holm_high <= 1
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


def test_statistics_follow_the_categorical_order_not_the_row_order():
    rng = np.random.default_rng(7)
    df = random_ablation(rng, n_seeds=3, variants=("v2", "baseline", "v1"), datasets=("b", "a"))
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


def test_intervals_of_fractions_stay_in_their_range_and_keep_their_verdicts():
    """Exact match per seed is bimodal (a seed learns the task or does not): a t-interval
    runs past 0 or 1, and summary.csv, comparisons.csv and the figures clip it there; a
    clipped interval covers the true mean as often, and excludes 0 exactly when it did."""
    learnt = [0.018, 0.811, 0.811, 0.794, 0.505]
    failed = [0.0, 0.0, 0.0, 0.02, 0.9]
    df = pd.DataFrame({"dataset": "arithmetic", "variant": ["baseline"] * 5 + ["swiglu"] * 5,
                       "seed": list(range(5)) * 2, "exact_match": failed + learnt,
                       "test_loss": np.linspace(1.0, 1.9, 10)})
    s = statistics.summarise(df, ["exact_match", "test_loss"]).set_index(["variant", "metric"])
    raw = statistics.t_interval(failed)
    assert raw[0] < 0  # the unclipped interval leaves [0, 1]
    assert (s.loc[("baseline", "exact_match"), "ci95_low"],
            s.loc[("baseline", "exact_match"), "ci95_high"]) == pytest.approx((0.0, raw[1]))
    assert statistics.fraction_interval(failed) == (0.0, raw[1])
    assert statistics.fraction_interval([1.0, 1.0, 1.0]) == (1.0, 1.0)
    assert statistics.fraction_interval([0.2, 1.0, 1.0])[1] == 1.0
    assert statistics.fraction_bounds("exact_match_d3") == (0.0, 1.0)
    assert statistics.fraction_bounds("test_loss") is None
    flipped = [1.0, 1.0, 1.0, 0.0, 0.0] + [0.0, 0.0, 0.0, 1.0, 1.0]
    c = statistics.compare(df.assign(exact_match=flipped), metrics=("exact_match",))
    r = c.iloc[0]
    assert (r.ci95_low, r.ci95_high, r.ci_holm_low, r.ci_holm_high) == (-1.0, 1.0, -1.0, 1.0)
    assert r.verdict == statistics.VERDICT_NSD
