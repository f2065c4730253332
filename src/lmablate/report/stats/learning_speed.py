"""How fast each variant learns arithmetic: training tokens (steps x batch x context) until a
seed's probe exact match reaches a threshold, a time-to-event outcome (censored at the last
evaluation). Ratios unitless, exact match a fraction."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd
from scipy import stats
from statsmodels.duration.survfunc import SurvfuncRight, survdiff

from lmablate.report.collect import BASELINE, present
from lmablate.report.stats.statistics import (ALPHA, CONFIDENCE, MIN_SEEDS_FOR_TEST, VERDICT_FEW,
                                          VERDICT_NSD, holm_p, min_detectable_effect)

THRESHOLDS = (0.5, 0.9)  # exact match a seed has "learned" at (0.5) and "mastered" (0.9)
SPEED_COLUMNS = ["dataset", "variant", "seed", "threshold", "tokens", "learned"]
TABLE_COLUMNS = ["dataset", "variant", "threshold", "n_seeds", "n_learned", "median_tokens",
                 "median_low", "median_high", "budget_tokens"]
COMPARISON_COLUMNS = ["dataset", "variant", "threshold", "n_pairs", "variant_first",
                      "baseline_first", "ties", "p_value", "p_holm", "n_both", "ratio",
                      "ratio_low", "ratio_high", "mde_ratio", "verdict"]
VERDICT_FASTER, VERDICT_SLOWER = "faster", "slower"


def tokens_to_learn(history: pd.DataFrame, thresholds: Sequence[float] = THRESHOLDS
                    ) -> pd.DataFrame:
    """:data:`SPEED_COLUMNS` per probed run of ``history`` and threshold, in study order:
    ``tokens`` at the first evaluation whose ``val_exact_match`` reaches it (``learned``), or at
    the last one (censored)."""
    if history.empty or "val_exact_match" not in history:
        return pd.DataFrame(columns=SPEED_COLUMNS)
    rows = []
    for (ds, variant, seed), g in history.dropna(subset=["val_exact_match"]).groupby(
            ["dataset", "variant", "seed"], observed=True, sort=True):
        g = g.sort_values("step")
        em, tokens = g["val_exact_match"].to_numpy(float), g["tokens"].to_numpy(float)
        for threshold in thresholds:
            hit = np.flatnonzero(em >= threshold)
            rows.append({"dataset": ds, "variant": variant, "seed": int(seed),
                         "threshold": threshold, "learned": bool(len(hit)),
                         "tokens": float(tokens[hit[0]] if len(hit) else tokens[-1])})
    out = pd.DataFrame(rows, columns=SPEED_COLUMNS)
    for col in ("dataset", "variant"):  # the study order
        out[col] = out[col].astype(str).astype(history[col].dtype)
    return out


def _fitter(g: pd.DataFrame):
    """The Kaplan-Meier estimate of the share not yet learned, or None if none learned."""
    return SurvfuncRight(g["tokens"].to_numpy(float), g["learned"].to_numpy(int)) \
        if g["learned"].any() else None


def speed_table(speed: pd.DataFrame) -> pd.DataFrame:
    """Columns :data:`TABLE_COLUMNS` per dataset x variant x threshold, in the order of
    ``speed``: seeds, seeds learned, the Kaplan-Meier (1958) median tokens to learn and its
    interval (Brookmeyer & Crowley 1982, log-log; ``inf`` where it does not pass one half),
    and the most tokens any seed trained."""
    if speed.empty:
        return pd.DataFrame(columns=TABLE_COLUMNS)
    rows = []
    for (ds, variant, threshold), g in speed.groupby(["dataset", "variant", "threshold"],
                                                     observed=True, sort=False):
        km = _fitter(g)
        median, low, high = math.inf, math.nan, math.inf
        if km is not None:
            with np.errstate(all="ignore"):  # log(-log S) at S = 0 or 1: a NaN bound
                median = float(km.quantile(0.5))
                low, high = (float(x) for x in km.quantile_ci(0.5, alpha=1 - CONFIDENCE))
            median = math.inf if math.isnan(median) else median  # never down to one half
        rows.append({"dataset": ds, "variant": variant, "threshold": threshold,
                     "n_seeds": len(g), "n_learned": int(g["learned"].sum()),
                     "median_tokens": median, "median_low": low, "median_high": high,
                     "budget_tokens": float(g["tokens"].max())})
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def share_learned_curves(speed: pd.DataFrame, dataset: str, threshold: float
                         ) -> dict[str, pd.DataFrame]:
    """variant -> the Kaplan-Meier share of seeds learned against tokens with its pointwise
    interval (Greenwood's SE, log-log: Kalbfleisch & Prentice 2002, eq. 1.13): a step function
    from (0, 0), columns ``tokens``, ``share``, ``low``, ``high`` (fractions)."""
    s = speed[(speed["dataset"] == dataset) & (speed["threshold"] == threshold)]
    z = stats.norm.ppf(0.5 + CONFIDENCE / 2)
    out = {}
    for variant in present(s["variant"]):
        km = _fitter(s[s["variant"] == variant])
        times, surv, se = ((km.surv_times, km.surv_prob, km.surv_prob_se) if km is not None
                           else (np.array([]),) * 3)
        with np.errstate(all="ignore"):  # S = 0 or 1: no spread on the log-log scale
            v = z * se / np.abs(surv * np.log(surv))
            low_s, high_s = surv ** np.exp(v), surv ** np.exp(-v)
        inner = (surv > 0) & (surv < 1) & np.isfinite(v)
        out[str(variant)] = pd.DataFrame({
            k: np.concatenate([[0.0], x]) for k, x in (
                ("tokens", times), ("share", 1 - surv),
                ("low", 1 - np.where(inner, high_s, surv)),
                ("high", 1 - np.where(inner, low_s, surv)))})
    return out


def _first(b: pd.Series, v: pd.Series) -> int:
    """+1 when the variant learned first, -1 when the baseline did, 0 for a tie."""
    if v["learned"] != b["learned"]:
        return 1 if v["learned"] else -1
    return int(v["tokens"] < b["tokens"]) - int(b["tokens"] < v["tokens"]) if v["learned"] else 0


def log_rank(base: pd.DataFrame, var: pd.DataFrame) -> tuple[float, float]:
    """The log-rank test (Mantel 1966) of two variants' rows of :data:`SPEED_COLUMNS`:
    ``(p, o_minus_e)``, the two-sided p-value (1 with nothing to compare) and the variant's
    observed minus expected seeds learned (> 0: sooner)."""
    time = np.concatenate([base["tokens"].to_numpy(float), var["tokens"].to_numpy(float)])
    status = np.concatenate([base["learned"].to_numpy(bool), var["learned"].to_numpy(bool)])
    group = np.repeat([0, 1], [len(base), len(var)])
    o_minus_e, ours = 0.0, group == 1
    for t in np.unique(time[status]):
        events, at_risk = status & (time == t), time >= t
        o_minus_e += events[ours].sum() - events.sum() * (at_risk[ours].sum() / at_risk.sum())
    try:
        _, p = survdiff(time, status.astype(int), group)
    except np.linalg.LinAlgError:  # no variance: nothing learned, or all at one evaluation
        return 1.0, o_minus_e
    return (float(p) if math.isfinite(p) else 1.0), float(o_minus_e)


def compare_speed(speed: pd.DataFrame, baseline: str = BASELINE,
                  alpha: float = ALPHA) -> pd.DataFrame:
    """:data:`COMPARISON_COLUMNS` of each variant against ``baseline`` per dataset and threshold:
    seeds won, :func:`log_rank` (unstratified: a seed's two runs learn at unrelated times) with
    Holm over the variants, the geometric mean ratio of tokens where both learned with its
    t-interval and :func:`~lmablate.report.stats.statistics.min_detectable_effect` (80%)."""
    if speed.empty:
        return pd.DataFrame(columns=COMPARISON_COLUMNS)
    rows: list[dict] = []
    for ds in present(speed["dataset"]):
        for threshold in sorted(speed["threshold"].unique()):
            s = speed[(speed["dataset"] == ds) & (speed["threshold"] == threshold)]
            base = s[s["variant"] == baseline].set_index("seed")
            if base.empty:
                continue
            found = [_speed_row(ds, variant, threshold, base,
                                s[s["variant"] == variant].set_index("seed"))
                     for variant in present(s["variant"]) if variant != baseline]
            family = [i for i, r in enumerate(found) if "_o_minus_e" in r]
            for i, rej in zip(family, holm_p(found, family, alpha)):
                r = found[i]  # its working _sd and _o_minus_e are no column
                if rej:
                    r["verdict"] = VERDICT_FASTER if r["_o_minus_e"] > 0 else VERDICT_SLOWER
                if "_sd" in r:
                    r["mde_ratio"] = float(np.exp(min_detectable_effect(
                        r["_sd"], r["n_both"], alpha / len(family))))
            rows += found
    return pd.DataFrame(rows, columns=COMPARISON_COLUMNS)


def _speed_row(ds: str, variant: str, threshold: float, base: pd.DataFrame,
               var: pd.DataFrame) -> dict:
    seeds = sorted(set(base.index) & set(var.index))
    signs = [_first(base.loc[k], var.loc[k]) for k in seeds]
    both = [k for k in seeds if base.loc[k, "learned"] and var.loc[k, "learned"]]
    logs = np.log([var.loc[k, "tokens"] / base.loc[k, "tokens"] for k in both])
    row = {"dataset": ds, "variant": variant, "threshold": threshold,
           "n_pairs": len(seeds), "variant_first": signs.count(1),
           "baseline_first": signs.count(-1), "ties": signs.count(0),
           "p_value": math.nan, "p_holm": math.nan, "n_both": len(both),
           "ratio": float(np.exp(logs.mean())) if len(logs) else math.nan,
           "ratio_low": math.nan, "ratio_high": math.nan, "mde_ratio": math.nan,
           "verdict": VERDICT_FEW}
    if len(logs) > 1 and np.ptp(logs) > 0:
        low, high = stats.t.interval(CONFIDENCE, len(logs) - 1, loc=logs.mean(),
                                     scale=stats.sem(logs))
        row.update(ratio_low=float(np.exp(low)), ratio_high=float(np.exp(high)),
                   _sd=float(np.std(logs, ddof=1)))
    if len(seeds) >= MIN_SEEDS_FOR_TEST:
        row["verdict"] = VERDICT_NSD
        row["p_value"], row["_o_minus_e"] = log_rank(base.loc[seeds], var.loc[seeds])
    return row

