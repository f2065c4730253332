"""Whether each seed learned the arithmetic task (a mean over seeds hides the seeds that failed)
and per variant the share of seeds that did, with its Clopper-Pearson (1934) interval."""

from __future__ import annotations

import pandas as pd
from scipy import stats

from lmablate.report.collect import rows_of
from lmablate.report.stats.statistics import CONFIDENCE

LEARNED_EXACT_MATCH = 0.5  # a seed that answers half the test problems has learned the task
SUCCESS_COLUMNS = ["dataset", "variant", "n_seeds", "n_learned", "share", "ci95_low",
                   "ci95_high", "threshold", "not_learned"]


def learned(exact_match: float) -> bool:
    """Whether a seed with this test exact match (fraction) learned the task."""
    return bool(exact_match >= LEARNED_EXACT_MATCH)


def share_interval(k: int, n: int) -> tuple[float, float]:
    """The 95% Clopper-Pearson interval of ``k`` successes in ``n`` trials (``scipy.stats.
    binomtest``), as fractions; ValueError for n < 1 or k outside [0, n]."""
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=CONFIDENCE, method="exact")
    return float(ci.low), float(ci.high)


def success_table(ablation: pd.DataFrame) -> pd.DataFrame:
    """Per dataset x variant with an exact match, the seeds that :func:`learned`, their share,
    :func:`share_interval` and those that did not (:data:`SUCCESS_COLUMNS`)."""
    if ablation.empty or "exact_match" not in ablation:
        return pd.DataFrame(columns=SUCCESS_COLUMNS)
    rows = []
    for (ds, variant), g in ablation.dropna(subset=["exact_match"]).groupby(
            ["dataset", "variant"], observed=True, sort=False):
        g = g.sort_values("seed")
        em = g["exact_match"].astype(float).to_numpy()
        ok = em >= LEARNED_EXACT_MATCH  # learned()
        low, high = share_interval(int(ok.sum()), len(em))
        rows.append({"dataset": ds, "variant": variant, "n_seeds": len(em),
                     "n_learned": int(ok.sum()), "share": float(ok.mean()), "ci95_low": low,
                     "ci95_high": high, "threshold": LEARNED_EXACT_MATCH,
                     "not_learned": "; ".join(f"{int(s)} ({x:.3f})" for s, x, good in
                                              zip(g["seed"], em, ok) if not good)})
    return pd.DataFrame(rows, columns=SUCCESS_COLUMNS)


def seed_status(ablation: pd.DataFrame, dataset: str, variant: str, seed: int) -> str | None:
    """``"exact match 0.018: did not learn"`` of one seed's run; None without its exact match."""
    a = rows_of(ablation, dataset, variant)
    x = a.loc[a["seed"] == seed].get("exact_match", pd.Series(dtype=float))
    if x.empty or pd.isna(x.iloc[0]):
        return None
    return f"exact match {float(x.iloc[0]):.3f}: " + ("learned" if learned(x.iloc[0])
                                                     else "did not learn")
