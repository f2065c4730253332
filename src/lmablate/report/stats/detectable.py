"""The smallest difference each comparison could detect: the table behind
``detectable_effects.csv``, whose ``mde`` column every minimum detectable effect of the report
quotes. In each metric's unit.
"""

from __future__ import annotations

import pandas as pd

from lmablate.report.stats.statistics import ALPHA, POWER

DETECTABLE_COLUMNS = ["dataset", "metric", "variant", "n_pairs", "n_compared", "alpha", "power",
                      "sd_diff", "mde"]


def detectable_table(comparisons: pd.DataFrame, alpha: float = ALPHA,
                     power: float = POWER) -> pd.DataFrame:
    """``detectable_effects.csv``: one row per tested comparison (variant vs baseline, dataset x
    metric), its minimum detectable effect ``mde`` copied from ``comparisons`` (:func:`~lmablate.
    report.stats.statistics.compare`: power ``power`` at Holm's strictest level ``alpha /
    n_compared``, at the row's ``sd_diff`` and ``n_pairs``), so every MDE the report states is
    that column. In the metric's unit; columns :data:`DETECTABLE_COLUMNS`."""
    if comparisons.empty:
        return pd.DataFrame(columns=DETECTABLE_COLUMNS)
    tested = comparisons[comparisons["p_value"].notna()]
    n_compared = tested.groupby(["dataset", "metric"], observed=True)["variant"].transform("size")
    out = tested.assign(n_compared=n_compared, alpha=alpha, power=power)
    return out[DETECTABLE_COLUMNS].reset_index(drop=True)
