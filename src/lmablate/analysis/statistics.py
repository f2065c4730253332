"""Statistics of the study: intervals over seeds and paired tests against the baseline.

* :func:`summarise`: per dataset x variant x metric, the mean over seeds, the sample SD and the
  two-sided :data:`CONFIDENCE` Student-t interval of the mean (``scipy.stats.t.interval``).
* :func:`compare`: every variant against :data:`~lmablate.analysis.collect.BASELINE`, paired by
  seed: the paired t-test and the t-interval of the mean difference (``scipy.stats.ttest_rel``
  and its ``confidence_interval``), corrected for multiple comparisons with Holm's step-down
  method (Holm 1979, "A simple sequentially rejective multiple test procedure", Scand. J.
  Statist. 6:65-70; ``statsmodels.stats.multitest.multipletests(method="holm")``).

Units are those of the metrics (:data:`METRICS`): losses in nats/token, bits per char,
perplexity unitless, accuracies as fractions in [0, 1], times in seconds.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd
from scipy import stats
from statsmodels.stats.multitest import multipletests

from lmablate.analysis.collect import BASELINE, present, with_order

ALPHA = 0.05  # family-wise error rate of the Holm-corrected comparisons
CONFIDENCE = 0.95  # level of every interval in the report
MIN_SEEDS_FOR_TEST = 3  # with 2 pairs a t-test has 1 degree of freedom: no power, no verdict

SUMMARY_COLUMNS = ["dataset", "variant", "metric", "n", "mean", "std", "ci95_low", "ci95_high"]
COMPARISON_COLUMNS = [
    "dataset", "metric", "higher_is_better", "baseline", "variant", "n_pairs", "baseline_mean",
    "variant_mean", "mean_diff", "ci95_low", "ci95_high", "t_stat", "p_value", "p_holm",
    "reject_holm", "verdict",
]

# metric -> (label, unit, higher_is_better); the order is the order of the summary tables.
METRICS: dict[str, tuple[str, str, bool | None]] = {
    "test_loss": ("test loss", "nats/token", False),
    "val_loss": ("validation loss", "nats/token", False),
    "bits_per_char": ("bits per char", "bits/char", False),
    "perplexity": ("perplexity", "", False),
    "char_accuracy": ("char accuracy", "fraction", True),
    "exact_match": ("exact match", "fraction", True),
    "train_seconds": ("train time", "s", None),
    "tokens_per_second": ("throughput", "tokens/s", None),
}
# Metrics tested against the baseline (when the dataset has them at all).
COMPARED_METRICS = ("test_loss", "exact_match", "char_accuracy")

VERDICT_BETTER = "better"
VERDICT_WORSE = "worse"
VERDICT_NSD = "no significant difference"
VERDICT_FEW = "too few seeds"


def _mean_interval(mean: Any, sem: Any, n: Any) -> tuple[np.ndarray, np.ndarray]:
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
    low, high = _mean_interval(x.mean(), stats.sem(x), len(x))
    return (float(low), float(high))


def summarise(df: pd.DataFrame, metrics: Sequence[str] | None = None) -> pd.DataFrame:
    """Mean and :data:`CONFIDENCE` Student-t interval of each metric over seeds, per
    dataset x variant.

    Args:
        df: the ablation table (:attr:`~lmablate.analysis.collect.RunOutputs.ablation`): columns
            ``dataset``, ``variant``, ``seed`` and the metrics.
        metrics: columns to summarise (default: those of :data:`METRICS`).

    Returns:
        Long format, columns :data:`SUMMARY_COLUMNS`, one row per dataset x variant x metric
        with at least one value, in the metric's unit: ``n`` (seeds with a value), ``mean``,
        ``std`` (sample SD, ddof=1), ``ci95_low``/``ci95_high`` =
        ``scipy.stats.t.interval(CONFIDENCE, n - 1, loc=mean, scale=std / sqrt(n))``, i.e.
        mean -/+ t_{0.975, n-1} * std / sqrt(n). With n = 1, std and the interval are NaN (one
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
    out["ci95_low"], out["ci95_high"] = _mean_interval(
        out["mean"], out["std"] / np.sqrt(out["n"]), out["n"])
    out["n"] = out["n"].astype(int)
    return out[SUMMARY_COLUMNS]


def _paired_test(variant: np.ndarray, base: np.ndarray) -> dict[str, float]:
    """Paired t-test of ``variant - base`` (``scipy.stats.ttest_rel``) and the
    :data:`CONFIDENCE` t-interval of the mean difference (its ``confidence_interval``).

    All differences zero gives t = p = NaN (the test is undefined; treated as "no significant
    difference" by :func:`compare`) and the interval (0, 0); constant non-zero differences give
    p = 0 and the interval (mean, mean).
    """
    diff = variant - base
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        # zero-variance differences make scipy warn about precision loss / division by zero
        warnings.simplefilter("ignore", RuntimeWarning)
        res = stats.ttest_rel(variant, base)
        low, high = res.confidence_interval(confidence_level=CONFIDENCE)
    return {"mean_diff": float(diff.mean()), "ci95_low": float(low), "ci95_high": float(high),
            "t_stat": float(res.statistic), "p_value": float(res.pvalue)}


def compare(df: pd.DataFrame, baseline: str = BASELINE, alpha: float = ALPHA,
            metrics: Sequence[str] = COMPARED_METRICS) -> pd.DataFrame:
    """Every variant against ``baseline``, per dataset and metric, paired by seed.

    Method: for each dataset x metric x variant, keep the seeds on which both the variant and
    the baseline have a value; the difference ``variant - baseline`` per seed is summarised by
    its mean and :data:`CONFIDENCE` Student-t interval, and tested with the two-sided paired
    t-test (``scipy.stats.ttest_rel`` and ``.confidence_interval()``). Within each dataset x
    metric the p-values of all variants form one family, corrected with Holm's step-down method
    (Holm 1979; ``statsmodels.stats.multitest.multipletests(method="holm")``) at family-wise
    ``alpha``.

    Verdict: ``"too few seeds"`` when fewer than :data:`MIN_SEEDS_FOR_TEST` seeds pair up (no
    test, not in the Holm family); else ``"better"``/``"worse"`` when Holm rejects (direction
    from the sign of the mean difference and whether the metric is higher-is-better: test loss
    lower is better, exact match and char accuracy higher is better); else
    ``"no significant difference"`` (also when the test is undefined: all differences zero).

    A metric is compared on a dataset only if the baseline has a value for it there (so exact
    match and char accuracy only on arithmetic). A dataset without a baseline gives no rows.

    Returns:
        Columns :data:`COMPARISON_COLUMNS`; ``mean_diff`` and the interval in the metric's unit.
        Rows by dataset, then metric (in ``metrics`` order), then variant, datasets and
        variants in the order of ``df`` (categorical, as :func:`summarise`), whose ``dataset``
        and ``variant`` dtypes they keep.
    """
    df = with_order(df)
    rows = []
    for dataset, d in df.groupby("dataset", observed=True):
        if baseline not in set(d["variant"]):
            continue
        variants = [v for v in present(d["variant"]) if v != baseline]
        for metric in metrics:
            if metric not in d.columns:
                continue
            higher = bool(METRICS[metric][2])
            wide = (d.pivot_table(index="seed", columns="variant", values=metric,
                                  aggfunc="mean", observed=True)
                    .reindex(columns=[baseline, *variants]))  # all-NaN columns come back as NaN
            if wide[baseline].notna().sum() == 0:
                continue
            family = []
            for variant in variants:
                pair = wide[[baseline, variant]].dropna()  # seeds both have: the pairing
                n = len(pair)
                row = {
                    "dataset": dataset, "metric": metric, "higher_is_better": higher,
                    "baseline": baseline, "variant": variant, "n_pairs": n,
                    "baseline_mean": float(pair[baseline].mean()) if n else math.nan,
                    "variant_mean": float(pair[variant].mean()) if n else math.nan,
                    "mean_diff": (float((pair[variant] - pair[baseline]).mean()) if n
                                  else math.nan),
                    "ci95_low": math.nan, "ci95_high": math.nan, "t_stat": math.nan,
                    "p_value": math.nan, "p_holm": math.nan, "reject_holm": False,
                    "verdict": VERDICT_FEW,
                }
                if n >= MIN_SEEDS_FOR_TEST:
                    row.update(_paired_test(pair[variant].to_numpy(float),
                                            pair[baseline].to_numpy(float)))
                    row["verdict"] = VERDICT_NSD
                    if np.isfinite(row["p_value"]):
                        family.append(len(rows))
                rows.append(row)
            if family:
                reject, p_holm, _, _ = multipletests([rows[i]["p_value"] for i in family],
                                                     alpha=alpha, method="holm")
                for i, rej, p in zip(family, reject, p_holm):
                    rows[i]["p_holm"] = float(p)
                    rows[i]["reject_holm"] = bool(rej)
                    if rej:
                        improved = (rows[i]["mean_diff"] > 0) == higher
                        rows[i]["verdict"] = VERDICT_BETTER if improved else VERDICT_WORSE
    out = pd.DataFrame(rows, columns=COMPARISON_COLUMNS)
    out["reject_holm"] = out["reject_holm"].astype(bool)
    out["higher_is_better"] = out["higher_is_better"].astype(bool)
    for col in ("dataset", "variant"):
        out[col] = out[col].astype(str).astype(df[col].dtype)
    return out


TUNING_VARIATION_COLUMNS = [
    "dataset", "variant", "replicate", "metric", "higher_is_better", "n_pairs", "lr", "d_model",
    "replicate_lr", "replicate_d_model", "mean", "replicate_mean", "mean_diff", "ci95_low",
    "ci95_high",
]


def tuning_variation(ablation: pd.DataFrame, replicates: pd.DataFrame,
                     metrics: Sequence[str] = COMPARED_METRICS) -> pd.DataFrame:
    """How much a variant's result moves when it is tuned again with another sampler seed.

    For each re-tuning in ``replicates`` (the final runs of ``lmablate tune --replicate N``'s
    values) and each metric the dataset has: the difference ``replicate - original`` per seed,
    paired by seed, its mean and :data:`CONFIDENCE` Student-t interval (:func:`t_interval`).
    A variant's effect against the baseline that is no larger than this difference may be the
    tuner's luck rather than the feature. No test and no verdict: this measures the noise of
    the protocol.

    Args:
        ablation: :attr:`~lmablate.analysis.collect.RunOutputs.ablation`.
        replicates: :attr:`~lmablate.analysis.collect.RunOutputs.replicates`.
        metrics: metric columns to compare (those with a value in both frames are used).

    Returns:
        Columns :data:`TUNING_VARIATION_COLUMNS`, one row per dataset x variant x replicate x
        metric; ``lr``/``d_model`` are the tuned values of the original and the replicate (their
        first seed's), means and differences in the metric's unit.
    """
    rows = []
    if replicates.empty or ablation.empty:
        return pd.DataFrame(columns=TUNING_VARIATION_COLUMNS)
    replicates = with_order(replicates)
    for (dataset, variant, replicate), rep in replicates.groupby(
            ["dataset", "variant", "replicate"], observed=True, sort=True):
        orig = ablation[(ablation["dataset"] == dataset) & (ablation["variant"] == variant)]
        if orig.empty:
            continue
        for metric in metrics:
            if metric not in rep or metric not in orig:
                continue
            pair = pd.merge(orig[["seed", metric]], rep[["seed", metric]], on="seed",
                            suffixes=("", "_rep")).dropna().sort_values("seed")
            if pair.empty:
                continue
            diff = (pair[f"{metric}_rep"] - pair[metric]).to_numpy(float)
            low, high = t_interval(diff)
            rows.append({
                "dataset": dataset, "variant": variant, "replicate": int(replicate),
                "metric": metric, "higher_is_better": bool(METRICS[metric][2]),
                "n_pairs": len(pair), "lr": float(orig["lr"].iloc[0]),
                "d_model": int(orig["d_model"].iloc[0]), "replicate_lr": float(rep["lr"].iloc[0]),
                "replicate_d_model": int(rep["d_model"].iloc[0]),
                "mean": float(pair[metric].mean()),
                "replicate_mean": float(pair[f"{metric}_rep"].mean()),
                "mean_diff": float(diff.mean()), "ci95_low": low, "ci95_high": high,
            })
    return pd.DataFrame(rows, columns=TUNING_VARIATION_COLUMNS)
