"""How each variant's loss, and each effect, changes with training compute (a scaling study:
``train.budget_flops`` lists several budgets per dataset).

* **Curves** (:func:`fit_curves`): per dataset x variant, the headline loss against training
  FLOPs C fitted by the saturating power law L(C) = E + A C^-alpha (Kaplan et al. 2020, eq. 1.3;
  Hoffmann et al. 2022, eq. 2 with the data term folded into E), by least squares on the mean
  over seeds at each budget (``scipy.optimize.curve_fit``). Its interval comes from a bootstrap
  over seeds: seeds are drawn with replacement, as whole rows across budgets (seed s is the same
  initialisation and data order at every budget), and the law fitted again. Three parameters
  need at least :data:`MIN_BUDGETS_SATURATING` budgets to leave a residual; with two or three,
  only the straight line log L = log A - alpha log C (a pure power law, E = 0) is fitted, and
  the table says so; with one, nothing.
* **Trends** (:func:`effect_trends`): per dataset x variant, the difference to the baseline
  Delta(C) = L_variant - L_baseline, per seed and budget, regressed on log10 C for each seed;
  the mean of the seeds' slopes (nats per decade of compute) with its Student-t interval and a
  two-sided one-sample t-test, Holm-corrected over the dataset's variants (as the comparisons
  at one budget, :func:`lmablate.report.stats.statistics.compare`). A slope below 0 whose corrected
  interval excludes 0 reads "gain grows" (Delta falls as compute grows), above 0 "gain shrinks",
  else "no detectable trend". Where the trend is detectable and the mean Delta changes sign
  once, between two adjacent budgets, the curves cross there, at the compute found by
  interpolating Delta linearly in log C.
* **Extrapolation** (:func:`extrapolate`): the fitted curves at a larger budget, with the
  bootstrap interval: an extrapolation, never a measurement.

Units: losses in nats per character (the answer loss in nats per answer character), compute in
training FLOPs (6 N + attention per token, :func:`lmablate.model.gpt.flops_per_token`).
"""

from __future__ import annotations

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
# the percentiles that bound a CONFIDENCE percentile interval
_TAILS = [(1 - CONFIDENCE) / 2 * 100, 100 - (1 - CONFIDENCE) / 2 * 100]
SATURATING = "E + A C^-alpha"
LOG_LINEAR = "A C^-alpha (log-log line)"
TREND_GROWS = "gain grows"
TREND_SHRINKS = "gain shrinks"
TREND_NONE = "no detectable trend"
TREND_FEW = "too few budgets or seeds"

FIT_COLUMNS = ["dataset", "variant", "metric", "form", "n_budgets", "n_seeds", "E", "E_low",
               "E_high", "A", "A_low", "A_high", "alpha", "alpha_low", "alpha_high",
               "n_bootstrap", "note"]
TREND_COLUMNS = ["dataset", "variant", "metric", "n_budgets", "n_seeds", "slope", "slope_low",
                 "slope_high", "slope_holm_low", "slope_holm_high", "p_value", "p_holm",
                 "trend", "crossing_flops"]
EXTRAPOLATION_COLUMNS = ["dataset", "variant", "metric", "form", "target_flops", "predicted",
                         "predicted_low", "predicted_high", "delta", "delta_low", "delta_high"]


def power_law(flops: np.ndarray, e: float, a: float, alpha: float) -> np.ndarray:
    """The saturating power law L(C) = E + A C^-alpha (Kaplan et al. 2020; Hoffmann et al.
    2022, eq. 2): ``flops`` C in training FLOPs, the loss in the unit of E and A."""
    return e + a * np.power(np.asarray(flops, dtype=float), -alpha)


def fit_power_law(flops: Sequence[float], loss: Sequence[float]) -> tuple[float, float, float]:
    """``(E, A, alpha)`` of :func:`power_law` fitted to the points ``(flops, loss)`` by least
    squares (``scipy.optimize.curve_fit``, trust-region reflective, E >= 0, A > 0,
    0 < alpha <= 2). Compute is scaled by its geometric mean while fitting, so the problem is
    well conditioned at any magnitude; A is returned for C in FLOPs.

    Raises:
        ValueError: fewer than :data:`MIN_BUDGETS_SATURATING` distinct budgets.
        RuntimeError: the least-squares fit did not converge.
    """
    c = np.asarray(flops, dtype=float)
    y = np.asarray(loss, dtype=float)
    if len(np.unique(c)) < MIN_BUDGETS_SATURATING:
        raise ValueError(f"a saturating power law needs at least {MIN_BUDGETS_SATURATING} "
                         f"budgets; got {len(np.unique(c))}")
    scale = float(np.exp(np.mean(np.log(c))))
    x = c / scale
    # start: alpha 0.3, E just under the lowest loss, A through the highest
    e0 = 0.9 * float(y.min())
    p0 = (e0, max(float(y.max()) - e0, 1e-6) * float(x.min()) ** 0.3, 0.3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optimize.OptimizeWarning)
        (e, a_scaled, alpha), _ = optimize.curve_fit(
            power_law, x, y, p0=p0, bounds=([0.0, 1e-12, 1e-4], [np.inf, np.inf, 2.0]),
            maxfev=20000)
    return float(e), float(a_scaled * scale ** alpha), float(alpha)


def e_at_bound(e: float, losses: np.ndarray) -> bool:
    """Whether a fitted irreducible loss ``e`` sits at its lower bound 0 (below 1e-6 of the
    smallest loss in ``losses``): the points identified no floor."""
    return bool(e < 1e-6 * float(np.nanmin(losses)))


def fit_log_linear(flops: Sequence[float], loss: Sequence[float]) -> tuple[float, float]:
    """``(A, alpha)`` of the straight line log L = log A - alpha log C through ``(flops,
    loss)`` by least squares: a pure power law, no irreducible term, for two or three budgets.

    Raises:
        ValueError: fewer than 2 distinct budgets, or a loss <= 0.
    """
    c = np.asarray(flops, dtype=float)
    y = np.asarray(loss, dtype=float)
    if len(np.unique(c)) < 2 or np.any(y <= 0):
        raise ValueError("a log-log line needs 2 or more budgets and positive losses")
    slope, intercept = np.polyfit(np.log(c), np.log(y), 1)
    return float(np.exp(intercept)), float(-slope)


def _fit(form: str, flops: np.ndarray, means: np.ndarray) -> tuple[float, float, float]:
    """``(E, A, alpha)`` of ``form`` (E = 0 for the log-log line)."""
    if form == SATURATING:
        return fit_power_law(flops, means)
    a, alpha = fit_log_linear(flops, means)
    return 0.0, a, alpha


def _seed_matrix(frame: pd.DataFrame, metric: str) -> tuple[np.ndarray, np.ndarray, list]:
    """``(budgets, losses, seeds)``: the budgets in increasing order and a seeds x budgets
    matrix of ``metric``, with only the seeds that have a value at every budget."""
    wide = frame.pivot_table(index="seed", columns="budget_flops", values=metric,
                             aggfunc="mean").dropna()
    wide = wide.reindex(columns=sorted(wide.columns))
    return wide.columns.to_numpy(float), wide.to_numpy(float), list(wide.index)


def _bootstrap(form: str, budgets: np.ndarray, matrix: np.ndarray,
               draws: np.ndarray) -> np.ndarray:
    """``(E, A, alpha)`` refitted on each resample of the seeds (rows of ``matrix``; a row
    of ``draws`` holds one resample's row indices); NaN where a fit does not converge."""
    out = np.full((len(draws), 3), np.nan)
    for i, rows in enumerate(draws):
        try:
            out[i] = _fit(form, budgets, matrix[rows].mean(axis=0))
        except (RuntimeError, ValueError):
            continue
    return out


def fit_curves(scaling: pd.DataFrame, metric_of: dict[str, str]
               ) -> tuple[pd.DataFrame, dict[tuple[str, str], np.ndarray]]:
    """Each dataset x variant's loss against compute, fitted (see the module docstring).

    Args:
        scaling: every budget's runs (``RunOutputs.scaling`` of
            :mod:`lmablate.report.collect`).
        metric_of: each dataset's headline loss column (``test_loss``, or ``answer_loss``).

    Returns:
        ``(fits, resamples)``: ``fits`` with :data:`FIT_COLUMNS` (the parameters of the mean
        over seeds, ``*_low``/``*_high`` the :data:`CONFIDENCE` percentile interval of the
        bootstrap, ``note`` why a curve has no fit or only the log-log line); ``resamples``
        maps (dataset, variant) to the bootstrap's ``(E, A, alpha)`` rows (NaN where a fit
        did not converge), for bands and extrapolations; resample i draws the same seeds for
        every variant of a dataset (a paired bootstrap). Rows in the study order of
        ``scaling``.
    """
    rows, resamples = [], {}
    draws: dict[tuple[str, tuple], np.ndarray] = {}
    for (dataset, variant), frame in scaling.groupby(["dataset", "variant"], observed=True,
                                                     sort=True):
        metric = metric_of[str(dataset)]
        budgets, matrix, seeds = _seed_matrix(frame, metric)
        row = {"dataset": dataset, "variant": variant, "metric": metric, "form": "",
               "n_budgets": len(budgets), "n_seeds": len(matrix), "n_bootstrap": 0,
               "note": f"{len(budgets)} budget(s) with every seed: nothing to fit",
               **dict.fromkeys(FIT_COLUMNS[6:15], math.nan)}
        fitted = _fit_mean(budgets, matrix) if len(budgets) >= 2 and len(matrix) else {}
        row.update(fitted)
        if "E" in fitted:
            boot = _bootstrap(row["form"], budgets, matrix,
                              _paired_draws(draws, str(dataset), seeds))
            resamples[(str(dataset), str(variant))] = boot
            row.update(_bootstrap_interval(boot))
        rows.append(row)
    return pd.DataFrame(rows, columns=FIT_COLUMNS), resamples


def _fit_mean(budgets: np.ndarray, matrix: np.ndarray) -> dict:
    """The curve through the mean over seeds (rows of ``matrix``) as columns of
    :data:`FIT_COLUMNS`: ``form``, ``E``, ``A``, ``alpha`` and ``note``, or why the fit failed."""
    n_b = len(budgets)
    form = SATURATING if n_b >= MIN_BUDGETS_SATURATING else LOG_LINEAR
    note = "" if form == SATURATING else (f"{n_b} budgets: a log-log line only (E = 0); a "
                                          f"saturating law needs {MIN_BUDGETS_SATURATING}")
    try:
        e, a, alpha = _fit(form, budgets, matrix.mean(axis=0))
    except (RuntimeError, ValueError) as exc:
        return {"form": form, "note": f"the fit failed: {exc}"}
    if form == SATURATING and e_at_bound(e, matrix):
        note = ("E at its lower bound 0: the losses show no floor within the "
                "budgets, and the law is a pure power law there")
    return {"form": form, "E": e, "A": a, "alpha": alpha, "note": note}


def _paired_draws(cache: dict[tuple[str, tuple], np.ndarray], dataset: str,
                  seeds: list) -> np.ndarray:
    """The bootstrap's resamples of ``seeds`` (a row of seed indices each), the same for every
    variant of ``dataset``: the bootstrap is paired, so differences between curves have
    intervals too."""
    key = (dataset, tuple(seeds))
    if key not in cache:
        rng = np.random.default_rng(BOOTSTRAP_SEED)
        n_s = len(seeds)
        cache[key] = rng.integers(0, n_s, (N_BOOTSTRAP if n_s > 1 else 0, n_s))
    return cache[key]


def _bootstrap_interval(boot: np.ndarray) -> dict:
    """``n_bootstrap`` (the resamples whose fit converged) and each parameter's
    :data:`CONFIDENCE` percentile interval over them."""
    ok = boot[np.isfinite(boot).all(axis=1)]
    out = {"n_bootstrap": len(ok)}
    for i, name in enumerate(("E", "A", "alpha")):
        if len(ok):
            out[f"{name}_low"], out[f"{name}_high"] = np.percentile(ok[:, i], _TAILS)
    return out


def predict(fit: pd.Series, boot: np.ndarray | None, flops: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A fitted curve at ``flops``: ``(L, low, high)``, the band the :data:`CONFIDENCE`
    percentile interval of the bootstrap's curves (resamples whose fit failed left out; NaN
    without resamples)."""
    flops = np.asarray(flops, dtype=float)
    mid = power_law(flops, fit["E"], fit["A"], fit["alpha"])
    if boot is None or not len(boot):
        nan = np.full_like(mid, np.nan)
        return mid, nan, nan
    curves = np.stack([power_law(flops, *p) for p in boot])
    low, high = np.nanpercentile(curves, _TAILS, axis=0)
    return mid, low, high


def extrapolate(fits: pd.DataFrame, resamples: dict[tuple[str, str], np.ndarray],
                target_flops: dict[str, float], baseline: str = BASELINE) -> pd.DataFrame:
    """Each fitted curve at its dataset's ``target_flops`` (a larger budget than any
    measured): :data:`EXTRAPOLATION_COLUMNS`, ``predicted`` with its bootstrap interval, and
    ``delta`` = predicted minus the baseline's prediction, with the interval of the paired
    bootstrap (the same resampled seeds for both curves), in the unit of the curve's metric.
    Curves without a fit, and datasets without a target, give no row."""
    rows = []
    for _, fit in fits.iterrows():
        dataset, variant = str(fit["dataset"]), str(fit["variant"])
        target = target_flops.get(dataset)
        if not fit["form"] or target is None or not np.isfinite(fit["E"]):
            continue
        x = np.array([target])
        boot = resamples.get((dataset, variant))
        mid, low, high = predict(fit, boot, x)
        row = {"dataset": fit["dataset"], "variant": fit["variant"], "metric": fit["metric"],
               "form": fit["form"], "target_flops": target, "predicted": float(mid[0]),
               "predicted_low": float(low[0]), "predicted_high": float(high[0]),
               "delta": math.nan, "delta_low": math.nan, "delta_high": math.nan}
        base = rows_of(fits, dataset, baseline)
        base_boot = resamples.get((dataset, baseline))
        if variant != baseline and len(base) and base.iloc[0]["form"] == fit["form"]:
            b = base.iloc[0]
            row["delta"] = float(mid[0] - power_law(x, b["E"], b["A"], b["alpha"])[0])
            if boot is not None and base_boot is not None and len(boot) == len(base_boot) \
                    and len(boot):
                d = (np.array([power_law(x, *p)[0] for p in boot])
                     - np.array([power_law(x, *p)[0] for p in base_boot]))
                if np.isfinite(d).any():
                    row["delta_low"], row["delta_high"] = (float(v) for v in
                                                           np.nanpercentile(d, _TAILS))
        rows.append(row)
    return pd.DataFrame(rows, columns=EXTRAPOLATION_COLUMNS)


def crossing(budgets: np.ndarray, deltas: np.ndarray) -> float:
    """The compute (FLOPs) at which the mean difference ``deltas`` (one per budget, budgets
    increasing) changes sign, interpolated linearly in log10 C between the two budgets around
    it; NaN where it keeps its sign, or changes it more than once (noise, not a crossing)."""
    changes = [i for i in range(len(deltas) - 1)
               if np.isfinite(deltas[i]) and np.isfinite(deltas[i + 1])
               and deltas[i] * deltas[i + 1] < 0]
    if len(changes) != 1:
        return math.nan
    i = changes[0]
    d0, d1 = deltas[i], deltas[i + 1]
    x0, x1 = np.log10(budgets[i]), np.log10(budgets[i + 1])
    return float(10 ** (x0 + (x1 - x0) * d0 / (d0 - d1)))


def effect_trends(scaling: pd.DataFrame, metric_of: dict[str, str],
                  baseline: str = BASELINE, alpha: float = ALPHA) -> pd.DataFrame:
    """The trend of each variant's effect with compute (see the module docstring).

    For each seed that every budget of both variants has, the differences Delta to the
    baseline are regressed on log10 C (``numpy.polyfit``); the seeds' slopes (nats per decade
    of compute) are tested against 0 by a one-sample t-test (``scipy.stats.ttest_1samp``), and
    the p-values of a dataset's variants are Holm-corrected together
    (``statsmodels.stats.multitest.multipletests``), with the interval at the level the
    adjusted p-value is judged at (:func:`lmablate.report.stats.statistics.holm_interval`).

    Returns:
        :data:`TREND_COLUMNS`, one row per dataset x variant other than ``baseline``:
        ``slope`` and its intervals in the metric's unit per decade of compute, ``trend`` one
        of :data:`TREND_GROWS`, :data:`TREND_SHRINKS`, :data:`TREND_NONE`, :data:`TREND_FEW`
        (fewer than 2 budgets or 3 seeds), ``crossing_flops`` where the trend is detectable
        and the mean difference changes sign once between budgets (:func:`crossing`; NaN
        otherwise).
    """
    rows = []
    for dataset, d in scaling.groupby("dataset", observed=True, sort=True):
        metric = metric_of[str(dataset)]
        if baseline not in set(d["variant"].astype(str)):
            continue
        base = _seed_by_budget(d, baseline, metric)
        found = [_trend_row(dataset, variant, metric, base, _seed_by_budget(d, variant, metric))
                 for variant in present(d["variant"]) if variant != baseline]
        _judge_trends(found, alpha)
        rows += found
    return pd.DataFrame(rows, columns=TREND_COLUMNS)


def _seed_by_budget(d: pd.DataFrame, variant: str, metric: str) -> pd.DataFrame:
    """One variant's ``metric``, a row per seed and a column per budget."""
    return d[d["variant"].astype(str) == variant].pivot_table(
        index="seed", columns="budget_flops", values=metric, aggfunc="mean")


def _trend_row(dataset: str, variant: str, metric: str, base: pd.DataFrame,
               var: pd.DataFrame) -> dict:
    """One variant's row of :data:`TREND_COLUMNS` before Holm's correction, from its and the
    baseline's losses by seed and budget (:func:`_seed_by_budget`)."""
    budgets = sorted(set(base.columns) & set(var.columns))
    diff = (var[budgets] - base[budgets]).dropna()
    row = {"dataset": dataset, "variant": variant, "metric": metric,
           "n_budgets": len(budgets), "n_seeds": len(diff), "trend": TREND_FEW,
           "crossing_flops": crossing(np.asarray(budgets, dtype=float),
                                      diff.mean().to_numpy(float)) if len(diff)
           else math.nan,  # kept by _judge_trends only where the trend is detectable
           **dict.fromkeys(TREND_COLUMNS[5:12], math.nan)}
    if len(budgets) >= 2 and len(diff) >= 3:
        x = np.log10(np.asarray(budgets, dtype=float))
        row.update(_slope_test(np.array([np.polyfit(x, r, 1)[0] for r in diff.to_numpy(float)])))
    return row


def _slope_test(slopes: np.ndarray) -> dict:
    """The mean of the seeds' ``slopes``, its interval and its one-sample t-test against 0
    (``_sem`` and ``_df`` for Holm's correction); equal slopes get no test, the point as
    interval."""
    mean = float(slopes.mean())
    sem = float(slopes.std(ddof=1) / math.sqrt(len(slopes)))
    if sem == 0:
        return dict(slope=mean, slope_low=mean, slope_high=mean, slope_holm_low=mean,
                    slope_holm_high=mean, trend=TREND_NONE if mean == 0
                    else (TREND_GROWS if mean < 0 else TREND_SHRINKS))
    low, high = stats.t.interval(CONFIDENCE, len(slopes) - 1, loc=mean, scale=sem)
    return dict(slope=mean, slope_low=low, slope_high=high,
                p_value=float(stats.ttest_1samp(slopes, 0.0).pvalue), _sem=sem,
                _df=len(slopes) - 1, trend=TREND_NONE)


def _judge_trends(rows: list[dict], alpha: float) -> None:
    """Holm's correction over one dataset's tested ``rows``, in place: the corrected interval,
    the trend of each rejected row, and no ``crossing_flops`` without a trend."""
    family = [i for i, r in enumerate(rows) if "_sem" in r]
    for i, rej in zip(family, holm_p(rows, family, alpha)):
        r = rows[i]
        r["slope_holm_low"], r["slope_holm_high"] = holm_interval(
            r["slope"], r.pop("_sem"), r.pop("_df"), r["p_value"], r["p_holm"], alpha)
        if rej:
            r["trend"] = TREND_GROWS if r["slope"] < 0 else TREND_SHRINKS
    for r in rows:
        if r["trend"] not in (TREND_GROWS, TREND_SHRINKS):
            r["crossing_flops"] = math.nan  # a sign change without a trend is noise


def effects_by_budget(scaling: pd.DataFrame, metric_of: dict[str, str]) -> pd.DataFrame:
    """Every variant against the baseline at each budget, exactly as the report compares them
    at one (:func:`lmablate.report.stats.statistics.compare`: paired by seed, Holm-corrected over
    a dataset's variants at that budget, the intervals at the level the adjusted p-value is
    judged at), on each dataset's headline loss. Columns ``budget_flops`` and
    :data:`~lmablate.report.stats.statistics.COMPARISON_COLUMNS`, by dataset, budget, variant."""
    frames = []
    for (dataset, budget), frame in scaling.groupby(["dataset", "budget_flops"], observed=True,
                                                    sort=True):
        rows = compare(frame, metrics=(metric_of[str(dataset)],))
        rows.insert(0, "budget_flops", budget)
        frames.append(rows)
    if not frames:
        return pd.DataFrame(columns=["budget_flops", *COMPARISON_COLUMNS])
    return pd.concat(frames, ignore_index=True)
