"""Statistics of the study: intervals over seeds and paired tests against the baseline.

* :func:`summarise`: per dataset x variant x metric, the mean over seeds, the sample SD and the
  two-sided :data:`CONFIDENCE` Student-t interval of the mean (``scipy.stats.t.interval``).
* :func:`compare`: every variant against :data:`~lmablate.report.collect.BASELINE`, paired by
  seed: the paired t-test and the t-interval of the mean difference (``scipy.stats.ttest_rel``
  and its ``confidence_interval``), corrected for multiple comparisons with Holm's step-down
  method (Holm 1979, "A simple sequentially rejective multiple test procedure", Scand. J.
  Statist. 6:65-70; ``statsmodels.stats.multitest.multipletests(method="holm")``).
* :func:`detectable_effects`: per dataset x metric, the smallest difference the paired test
  could detect with 80% power at the study's seed count, given the observed spread.
* :func:`tuning_check`: a verdict in the tuned metric checked against the tuning uncertainty.

Arithmetic variants against the baseline problem by problem are
:func:`lmablate.report.stats.problems.compare_problems`, on this module's Holm correction.

Units are those of the metrics (:data:`METRICS`): losses in nats/char (the answer loss in nats
per answer character), bits per char, perplexity unitless, accuracies as fractions in [0, 1],
times in seconds."""

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

SUMMARY_COLUMNS = ["dataset", "variant", "metric", "n", "mean", "std", "ci95_low", "ci95_high"]
COMPARISON_COLUMNS = [
    "dataset", "metric", "higher_is_better", "baseline", "variant", "n_pairs", "baseline_mean",
    "variant_mean", "mean_diff", "sd_diff", "ci95_low", "ci95_high", "ci_holm_low",
    "ci_holm_high", "t_stat", "p_value", "p_holm", "reject_holm", "mde", "verdict",
    "tuning_uncertainty",
]

ANSWER_LOSS = "answer_loss"  # the headline where a dataset has it (lmablate.report.headline)
TEXT_LOSS = "test_loss"  # the headline otherwise, and always a column of its own
# metric -> (label, unit, higher_is_better); the order is the order of the summary tables.
METRICS: dict[str, tuple[str, str, bool | None]] = {
    "test_loss": ("test loss", "nats/char", False),
    "answer_loss": ("answer loss", "nats/answer char", False),
    "val_loss": ("validation loss", "nats/char", False),
    "bits_per_char": ("bits per char", "bits/char", False),
    "perplexity": ("perplexity", "", False),
    "char_accuracy": ("char accuracy", "fraction", True),
    "exact_match": ("exact match", "fraction", True),
    "train_seconds": ("train time", "s", None),
    "tokens_per_second": ("throughput", "tokens/s", None),
}
# Metrics whose values are fractions in [0, 1] (and so their differences in [-1, 1]); an
# arithmetic length's exact match (``exact_match_d<n>``, analysis.arithmetic) is one too.
FRACTION_METRICS = frozenset(m for m, (_, unit, _) in METRICS.items() if unit == "fraction")


def fraction_bounds(metric: str) -> tuple[float, float] | None:
    """``(0, 1)`` for a metric that is a fraction (:data:`FRACTION_METRICS`, or
    ``exact_match_d<n>``), None otherwise: the range its intervals are clipped to. Clipping
    an interval to the range of the parameter keeps its coverage: a true mean in [0, 1] that
    lies in [low, high] lies in [max(low, 0), min(high, 1)]."""
    if metric in FRACTION_METRICS or re.fullmatch(r"exact_match_d\d+", metric):
        return (0.0, 1.0)
    return None


# Metrics tested against the baseline (when the dataset has them at all).
COMPARED_METRICS = ("test_loss", "answer_loss", "exact_match", "char_accuracy")

VERDICT_BETTER = "better"
VERDICT_WORSE = "worse"
VERDICT_NSD = "no significant difference"
VERDICT_FEW = "too few seeds"
VERDICT_IDENTICAL = "identical on every seed"  # a constant difference: no spread, no test
# a Holm-significant effect that the variants' tuning uncertainty could explain (tuning_check)
VERDICT_UNDECIDED_TUNING = "undecided (tuning)"
# the test metric in the units of each tuning objective (best.json's ``objective``): the only
# one whose verdicts the tuning uncertainty, measured in that objective, can check. A text
# dataset is tuned on the validation loss (nats/char), an arithmetic one on the answer loss of
# validation problems (nats per answer character, lmablate.evaluate.answer_probe); its mean over a
# run (tune.arithmetic_objective: mean) is the metric of no verdict, so it checks none
TUNED_METRIC = "test_loss"
TUNED_METRICS = {"val_loss": TUNED_METRIC, "val_answer_loss": "answer_loss",
                 "val_answer_loss_mean": None}


def mean_interval(mean: Any, sem: Any, n: Any) -> tuple[np.ndarray, np.ndarray]:
    """Two-sided :data:`CONFIDENCE` Student-t interval of a mean, elementwise:
    ``scipy.stats.t.interval(CONFIDENCE, n - 1, loc=mean, scale=sem)``.

    NaN for n < 2 (no spread estimate). With ``sem == 0`` (all values equal) the interval is
    the point ``(mean, mean)``, the limit of the interval as the spread goes to 0; scipy would
    give NaN, as it rejects a zero scale.
    """
    mean, sem, n = np.broadcast_arrays(*(np.asarray(a, dtype=float) for a in (mean, sem, n)))
    df = np.where(n > 1, n - 1, np.nan)
    with np.errstate(invalid="ignore"):  # NaN arguments give NaN, silently
        low, high = stats.t.interval(CONFIDENCE, df, loc=mean, scale=np.where(sem > 0, sem,
                                                                               np.nan))
    point = (n > 1) & (sem == 0)
    return np.where(point, mean, low), np.where(point, mean, high)


def t_interval(values: Iterable[float]) -> tuple[float, float]:
    """:data:`CONFIDENCE` Student-t interval of the mean of ``values`` (NaNs dropped):
    ``scipy.stats.t.interval`` with ``n - 1`` degrees of freedom around the mean, scaled by the
    standard error ``scipy.stats.sem`` (SD with ddof=1 over sqrt(n)); in the unit of ``values``.
    ``(nan, nan)`` with fewer than two values, ``(mean, mean)`` when they are all equal.
    Also seaborn's ``errorbar`` callable."""
    x = np.asarray([v for v in values if np.isfinite(v)], dtype=float)
    if len(x) < 2:
        return (math.nan, math.nan)
    low, high = mean_interval(x.mean(), stats.sem(x), len(x))
    return (float(low), float(high))


def fraction_interval(values: Iterable[float]) -> tuple[float, float]:
    """:func:`t_interval` of fractions, clipped to [0, 1] (:func:`fraction_bounds`); seaborn's
    ``errorbar`` callable for exact match and char accuracy."""
    low, high = t_interval(values)
    return (low if math.isnan(low) else min(1.0, max(0.0, low)),
            high if math.isnan(high) else min(1.0, max(0.0, high)))


def summarise(df: pd.DataFrame, metrics: Sequence[str] | None = None) -> pd.DataFrame:
    """Mean and :data:`CONFIDENCE` Student-t interval of each metric over seeds, per
    dataset x variant.

    Args:
        df: the ablation table (:attr:`~lmablate.report.collect.RunOutputs.ablation`): columns
            ``dataset``, ``variant``, ``seed`` and the metrics.
        metrics: columns to summarise (default: those of :data:`METRICS`).

    Returns:
        Long format, columns :data:`SUMMARY_COLUMNS`, one row per dataset x variant x metric
        with at least one value, in the metric's unit: ``n`` (seeds with a value), ``mean``,
        ``std`` (sample SD, ddof=1), ``ci95_low``/``ci95_high`` =
        ``scipy.stats.t.interval(CONFIDENCE, n - 1, loc=mean, scale=std / sqrt(n))``, i.e.
        mean -/+ t_{0.975, n-1} * std / sqrt(n), clipped to [0, 1] for a fraction
        (:func:`fraction_bounds`). With n = 1, std and the interval are NaN (one
        seed says nothing about seed variance); with std = 0 the interval is (mean, mean).
        Rows in the order of ``df``'s categorical ``dataset``/``variant`` columns (of first
        appearance for plain columns), then of ``metrics``; those columns keep their dtype.
    """
    metrics = [m for m in (metrics or METRICS) if m in df.columns]
    if df.empty or not metrics:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    df = with_order(df)
    long = df.melt(id_vars=["dataset", "variant", "seed"], value_vars=metrics,
                   var_name="metric", value_name="value")
    long["value"] = pd.to_numeric(long["value"], errors="coerce").astype(float)
    long = long.dropna(subset=["value"])
    # a categorical metric sorts in the requested order, after dataset and variant
    long["metric"] = pd.Categorical(long["metric"], categories=metrics, ordered=True)
    # sort=False, then sort the result: groupby's sorted path may reorder a group's rows and so
    # change the last bit of its mean; this way every mean sums its seeds in row order
    out = (long.groupby(["dataset", "variant", "metric"], observed=True, sort=False)["value"]
           .agg(n="count", mean="mean", std="std")
           .sort_index(kind="stable").reset_index())
    out["metric"] = out["metric"].astype(str)
    out["ci95_low"], out["ci95_high"] = mean_interval(
        out["mean"], out["std"] / np.sqrt(out["n"]), out["n"])
    for metric in out["metric"].unique():  # a fraction's interval within [0, 1]
        bounds = fraction_bounds(metric)
        if bounds is not None:
            rows = out["metric"] == metric
            out.loc[rows, ["ci95_low", "ci95_high"]] = out.loc[
                rows, ["ci95_low", "ci95_high"]].clip(*bounds)
    out["n"] = out["n"].astype(int)
    return out[SUMMARY_COLUMNS]


def _constant(diff: np.ndarray) -> bool:
    """Whether every difference is the same number (to rounding: 1e-12 of its size), so that
    there is no spread to test against."""
    return bool(np.ptp(diff) <= 1e-12 * max(1.0, float(np.max(np.abs(diff)))))


def _paired_test(variant: np.ndarray, base: np.ndarray) -> dict[str, float]:
    """Paired t-test of ``variant - base`` (``scipy.stats.ttest_rel``), the
    :data:`CONFIDENCE` t-interval of the mean difference (its ``confidence_interval``) and the
    sample SD of the differences. Only for differences with a spread (not :func:`_constant`)."""
    diff = variant - base
    res = stats.ttest_rel(variant, base)
    low, high = res.confidence_interval(confidence_level=CONFIDENCE)
    return {"mean_diff": float(diff.mean()), "sd_diff": float(diff.std(ddof=1)),
            "ci95_low": float(low), "ci95_high": float(high), "t_stat": float(res.statistic),
            "p_value": float(res.pvalue)}


def holm_interval(mean: float, sem: float, df: float, p_value: float, p_holm: float,
                  alpha: float = ALPHA) -> tuple[float, float]:
    """The Student-t interval of a mean difference at the level its Holm-adjusted p-value is
    judged at: level ``1 - alpha * p_value / p_holm``.

    For a t-test, the interval at level 1 - g excludes 0 exactly when p < g; with
    g = alpha * p / p_Holm that is when p_Holm < alpha, i.e. exactly when Holm's procedure
    (Holm 1979) rejects, so interval and verdict cannot disagree. For a single comparison it is
    the plain (1 - alpha) interval; for Bonferroni's p_adj = m p it would be Bonferroni's
    simultaneous interval at 1 - alpha/m. It is wider than the unadjusted interval whenever the
    adjustment raised p. In the unit of ``mean``; ``(nan, nan)`` if an input is missing.
    """
    if not all(np.isfinite([mean, sem, df, p_value, p_holm])) or p_holm <= 0:
        return (math.nan, math.nan)
    level = 1.0 - alpha * p_value / p_holm
    if sem == 0:
        return (mean, mean)
    low, high = stats.t.interval(level, df, loc=mean, scale=sem)
    return (float(low), float(high))


def min_detectable_effect(sd: float, n: int, alpha: float = ALPHA,
                          power: float = POWER) -> float:
    """Smallest true mean difference a two-sided paired t-test on ``n`` pairs detects with
    probability ``power`` at level ``alpha``, when the differences have SD ``sd``:
    d * sd, where d is the standardised effect size solved from the noncentral t power function
    (``statsmodels.stats.power.TTestPower().solve_power``; Cohen 1988, ch. 2). In the unit of
    ``sd``; NaN with ``n`` < 2 or a missing ``sd``."""
    if n < 2 or not np.isfinite(sd):
        return math.nan
    from statsmodels.stats.power import TTestPower  # imported on use: only the report needs it
    d = TTestPower().solve_power(effect_size=None, nobs=n, alpha=alpha, power=power,
                                 alternative="two-sided")
    return float(d) * sd


def holm_p(rows: list[dict], family: list[int], alpha: float) -> list[bool]:
    """Holm's step-down method (Holm 1979; ``statsmodels``' ``multipletests``) over
    ``rows[i]["p_value"]`` for i in ``family``: sets each row's ``p_holm``, in place, and
    returns which are rejected at family-wise ``alpha``, in ``family``'s order."""
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
    """Holm's step-down correction over ``rows[i]`` for i in ``family``, in place: ``p_holm``,
    ``reject_holm``, the Holm-adjusted interval (:func:`holm_interval`, from ``_sem``/``_df``)
    and the better/worse verdict of each rejected row."""
    for i, rej in zip(family, holm_p(rows, family, alpha)):
        r = rows[i]
        p = r["p_holm"]
        r["reject_holm"] = rej
        r["ci_holm_low"], r["ci_holm_high"] = holm_interval(
            r["mean_diff"], r.pop("_sem"), r.pop("_df"), r["p_value"], float(p), alpha)
        if rej:
            improved = (r["mean_diff"] > 0) == higher
            r["verdict"] = VERDICT_BETTER if improved else VERDICT_WORSE


def _paired_row(pair: pd.DataFrame, dataset: str, metric: str, higher: bool, baseline: str,
                variant: str) -> dict:
    """One row of :func:`compare` from ``pair`` (a seed per row, columns ``baseline`` and
    ``variant``): "too few seeds", "identical on every seed", or the paired test with the
    verdict "no significant difference" until :func:`holm_correct` judges it."""
    n = len(pair)
    diff = (pair[variant] - pair[baseline]).to_numpy(float)
    row = {
        "dataset": dataset, "metric": metric, "higher_is_better": higher,
        "baseline": baseline, "variant": variant, "n_pairs": n,
        "baseline_mean": float(pair[baseline].mean()) if n else math.nan,
        "variant_mean": float(pair[variant].mean()) if n else math.nan,
        "mean_diff": float(diff.mean()) if n else math.nan,
        "sd_diff": float(diff.std(ddof=1)) if n > 1 else math.nan,
        "ci95_low": math.nan, "ci95_high": math.nan, "ci_holm_low": math.nan,
        "ci_holm_high": math.nan, "t_stat": math.nan, "p_value": math.nan,
        "p_holm": math.nan, "reject_holm": False, "mde": math.nan,
        "verdict": VERDICT_FEW,
    }
    if n >= MIN_SEEDS_FOR_TEST and _constant(diff):
        row.update(verdict=VERDICT_IDENTICAL, sd_diff=0.0,
                   **dict.fromkeys(("ci95_low", "ci95_high", "ci_holm_low", "ci_holm_high"),
                                   float(diff.mean())))
    elif n >= MIN_SEEDS_FOR_TEST:
        row.update(_paired_test(pair[variant].to_numpy(float), pair[baseline].to_numpy(float)))
        row.update(verdict=VERDICT_NSD, _sem=row["sd_diff"] / math.sqrt(n), _df=n - 1)
    return row


def _clip_to_fractions(rows: list[dict]) -> None:
    """Clip the intervals of ``rows`` (differences of two fractions) to [-1, 1], where such a
    difference lies: clipping never moves 0 in or out, so no verdict changes."""
    for row in rows:
        for col in ("ci95_low", "ci95_high", "ci_holm_low", "ci_holm_high"):
            row[col] = min(1.0, max(-1.0, row[col])) if not math.isnan(row[col]) else row[col]


def compare(df: pd.DataFrame, baseline: str = BASELINE, alpha: float = ALPHA,
            metrics: Sequence[str] = COMPARED_METRICS) -> pd.DataFrame:
    """Every variant against ``baseline``, per dataset and metric, paired by seed.

    Method: for each dataset x metric x variant, keep the seeds on which both the variant and
    the baseline have a value; the difference ``variant - baseline`` per seed is summarised by
    its mean, sample SD and :data:`CONFIDENCE` Student-t interval, and tested with the two-sided
    paired t-test (``scipy.stats.ttest_rel`` and ``.confidence_interval()``). Within each
    dataset x metric the p-values of all tested variants form one family, corrected with Holm's
    step-down method (Holm 1979; ``statsmodels.stats.multitest.multipletests(method="holm")``)
    at family-wise ``alpha``; ``ci_holm_low``/``ci_holm_high`` is the interval at the level the
    Holm-adjusted p-value is judged at (:func:`holm_interval`), which excludes 0 exactly when the
    verdict is better or worse. A difference of fractions (:func:`fraction_bounds`) has both
    intervals clipped to [-1, 1].

    Verdict: ``"too few seeds"`` when fewer than :data:`MIN_SEEDS_FOR_TEST` seeds pair up (no
    test, not in the Holm family); ``"identical on every seed"`` when the difference is the same
    number on every seed, zero or not (a t-test would divide by a zero spread and give p = 0 or
    NaN: no test, no p-value, not in the family; the interval is the point); else
    ``"better"``/``"worse"`` when Holm rejects (direction from the sign of the mean difference
    and whether the metric is higher-is-better: losses lower is better, exact match and char
    accuracy higher is better); else ``"no significant difference"``.

    ``mde`` is :func:`min_detectable_effect` at the row's SD of differences, pairs and level
    ``alpha / m`` (m = the family's size: Holm's first, strictest threshold), so an effect of
    that size would be found with 80% power wherever it fell in the ranking.

    A metric is compared on a dataset only if the baseline has a value for it there (so exact
    match and char accuracy only on arithmetic). A dataset without a baseline gives no rows.

    Returns:
        Columns :data:`COMPARISON_COLUMNS`; ``mean_diff``, ``sd_diff``, the intervals and
        ``mde`` in the metric's unit. Rows by dataset, then metric (in ``metrics`` order), then
        variant, datasets and variants in the order of ``df`` (categorical, as
        :func:`summarise`), whose ``dataset`` and ``variant`` dtypes they keep.
    """
    df = with_order(df)
    rows = []
    for dataset, d in df.groupby("dataset", observed=True):
        if baseline not in set(d["variant"]):
            continue
        variants = [v for v in present(d["variant"]) if v != baseline]
        for metric in (m for m in metrics if m in d.columns):
            rows += _metric_comparisons(d, dataset, metric, baseline, variants, alpha)
    out = pd.DataFrame(rows, columns=COMPARISON_COLUMNS)
    out["reject_holm"] = out["reject_holm"].astype(bool)
    out["higher_is_better"] = out["higher_is_better"].astype(bool)
    for col in ("dataset", "variant"):
        out[col] = out[col].astype(str).astype(df[col].dtype)
    return out


def _metric_comparisons(d: pd.DataFrame, dataset: str, metric: str, baseline: str,
                        variants: list[str], alpha: float) -> list[dict]:
    """The rows of :func:`compare` for one dataset's ``d`` and ``metric``: each of ``variants``
    against ``baseline``, the tested ones one Holm family; none where the baseline has no value."""
    higher = bool(METRICS[metric][2])
    wide = (d.pivot_table(index="seed", columns="variant", values=metric,
                          aggfunc="mean", observed=True)
            .reindex(columns=[baseline, *variants]))  # all-NaN columns come back as NaN
    if wide[baseline].notna().sum() == 0:
        return []
    rows = [_paired_row(wide[[baseline, variant]].dropna(),  # the seeds both have
                        dataset, metric, higher, baseline, variant) for variant in variants]
    # the tested rows: Holm's family
    family = [i for i, row in enumerate(rows) if row["verdict"] == VERDICT_NSD]
    holm_correct(rows, family, alpha, higher)
    if fraction_bounds(metric) is not None:
        _clip_to_fractions(rows)
    for i in family:
        rows[i]["mde"] = min_detectable_effect(rows[i]["sd_diff"], rows[i]["n_pairs"],
                                               alpha / len(family))
    return rows


DETECTABLE_COLUMNS = ["dataset", "metric", "n_seeds", "n_compared", "alpha", "power",
                      "sd_diff", "mde", "mde_unadjusted"]


def detectable_effects(comparisons: pd.DataFrame, alpha: float = ALPHA,
                       power: float = POWER) -> pd.DataFrame:
    """Per dataset x metric, the smallest difference to the baseline the study could detect.

    ``sd_diff`` is the pooled SD of the per-seed differences over the tested variants (root
    mean square of their ``sd_diff``: the observed seed-to-seed spread of a paired
    difference); ``mde`` is :func:`min_detectable_effect` at that SD, the median number of
    paired seeds, ``power`` and level ``alpha / n_compared`` (Holm's first threshold: any
    variant with a true effect this large is found with at least this power);
    ``mde_unadjusted`` the same at level ``alpha`` (a single planned comparison). Variants
    "identical on every seed" or with too few seeds are left out of the pooling. In the
    metric's unit; NaN where no variant was tested.

    Returns:
        Columns :data:`DETECTABLE_COLUMNS`, one row per dataset x metric of ``comparisons``, in
        its order.
    """
    rows = []
    if comparisons.empty:
        return pd.DataFrame(columns=DETECTABLE_COLUMNS)
    for (dataset, metric), c in comparisons.groupby(["dataset", "metric"], observed=True,
                                                    sort=False):
        tested = c[c["verdict"].isin([VERDICT_BETTER, VERDICT_WORSE, VERDICT_NSD])]
        m = len(tested)
        sd = float(np.sqrt(np.mean(np.square(tested["sd_diff"])))) if m else math.nan
        n = int(np.median(tested["n_pairs"])) if m else int(c["n_pairs"].max())
        rows.append({"dataset": dataset, "metric": metric, "n_seeds": n, "n_compared": m,
                     "alpha": alpha, "power": power, "sd_diff": sd,
                     "mde": min_detectable_effect(sd, n, alpha / max(m, 1), power),
                     "mde_unadjusted": min_detectable_effect(sd, n, alpha, power)})
    out = pd.DataFrame(rows, columns=DETECTABLE_COLUMNS)
    out["dataset"] = out["dataset"].astype(str).astype(comparisons["dataset"].dtype)
    return out


def tuning_check(comparisons: pd.DataFrame, tuned: pd.DataFrame) -> pd.DataFrame:
    """``comparisons`` with each row's ``tuning_uncertainty``: the larger of the two variants'
    tuning uncertainties (``tuned``'s, best.json's bracket: the 95th percentile of the regret
    at the chosen learning rate, in the objective's unit), on the rows of the metric of the
    dataset's tuning objective (:data:`TUNED_METRICS`: test loss, or an arithmetic dataset's
    answer loss); NaN elsewhere.

    A better or worse verdict there becomes :data:`VERDICT_UNDECIDED_TUNING` when the
    Holm-adjusted interval, moved towards 0 by that uncertainty, no longer excludes 0: a miss of
    either variant's learning rate could then explain the effect (a tuned loss is too high by
    its regret, at most the uncertainty, so the true effect lies within the uncertainty of the
    measured one in either direction). It does so too when either variant was bracketed but its
    uncertainty could not be measured (one tuning seed, fewer than three points). Rows of a
    study without brackets are left as they are.
    """
    out = comparisons.copy()
    out["tuning_uncertainty"] = np.nan
    if out.empty or tuned is None or tuned.empty or "tuning_uncertainty" not in tuned:
        return out
    key = {(str(r.dataset), str(r.variant)): (r.bracket_state, r.tuning_uncertainty)
           for r in tuned.itertuples()}
    objectives = tuned["objective"] if "objective" in tuned else pd.Series("val_loss",
                                                                            tuned.index)
    metric_of = {str(d): TUNED_METRICS.get(str(o), TUNED_METRIC) if pd.notna(o) else TUNED_METRIC
                 for d, o in zip(tuned["dataset"], objectives)}
    for i, row in out.iterrows():
        if row["metric"] != metric_of.get(str(row["dataset"]), TUNED_METRIC):
            continue
        pair = [key.get((str(row["dataset"]), str(v))) for v in (row["variant"], row["baseline"])]
        if any(p is None or p[0] is None or (isinstance(p[0], float) and math.isnan(p[0]))
               for p in pair):
            continue  # no bracket: a study tuned without one
        bounds = [float(p[1]) if p[1] is not None else math.nan for p in pair]
        u = math.nan if any(math.isnan(b) for b in bounds) else max(bounds)
        out.at[i, "tuning_uncertainty"] = u
        if row["verdict"] not in (VERDICT_BETTER, VERDICT_WORSE):
            continue
        low, high = row["ci_holm_low"], row["ci_holm_high"]
        if math.isnan(u) or (low - u <= 0 <= high + u):
            out.at[i, "verdict"] = VERDICT_UNDECIDED_TUNING
    return out
