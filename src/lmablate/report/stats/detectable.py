"""``detectable_effects.csv``: the minimum detectable effect of each comparison, the ``mde``
column every MDE of the report quotes. In each metric's unit."""

from __future__ import annotations

import pandas as pd

from lmablate.report.stats.statistics import ALPHA, POWER

DETECTABLE_COLUMNS = ["dataset", "metric", "variant", "n_pairs", "n_compared", "alpha", "power",
                      "sd_diff", "mde"]


def detectable_table(comparisons: pd.DataFrame, alpha: float = ALPHA,
                     power: float = POWER) -> pd.DataFrame:
    """One row per tested comparison of ``comparisons`` (:func:`~lmablate.report.stats.
    statistics.compare`), its ``mde`` copied from there (power ``power`` at Holm's strictest
    level ``alpha / n_compared``). Columns :data:`DETECTABLE_COLUMNS`."""
    if comparisons.empty:
        return pd.DataFrame(columns=DETECTABLE_COLUMNS)
    tested = comparisons[comparisons["p_value"].notna()]
    n_compared = tested.groupby(["dataset", "metric"], observed=True)["variant"].transform("size")
    return tested.assign(n_compared=n_compared, alpha=alpha,
                         power=power)[DETECTABLE_COLUMNS].reset_index(drop=True)
