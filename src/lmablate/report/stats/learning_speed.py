"""How fast each variant learns arithmetic: training tokens until a seed's probe exact match
(``history.csv``'s ``val_exact_match``) reaches a threshold, as a time-to-event outcome (a seed
that never does is censored at its last evaluation). Tokens are training tokens (steps x batch x
context); ratios unitless; exact match a fraction.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd
from scipy import stats
from statsmodels.duration.survfunc import survdiff

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
VERDICT_FASTER = "faster"
VERDICT_SLOWER = "slower"


def tokens_to_learn(history: pd.DataFrame, thresholds: Sequence[float] = THRESHOLDS
                    ) -> pd.DataFrame:
    """One row per dataset x variant x seed x threshold of the probed runs in ``history``
    (:attr:`~lmablate.report.collect.RunOutputs.history`, the headline budget): ``tokens`` at
    the first evaluation whose ``val_exact_match`` reaches the threshold (``learned`` True), or
    at the last one (``learned`` False: censored). Runs without ``val_exact_match`` give none.

    Returns:
        Columns :data:`SPEED_COLUMNS`, in the study order of ``history``'s categorical
        ``dataset``/``variant`` (kept), then seed.
    """
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
                         "threshold": threshold,
                         "tokens": float(tokens[hit[0]] if len(hit) else tokens[-1]),
                         "learned": bool(len(hit))})
    out = pd.DataFrame(rows, columns=SPEED_COLUMNS)
    for col in ("dataset", "variant"):
        out[col] = out[col].astype(str).astype(history[col].dtype)
    return out


def _fitter(g: pd.DataFrame):
    """The Kaplan-Meier estimate of the share of ``g``'s seeds not yet learned, or None when
    none learned."""
    from statsmodels.duration.survfunc import SurvfuncRight  # only the report needs it

    if not g["learned"].any():
        return None
    return SurvfuncRight(g["tokens"].to_numpy(float), g["learned"].to_numpy(int))


def speed_table(speed: pd.DataFrame) -> pd.DataFrame:
    """Per dataset x variant x threshold: its seeds, how many learned, the Kaplan-Meier
    (Kaplan & Meier 1958; statsmodels' ``SurvfuncRight``, as lifelines computes it) median
    tokens to learn and its :data:`~lmablate.report.stats.statistics.CONFIDENCE` interval
    (Brookmeyer & Crowley 1982 on the log-log scale; ``inf`` where the share learned, or its
    bound, does not pass one half), and ``budget_tokens``, the most tokens any seed trained.

    Returns:
        Columns :data:`TABLE_COLUMNS`, in the order of ``speed``.
    """
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
    """variant -> the Kaplan-Meier share of seeds that have learned (1 - survival) against
    training tokens, with its pointwise :data:`~lmablate.report.stats.statistics.CONFIDENCE`
    interval (Greenwood's standard error on the log-log scale, Kalbfleisch & Prentice 2002,
    eq. 1.13, as lifelines draws it): columns ``tokens``, ``share``, ``low``, ``high``
    (fractions), a step function that starts at 0 tokens with a share of 0."""
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
    """+1 when the variant's seed learned first, -1 when the baseline's did, 0 for a tie."""
    if v["learned"] != b["learned"]:
        return 1 if v["learned"] else -1
    return int(v["tokens"] < b["tokens"]) - int(b["tokens"] < v["tokens"]) if v["learned"] else 0


def log_rank(base: pd.DataFrame, var: pd.DataFrame) -> tuple[float, float]:
    """The log-rank test (Mantel 1966; statsmodels' ``survdiff``) of two variants' tokens to
    learn (rows of :data:`SPEED_COLUMNS`, censored where not ``learned``): ``(p, o_minus_e)``,
    the two-sided p-value and the variant's observed minus expected seeds learned (> 0: it
    learned sooner). p is 1 where there is nothing to compare (no seed learned, or every event
    at one time)."""
    time = np.concatenate([base["tokens"].to_numpy(float), var["tokens"].to_numpy(float)])
    status = np.concatenate([base["learned"].to_numpy(bool), var["learned"].to_numpy(bool)])
    group = np.repeat([0, 1], [len(base), len(var)])
    o_minus_e = 0.0
    for t in np.unique(time[status]):
        at_risk = time >= t
        events = status & (time == t)
        o_minus_e += events[group == 1].sum() - events.sum() * (
            at_risk[group == 1].sum() / at_risk.sum())
    try:
        _, p = survdiff(time, status.astype(int), group)
    except np.linalg.LinAlgError:  # no variance: nothing learned, or all at one evaluation
        return 1.0, o_minus_e
    return (float(p) if math.isfinite(p) else 1.0), float(o_minus_e)


def compare_speed(speed: pd.DataFrame, baseline: str = BASELINE,
                  alpha: float = ALPHA) -> pd.DataFrame:
    """Every variant against ``baseline`` in tokens to learn, per dataset and threshold: the
    seeds won by each and the ties, the p-value of :func:`log_rank` (not stratified by seed: a
    seed's two runs learn at unrelated times, and a sign test on 5 seeds cannot go below
    p = 0.0625) and its Holm correction over the dataset's variants, the geometric mean ratio
    of tokens to learn (variant / baseline) where both learned with its t-interval, and
    ``mde_ratio``, the smallest ratio above 1 a paired t-test of the log ratios would detect
    with 80% power at Holm's strictest level
    (:func:`~lmablate.report.stats.statistics.min_detectable_effect`). Verdict: faster or
    slower (the sign of observed minus expected) where Holm rejects, too few seeds below
    :data:`~lmablate.report.stats.statistics.MIN_SEEDS_FOR_TEST` pairs, else no significant
    difference.

    Returns:
        Columns :data:`COMPARISON_COLUMNS`; rows by dataset, threshold, then variant.
    """
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
            _judge_speed(found, alpha)
            rows += found
    return pd.DataFrame(rows, columns=COMPARISON_COLUMNS)


def _speed_row(ds: str, variant: str, threshold: float, base: pd.DataFrame,
               var: pd.DataFrame) -> dict:
    """One variant's row before Holm's correction (``_sd``, ``_o_minus_e`` for it)."""
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


def _judge_speed(rows: list[dict], alpha: float) -> None:
    """Holm's correction over one dataset and threshold's tested ``rows``, in place."""
    family = [i for i, r in enumerate(rows) if "_o_minus_e" in r]
    for i, rej in zip(family, holm_p(rows, family, alpha)):
        r = rows[i]
        if rej:
            r["verdict"] = VERDICT_FASTER if r["_o_minus_e"] > 0 else VERDICT_SLOWER
        if "_sd" in r:
            r["mde_ratio"] = float(np.exp(min_detectable_effect(
                r["_sd"], r["n_both"], alpha / len(family))))
    for r in rows:
        r.pop("_sd", None)
        r.pop("_o_minus_e", None)
