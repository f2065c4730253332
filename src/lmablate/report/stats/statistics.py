"""The study's t-intervals over seeds, paired t-tests against the baseline with Holm's
correction, and their check against the tuning uncertainty. Units: those of :data:`METRICS`."""

from __future__ import annotations

import gc
import math
import re
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd
from scipy import stats
from statsmodels.stats.multitest import multipletests

from lmablate.report.collect import BASELINE, present, with_order

ALPHA = 0.05  # family-wise error rate of the Holm-corrected comparisons
CONFIDENCE = 0.95  # level of every interval in the report
MIN_SEEDS_FOR_TEST = 3  # with 2 pairs a t-test has 1 degree of freedom: no power, no verdict
POWER = 0.8  # power at which the minimum detectable effect is stated (Cohen 1988's convention)

SUMMARY_COLUMNS = "dataset variant metric n mean std ci95_low ci95_high".split()
COMPARISON_COLUMNS = ("dataset metric higher_is_better baseline variant n_pairs baseline_mean "
                      "variant_mean mean_diff sd_diff ci95_low ci95_high ci_holm_low ci_holm_high "
                      "t_stat p_value p_holm reject_holm mde verdict tuning_uncertainty").split()
INTERVAL_COLUMNS = ("ci95_low", "ci95_high", "ci_holm_low", "ci_holm_high")

ANSWER_LOSS = "answer_loss"  # the headline where a dataset has it (lmablate.report.headline)
TEXT_LOSS = "test_loss"  # the headline otherwise, and always a column of its own
# metric -> (label, unit, higher_is_better); the order is the order of the summary tables.
METRICS: dict[str, tuple[str, str, bool | None]] = {
    "test_loss": ("test loss", "nats/char", False),
    "answer_loss": ("answer loss", "nats/answer char", False),
    "val_loss": ("validation loss", "nats/char", False),
    "bits_per_char": ("bits per char", "bits/char", False), "perplexity": ("perplexity", "", False),
    "char_accuracy": ("char accuracy", "fraction", True),
    "exact_match": ("exact match", "fraction", True), "train_seconds": ("train time", "s", None),
    "tokens_per_second": ("throughput", "tokens/s", None)}
COMPARED_METRICS = ("test_loss", "answer_loss", "exact_match", "char_accuracy")

VERDICT_BETTER, VERDICT_WORSE, VERDICT_NSD = "better", "worse", "no significant difference"
VERDICT_FEW = "too few seeds"
VERDICT_IDENTICAL = "identical on every seed"  # a constant difference: no spread, no test
VERDICT_UNDECIDED_TUNING = "undecided (tuning)"  # significant, but within tuning uncertainty
# tuning objective (best.json) -> the test metric in its units, the only one whose verdicts
# its tuning uncertainty can check; the mean answer loss over a run checks none
TUNED_METRIC = "test_loss"
TUNED_METRICS = {"val_loss": TUNED_METRIC, "val_answer_loss": "answer_loss",
                 "val_answer_loss_mean": None}


def fraction_bounds(metric: str) -> tuple[float, float] | None:
    """``(0, 1)`` for a fraction (unit "fraction" in :data:`METRICS`, ``exact_match_d<n>``), else
    None: the range its intervals are clipped to (which keeps their coverage)."""
    fraction = METRICS.get(metric, ("", ""))[1] == "fraction"
    return (0.0, 1.0) if fraction or re.fullmatch(r"exact_match_d\d+", metric) else None


def mean_interval(mean: Any, sem: Any, n: Any) -> tuple[np.ndarray, np.ndarray]:
    """Elementwise ``scipy.stats.t.interval(CONFIDENCE, n - 1, loc=mean, scale=sem)``: NaN for
    n < 2, the point ``(mean, mean)`` for ``sem == 0`` (where scipy gives NaN)."""
    mean, sem, n = np.broadcast_arrays(*(np.asarray(a, dtype=float) for a in (mean, sem, n)))
    df = np.where(n > 1, n - 1, np.nan)
    with np.errstate(invalid="ignore"):  # NaN arguments give NaN, silently
        low, high = stats.t.interval(CONFIDENCE, df, loc=mean, scale=np.where(sem > 0, sem,
                                                                               np.nan))
    point = (n > 1) & (sem == 0)
    return np.where(point, mean, low), np.where(point, mean, high)


def t_interval(values: Iterable[float]) -> tuple[float, float]:
    """:func:`mean_interval` of the finite ``values`` (standard error ``scipy.stats.sem``), in
    their unit; ``(nan, nan)`` with fewer than two. Also seaborn's ``errorbar`` callable."""
    x = np.asarray([v for v in values if np.isfinite(v)], dtype=float)
    if len(x) < 2:
        return (math.nan, math.nan)
    return tuple(float(v) for v in mean_interval(x.mean(), stats.sem(x), len(x)))


def fraction_interval(values: Iterable[float]) -> tuple[float, float]:
    """:func:`t_interval` of fractions clipped to [0, 1]; seaborn's ``errorbar`` callable."""
    return tuple(v if math.isnan(v) else min(1.0, max(0.0, v)) for v in t_interval(values))


def summarise(df: pd.DataFrame, metrics: Sequence[str] | None = None) -> pd.DataFrame:
    """Per dataset x variant x metric with a value of the ablation table (``dataset``,
    ``variant``, ``seed``, metrics): :data:`SUMMARY_COLUMNS`, ``std`` with ddof=1 and
    :func:`mean_interval` clipped to :func:`fraction_bounds`, in ``df``'s (categorical) order."""
    metrics = [m for m in (metrics or METRICS) if m in df.columns]
    if df.empty or not metrics:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    long = with_order(df).melt(id_vars=["dataset", "variant", "seed"], value_vars=metrics,
                               var_name="metric", value_name="value")
    long["value"] = pd.to_numeric(long["value"], errors="coerce").astype(float)
    long = long.dropna(subset=["value"])
    long["metric"] = pd.Categorical(long["metric"], categories=metrics, ordered=True)
    # sort=False, then sort the result: groupby's sorted path may reorder a group's rows and so
    # change the last bit of its mean; this way every mean sums its seeds in row order
    out = (long.groupby(["dataset", "variant", "metric"], observed=True, sort=False)["value"]
           .agg(n="count", mean="mean", std="std")
           .sort_index(kind="stable").reset_index())
    out["metric"] = out["metric"].astype(str)
    out["ci95_low"], out["ci95_high"] = mean_interval(
        out["mean"], out["std"] / np.sqrt(out["n"]), out["n"])
    rows = out["metric"].map(fraction_bounds).notna()
    out.loc[rows, ["ci95_low", "ci95_high"]] = out.loc[rows, ["ci95_low", "ci95_high"]].clip(0, 1)
    out["n"] = out["n"].astype(int)
    return out[SUMMARY_COLUMNS]


def holm_interval(mean: float, sem: float, df: float, p_value: float, p_holm: float,
                  alpha: float = ALPHA) -> tuple[float, float]:
    """The t-interval of a mean difference at level ``1 - alpha * p_value / p_holm``, at which
    its Holm-adjusted p-value is judged: it excludes 0 exactly when Holm's procedure (Holm 1979)
    rejects. In the unit of ``mean``; ``(nan, nan)`` if an input is missing."""
    if not all(np.isfinite([mean, sem, df, p_value, p_holm])) or p_holm <= 0:
        return (math.nan, math.nan)
    if sem == 0:
        return (mean, mean)
    return tuple(float(v) for v in stats.t.interval(1.0 - alpha * p_value / p_holm, df, loc=mean,
                                                    scale=sem))


def min_detectable_effect(sd: float, n: int, alpha: float = ALPHA,
                          power: float = POWER) -> float:
    """Smallest true mean difference a two-sided paired t-test on ``n`` pairs with SD ``sd``
    detects with probability ``power`` at level ``alpha`` (``statsmodels`` ``TTestPower``; Cohen
    1988, ch. 2), in the unit of ``sd``; NaN with ``n`` < 2 or a missing ``sd``."""
    if n < 2 or not np.isfinite(sd):
        return math.nan
    from statsmodels.stats.power import TTestPower  # imported on use: only the report needs it
    return float(TTestPower().solve_power(effect_size=None, nobs=n, alpha=alpha, power=power,
                                          alternative="two-sided")) * sd


def holm_p(rows: list[dict], family: list[int], alpha: float) -> list[bool]:
    """Holm's step-down method (Holm 1979) over ``rows[i]["p_value"]``, i in ``family``: sets
    their ``p_holm``, returns which are rejected at family-wise ``alpha``."""
    if not family:
        return []
    # statsmodels' Holm ends in gc.collect(): with the report's torch and matplotlib heap that
    # is 0.6 s a call; frozen objects are skipped by it (gc.freeze), and nothing here is garbage
    gc.freeze()
    try:
        reject, p_holm, _, _ = multipletests([rows[i]["p_value"] for i in family],
                                             alpha=alpha, method="holm")
    finally:
        gc.unfreeze()
    for i, p in zip(family, p_holm):
        rows[i]["p_holm"] = float(p)
    return [bool(x) for x in reject]


def holm_correct(rows: list[dict], family: list[int], alpha: float, higher: bool) -> None:
    """:func:`holm_p` over ``rows[i]`` for i in ``family``, in place, with ``reject_holm``, the
    :func:`holm_interval` (from ``_sem``/``_df``) and the better/worse verdict of a rejection."""
    for i, rej in zip(family, holm_p(rows, family, alpha)):
        r = rows[i]
        r["reject_holm"] = rej
        r["ci_holm_low"], r["ci_holm_high"] = holm_interval(
            r["mean_diff"], r.pop("_sem"), r.pop("_df"), r["p_value"], r["p_holm"], alpha)
        if rej:
            r["verdict"] = VERDICT_BETTER if (r["mean_diff"] > 0) == higher else VERDICT_WORSE


def _paired_row(pair: pd.DataFrame, dataset: str, metric: str, baseline: str,
                variant: str) -> dict:
    """A row of :func:`compare` from ``pair``, a seed per row (``scipy.stats.ttest_rel``)."""
    n = len(pair)
    base, var = pair[baseline].to_numpy(float), pair[variant].to_numpy(float)
    diff = var - base
    row = {"dataset": dataset, "metric": metric, "higher_is_better": bool(METRICS[metric][2]),
           "baseline": baseline, "variant": variant, "n_pairs": n,
           **dict.fromkeys(COMPARISON_COLUMNS[6:-1], math.nan), "reject_holm": False,
           "verdict": VERDICT_FEW}
    if n:
        row.update(baseline_mean=float(pair[baseline].mean()), mean_diff=float(diff.mean()),
                   variant_mean=float(pair[variant].mean()))
    if n > 1:
        row["sd_diff"] = float(diff.std(ddof=1))
    if n < MIN_SEEDS_FOR_TEST:
        return row
    # a constant difference (to 1e-12 of its size) has no spread to test against
    if np.ptp(diff) <= 1e-12 * max(1.0, float(np.max(np.abs(diff)))):
        row.update(verdict=VERDICT_IDENTICAL, sd_diff=0.0,
                   **dict.fromkeys(INTERVAL_COLUMNS, float(diff.mean())))
        return row
    res = stats.ttest_rel(var, base)
    low, high = res.confidence_interval(confidence_level=CONFIDENCE)
    row.update(ci95_low=float(low), ci95_high=float(high), t_stat=float(res.statistic),
               p_value=float(res.pvalue), verdict=VERDICT_NSD,
               _sem=row["sd_diff"] / math.sqrt(n), _df=n - 1)
    return row


def compare(df: pd.DataFrame, baseline: str = BASELINE, alpha: float = ALPHA,
            metrics: Sequence[str] = COMPARED_METRICS) -> pd.DataFrame:
    """Every variant against ``baseline`` per dataset and metric, paired by seed: paired t-test
    and interval of ``variant - baseline``, Holm's step-down correction (Holm 1979, Scand. J.
    Statist. 6:65-70) over each dataset x metric's tested variants, fractions' intervals clipped
    to [-1, 1]. "too few seeds" (< :data:`MIN_SEEDS_FOR_TEST`) and "identical on every seed" are
    untested; ``mde`` at level ``alpha / m`` (m tested). :data:`COMPARISON_COLUMNS`, in the
    metric's unit, in ``df``'s order and dtypes."""
    df = with_order(df)
    rows = []
    for dataset, d in df.groupby("dataset", observed=True):
        variants = [v for v in present(d["variant"]) if v != baseline]
        for metric in (m for m in metrics if m in d.columns):
            wide = (d.pivot_table(index="seed", columns="variant", values=metric,
                                  aggfunc="mean", observed=True)
                    .reindex(columns=[baseline, *variants]))  # all-NaN columns come back NaN
            if not wide[baseline].notna().any():
                continue
            new = [_paired_row(wide[[baseline, variant]].dropna(),  # the seeds both have
                               dataset, metric, baseline, variant) for variant in variants]
            family = [i for i, row in enumerate(new) if row["verdict"] == VERDICT_NSD]
            holm_correct(new, family, alpha, bool(METRICS[metric][2]))
            for i in family:
                new[i]["mde"] = min_detectable_effect(new[i]["sd_diff"], new[i]["n_pairs"],
                                                      alpha / len(family))
            if fraction_bounds(metric) is not None:  # clipping never moves 0 in or out
                for row in new:
                    row.update({c: float(np.clip(row[c], -1.0, 1.0)) for c in INTERVAL_COLUMNS})
            rows += new
    out = pd.DataFrame(rows, columns=COMPARISON_COLUMNS)
    out[["reject_holm", "higher_is_better"]] = out[["reject_holm", "higher_is_better"]].astype(bool)
    for col in ("dataset", "variant"):
        out[col] = out[col].astype(str).astype(df[col].dtype)
    return out


def tuning_check(comparisons: pd.DataFrame, tuned: pd.DataFrame) -> pd.DataFrame:
    """``comparisons`` with ``tuning_uncertainty``, the larger of the pair's (``tuned``'s: the
    95th percentile of the regret) on the rows of the tuning objective's metric
    (:data:`TUNED_METRICS`); a better/worse verdict there is :data:`VERDICT_UNDECIDED_TUNING`
    when it is unmeasured or the Holm interval moved towards 0 by it includes 0."""
    out = comparisons.assign(tuning_uncertainty=np.nan)
    if out.empty or tuned is None or tuned.empty or "tuning_uncertainty" not in tuned:
        return out
    key = {(str(r.dataset), str(r.variant)): (r.bracket_state, r.tuning_uncertainty)
           for r in tuned.itertuples()}
    objectives = tuned.get("objective", pd.Series(None, tuned.index, dtype=object))
    metric_of = {str(d): TUNED_METRICS.get(str(o), TUNED_METRIC)
                 for d, o in zip(tuned["dataset"], objectives)}
    for i, row in out.iterrows():
        if row["metric"] != metric_of.get(str(row["dataset"]), TUNED_METRIC):
            continue
        pair = [key.get((str(row["dataset"]), str(v))) for v in (row["variant"], row["baseline"])]
        if any(p is None or pd.isna(p[0]) for p in pair):
            continue  # no bracket: a study tuned without one
        u = float(np.max([math.nan if p[1] is None else float(p[1]) for p in pair]))
        out.at[i, "tuning_uncertainty"] = u
        if row["verdict"] in (VERDICT_BETTER, VERDICT_WORSE) and (
                math.isnan(u) or row["ci_holm_low"] - u <= 0 <= row["ci_holm_high"] + u):
            out.at[i, "verdict"] = VERDICT_UNDECIDED_TUNING
    return out
