"""How each variant's loss, and each effect, changes with training compute C (several
``train.budget_flops`` per dataset). Losses in nats/char (answer loss: per answer character),
compute in training FLOPs (:func:`lmablate.model.gpt.flops_per_token`)."""

from __future__ import annotations

import contextlib
import math
import warnings
from typing import Sequence

import numpy as np
import pandas as pd
from scipy import optimize, stats

from lmablate.report.collect import BASELINE, present, rows_of
from lmablate.report.stats.statistics import (ALPHA, COMPARISON_COLUMNS, CONFIDENCE, compare,
                                         holm_interval, holm_p)

SCALING_TITLE = "How the effects change with compute"  # the report's section
MIN_BUDGETS_SATURATING = 4  # E, A, alpha and at least one residual degree of freedom
N_BOOTSTRAP = 1000  # bootstrap resamples of the seeds per fitted curve
BOOTSTRAP_SEED = 0  # the resampling's random seed: the report is the same bytes on every run
_TAILS = [(1 - CONFIDENCE) / 2 * 100, 100 - (1 - CONFIDENCE) / 2 * 100]
SATURATING, LOG_LINEAR = "E + A C^-alpha", "A C^-alpha (log-log line)"
TREND_GROWS, TREND_SHRINKS = "gain grows", "gain shrinks"
TREND_NONE, TREND_FEW = "no detectable trend", "too few budgets or seeds"
FIT_COLUMNS = ["dataset", "variant", "metric", "form", "n_budgets", "n_seeds", "E", "E_low",
               "E_high", "A", "A_low", "A_high", "alpha", "alpha_low", "alpha_high",
               "n_bootstrap", "note"]
TREND_COLUMNS = ["dataset", "variant", "metric", "n_budgets", "n_seeds", "slope", "slope_low",
                 "slope_high", "slope_holm_low", "slope_holm_high", "p_value", "p_holm",
                 "trend", "crossing_flops"]
EXTRAPOLATION_COLUMNS = ["dataset", "variant", "metric", "form", "target_flops", "predicted",
                         "predicted_low", "predicted_high", "delta", "delta_low", "delta_high"]


def power_law(flops: np.ndarray, e: float, a: float, alpha: float) -> np.ndarray:
    """L(C) = E + A C^-alpha (Kaplan et al. 2020, eq. 1.3; Hoffmann et al. 2022, eq. 2)."""
    return e + a * np.power(np.asarray(flops, dtype=float), -alpha)


def fit_power_law(flops: Sequence[float], loss: Sequence[float]) -> tuple[float, float, float]:
    """``(E, A, alpha)`` of :func:`power_law` by least squares (``scipy.optimize.curve_fit``,
    E >= 0, A > 0, 0 < alpha <= 2). Raises ValueError for fewer than
    :data:`MIN_BUDGETS_SATURATING` budgets, RuntimeError if the fit does not converge."""
    c, y = np.asarray(flops, dtype=float), np.asarray(loss, dtype=float)
    if len(np.unique(c)) < MIN_BUDGETS_SATURATING:
        raise ValueError(f"a saturating power law needs at least {MIN_BUDGETS_SATURATING} "
                         f"budgets; got {len(np.unique(c))}")
    scale = float(np.exp(np.mean(np.log(c))))
    x = c / scale
    e0 = 0.9 * float(y.min())  # start: alpha 0.3, E under the lowest loss, A through the highest
    p0 = (e0, max(float(y.max()) - e0, 1e-6) * float(x.min()) ** 0.3, 0.3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optimize.OptimizeWarning)
        (e, a_scaled, alpha), _ = optimize.curve_fit(
            power_law, x, y, p0=p0, bounds=([0.0, 1e-12, 1e-4], [np.inf, np.inf, 2.0]),
            maxfev=20000)
    return float(e), float(a_scaled * scale ** alpha), float(alpha)


def fit_log_linear(flops: Sequence[float], loss: Sequence[float]) -> tuple[float, float]:
    """``(A, alpha)`` of the least-squares line log L = log A - alpha log C (E = 0). Raises
    ValueError for fewer than 2 budgets or a loss <= 0."""
    c, y = np.asarray(flops, dtype=float), np.asarray(loss, dtype=float)
    if len(np.unique(c)) < 2 or np.any(y <= 0):
        raise ValueError("a log-log line needs 2 or more budgets and positive losses")
    slope, intercept = np.polyfit(np.log(c), np.log(y), 1)
    return float(np.exp(intercept)), float(-slope)


def _fit(form: str, flops: np.ndarray, means: np.ndarray) -> tuple[float, float, float]:
    if form == SATURATING:
        return fit_power_law(flops, means)
    return (0.0, *fit_log_linear(flops, means))


def fit_curves(scaling: pd.DataFrame, metric_of: dict[str, str]
               ) -> tuple[pd.DataFrame, dict[tuple[str, str], np.ndarray]]:
    """``(fits, resamples)``: :data:`FIT_COLUMNS` of each dataset x variant's
    ``metric_of[dataset]`` against compute, :func:`power_law` (from
    :data:`MIN_BUDGETS_SATURATING` budgets, else the log-log line) through the mean over seeds,
    intervals from a paired bootstrap over seeds; (dataset, variant) -> its (E, A, alpha) rows."""
    rows, resamples = [], {}
    for (dataset, variant), frame in scaling.groupby(["dataset", "variant"], observed=True,
                                                     sort=True):
        metric = metric_of[str(dataset)]
        wide = frame.pivot_table(index="seed", columns="budget_flops", values=metric,
                                 aggfunc="mean").dropna()  # the seeds with every budget
        wide = wide.reindex(columns=sorted(wide.columns))
        budgets, matrix = wide.columns.to_numpy(float), wide.to_numpy(float)
        n_b, n = len(budgets), len(matrix)
        row = {"dataset": dataset, "variant": variant, "metric": metric, "form": "",
               "n_budgets": n_b, "n_seeds": n, "n_bootstrap": 0,
               "note": f"{n_b} budget(s) with every seed: nothing to fit",
               **dict.fromkeys(FIT_COLUMNS[6:15], math.nan)}
        rows.append(row)
        if n_b < 2 or not n:
            continue
        row["form"] = form = SATURATING if n_b >= MIN_BUDGETS_SATURATING else LOG_LINEAR
        row["note"] = "" if form == SATURATING else (
            f"{n_b} budgets: a log-log line only (E = 0); a saturating law needs "
            f"{MIN_BUDGETS_SATURATING}")
        try:
            row["E"], row["A"], row["alpha"] = _fit(form, budgets, matrix.mean(axis=0))
        except (RuntimeError, ValueError) as exc:
            row["note"] = f"the fit failed: {exc}"
            continue
        if form == SATURATING and row["E"] < 1e-6 * float(np.nanmin(matrix)):
            row["note"] = ("E at its lower bound 0: the losses show no floor within the "
                           "budgets, and the law is a pure power law there")
        # the draws depend on n only: the same for every variant of a dataset (paired)
        draws = np.random.default_rng(BOOTSTRAP_SEED).integers(
            0, n, (N_BOOTSTRAP if n > 1 else 0, n))
        boot = np.full((len(draws), 3), np.nan)
        for i, picked in enumerate(draws):
            with contextlib.suppress(RuntimeError, ValueError):
                boot[i] = _fit(form, budgets, matrix[picked].mean(axis=0))
        resamples[(str(dataset), str(variant))] = boot
        ok = boot[np.isfinite(boot).all(axis=1)]
        row["n_bootstrap"] = len(ok)
        for i, name in enumerate(("E", "A", "alpha") if len(ok) else ()):
            row[f"{name}_low"], row[f"{name}_high"] = np.percentile(ok[:, i], _TAILS)
    return pd.DataFrame(rows, columns=FIT_COLUMNS), resamples


def predict(fit: pd.Series, boot: np.ndarray | None, flops: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(L, low, high)`` of a fitted curve at ``flops``, the band from the bootstrap's curves."""
    flops = np.asarray(flops, dtype=float)
    mid = power_law(flops, fit["E"], fit["A"], fit["alpha"])
    if boot is None or not len(boot):
        nan = np.full_like(mid, np.nan)
        return mid, nan, nan
    low, high = np.nanpercentile(np.stack([power_law(flops, *p) for p in boot]), _TAILS, axis=0)
    return mid, low, high


def extrapolate(fits: pd.DataFrame, resamples: dict[tuple[str, str], np.ndarray],
                target_flops: dict[str, float], baseline: str = BASELINE) -> pd.DataFrame:
    """:data:`EXTRAPOLATION_COLUMNS`: each fitted curve at its dataset's ``target_flops``, with
    its bootstrap interval, and ``delta`` = minus the baseline's, with the paired interval."""
    rows = []
    for _, fit in fits.iterrows():
        dataset, variant = str(fit["dataset"]), str(fit["variant"])
        target = target_flops.get(dataset)
        if not fit["form"] or target is None or not np.isfinite(fit["E"]):
            continue
        x = np.array([target])
        boot, base_boot = resamples.get((dataset, variant)), resamples.get((dataset, baseline))
        mid, low, high = predict(fit, boot, x)
        row = {"dataset": fit["dataset"], "variant": fit["variant"], "metric": fit["metric"],
               "form": fit["form"], "target_flops": target, "predicted": float(mid[0]),
               "predicted_low": float(low[0]), "predicted_high": float(high[0]),
               "delta": math.nan, "delta_low": math.nan, "delta_high": math.nan}
        base = rows_of(fits, dataset, baseline)
        if variant != baseline and len(base) and base.iloc[0]["form"] == fit["form"]:
            b = base.iloc[0]
            row["delta"] = float(mid[0] - power_law(x, b["E"], b["A"], b["alpha"])[0])
            if boot is not None and base_boot is not None and len(boot) == len(base_boot) \
                    and len(boot):
                d = np.array([power_law(x, *p)[0] - power_law(x, *q)[0]
                              for p, q in zip(boot, base_boot)])
                if np.isfinite(d).any():
                    row["delta_low"], row["delta_high"] = map(float, np.nanpercentile(d, _TAILS))
        rows.append(row)
    return pd.DataFrame(rows, columns=EXTRAPOLATION_COLUMNS)


def crossing(budgets: np.ndarray, deltas: np.ndarray) -> float:
    """The FLOPs where ``deltas`` (one per increasing budget) changes sign, linear in log10 C;
    NaN unless it changes sign exactly once."""
    ok = np.isfinite(deltas)
    changes = [i for i in range(len(deltas) - 1)
               if ok[i] and ok[i + 1] and deltas[i] * deltas[i + 1] < 0]
    if len(changes) != 1:
        return math.nan
    i = changes[0]
    d0, d1 = deltas[i], deltas[i + 1]
    x0, x1 = np.log10(budgets[i]), np.log10(budgets[i + 1])
    return float(10 ** (x0 + (x1 - x0) * d0 / (d0 - d1)))


def effect_trends(scaling: pd.DataFrame, metric_of: dict[str, str],
                  baseline: str = BASELINE, alpha: float = ALPHA) -> pd.DataFrame:
    """:data:`TREND_COLUMNS` per variant: the mean over seeds of the slope of
    L_variant - L_baseline on log10 C (per decade), its t-interval and one-sample t-test,
    Holm-corrected over the variants (:func:`lmablate.report.stats.statistics.holm_interval`);
    ``trend`` (:data:`TREND_FEW` below 2 budgets or 3 seeds), and :func:`crossing` if one."""
    rows = []
    for dataset, d in scaling.groupby("dataset", observed=True, sort=True):
        metric = metric_of[str(dataset)]
        if baseline not in set(d["variant"].astype(str)):
            continue
        by_seed = {v: d[d["variant"].astype(str) == v].pivot_table(
            index="seed", columns="budget_flops", values=metric, aggfunc="mean")
            for v in present(d["variant"])}
        found = [_trend_row(dataset, v, metric, by_seed[baseline], by_seed[v])
                 for v in by_seed if v != baseline]
        family = [i for i, r in enumerate(found) if "_sem" in r]  # _sem, _df: no columns
        for i, rej in zip(family, holm_p(found, family, alpha)):
            r = found[i]
            r["slope_holm_low"], r["slope_holm_high"] = holm_interval(
                r["slope"], r["_sem"], r["_df"], r["p_value"], r["p_holm"], alpha)
            if rej:
                r["trend"] = TREND_GROWS if r["slope"] < 0 else TREND_SHRINKS
        rows += found
    for r in rows:
        if r["trend"] not in (TREND_GROWS, TREND_SHRINKS):
            r["crossing_flops"] = math.nan  # a sign change without a trend is noise
    return pd.DataFrame(rows, columns=TREND_COLUMNS)


def _trend_row(dataset: str, variant: str, metric: str, base: pd.DataFrame,
               var: pd.DataFrame) -> dict:
    budgets = sorted(set(base.columns) & set(var.columns))
    diff = (var[budgets] - base[budgets]).dropna()
    row = {"dataset": dataset, "variant": variant, "metric": metric,
           "n_budgets": len(budgets), "n_seeds": len(diff), "trend": TREND_FEW,
           "crossing_flops": crossing(np.asarray(budgets, dtype=float),
                                      diff.mean().to_numpy(float)) if len(diff) else math.nan,
           **dict.fromkeys(TREND_COLUMNS[5:12], math.nan)}
    if len(budgets) < 2 or len(diff) < 3:
        return row
    x = np.log10(np.asarray(budgets, dtype=float))
    slopes = np.array([np.polyfit(x, r, 1)[0] for r in diff.to_numpy(float)])
    mean = float(slopes.mean())
    sem = float(slopes.std(ddof=1) / math.sqrt(len(slopes)))
    if sem == 0:  # equal slopes: no test, the point as interval
        row.update(dict.fromkeys(TREND_COLUMNS[5:10], mean), trend=TREND_NONE if mean == 0
                   else (TREND_GROWS if mean < 0 else TREND_SHRINKS))
    else:  # _sem, _df for Holm's correction
        low, high = stats.t.interval(CONFIDENCE, len(slopes) - 1, loc=mean, scale=sem)
        row.update(slope=mean, slope_low=low, slope_high=high, _sem=sem, _df=len(slopes) - 1,
                   p_value=float(stats.ttest_1samp(slopes, 0.0).pvalue), trend=TREND_NONE)
    return row


def effects_by_budget(scaling: pd.DataFrame, metric_of: dict[str, str]) -> pd.DataFrame:
    """:func:`lmablate.report.stats.statistics.compare` at each budget, on each dataset's
    headline loss: columns ``budget_flops`` and its, by dataset, budget, variant."""
    frames = [compare(frame, metrics=(metric_of[str(dataset)],)).assign(budget_flops=budget)
              for (dataset, budget), frame in scaling.groupby(
                  ["dataset", "budget_flops"], observed=True, sort=True)]
    if not frames:
        return pd.DataFrame(columns=["budget_flops", *COMPARISON_COLUMNS])
    return pd.concat(frames, ignore_index=True)[["budget_flops", *COMPARISON_COLUMNS]]
