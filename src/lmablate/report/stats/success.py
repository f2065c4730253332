"""Whether each seed learned the arithmetic task, and the share of seeds that did.

A model learns the default task suddenly, after 1,000 to 2,000 optimizer steps, so a seed's
exact match is close to 0 or well above it, and a mean over seeds hides which seeds failed. A
seed **learned** when its greedy-decoded answers reach :data:`LEARNED_EXACT_MATCH` exact match
on the test problems. Per variant the report gives how many seeds learned, their share with its
exact binomial (Clopper-Pearson, 1934) interval (``scipy.stats.binomtest(...).proportion_ci(
method="exact")``), which stays in [0, 1] and is not empty at 0 or n of n, and names each seed
that did not learn. Shares are fractions of seeds.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd
from scipy import stats

from lmablate.report.stats.statistics import CONFIDENCE

LEARNED_EXACT_MATCH = 0.5  # a seed that answers half the test problems has learned the task
SUCCESS_COLUMNS = ["dataset", "variant", "n_seeds", "n_learned", "share", "ci95_low",
                   "ci95_high", "threshold", "not_learned"]


def learned(exact_match: float) -> bool:
    """Whether a seed with this test exact match (fraction) learned the task."""
    return bool(exact_match >= LEARNED_EXACT_MATCH)


def share_interval(k: int, n: int) -> tuple[float, float]:
    """The :data:`~lmablate.report.stats.statistics.CONFIDENCE` Clopper-Pearson interval of a share
    of ``k`` successes in ``n`` trials (fractions; ``(0, x)`` at k = 0, ``(x, 1)`` at k = n).

    Raises:
        ValueError: n < 1 or k outside [0, n].
    """
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=CONFIDENCE, method="exact")
    return float(ci.low), float(ci.high)


def success_table(ablation: pd.DataFrame) -> pd.DataFrame:
    """Per dataset x variant with an exact match: its seeds, how many learned
    (:func:`learned`), their ``share`` with its Clopper-Pearson interval
    (:func:`share_interval`), the ``threshold`` and the seeds that did not learn with their
    exact match (``"0 (0.018); 3 (0.102)"``, empty when all did).

    Returns:
        Columns :data:`SUCCESS_COLUMNS`, in the order of ``ablation`` (the study order).
    """
    if ablation.empty or "exact_match" not in ablation:
        return pd.DataFrame(columns=SUCCESS_COLUMNS)
    a = ablation.dropna(subset=["exact_match"])
    rows = []
    for (ds, variant), g in a.groupby(["dataset", "variant"], observed=True, sort=False):
        g = g.sort_values("seed")
        em = g["exact_match"].astype(float).to_numpy()
        ok = np.array([learned(x) for x in em])
        low, high = share_interval(int(ok.sum()), len(em))
        rows.append({"dataset": ds, "variant": variant, "n_seeds": len(em),
                     "n_learned": int(ok.sum()), "share": float(ok.mean()), "ci95_low": low,
                     "ci95_high": high, "threshold": LEARNED_EXACT_MATCH,
                     "not_learned": "; ".join(f"{int(s)} ({x:.3f})" for s, x, good in
                                              zip(g["seed"], em, ok) if not good)})
    return pd.DataFrame(rows, columns=SUCCESS_COLUMNS)


def seed_status(ablation: pd.DataFrame, dataset: str, variant: str, seed: int) -> str | None:
    """``"exact match 0.018: did not learn"`` of one seed's run; None without its exact
    match."""
    a = ablation[(ablation["dataset"] == dataset) & (ablation["variant"] == variant)
                 & (ablation["seed"] == seed)] if "exact_match" in ablation else ablation.iloc[:0]
    if a.empty or pd.isna(a["exact_match"].iloc[0]):
        return None
    x = float(a["exact_match"].iloc[0])
    return f"exact match {x:.3f}: " + ("learned" if learned(x) else "did not learn")
