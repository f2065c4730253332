"""Each variant's tuning uncertainty drawn with the seed spread pooled over its dataset's
brackets.

A study measures the seed-to-seed spread of a full-budget trial on its own points: with two
tuning seeds, one degree of freedom each, 3-7 in all, so a study's own spread can come out
several times too small by chance, and its uncertainty with it. The variants of a dataset train
the same data at nearby widths, so the report pools the spread over all of them
(:func:`lmablate.tune.lr_minimum.pooled_spread`) and draws every variant's bootstrap again with it
(:func:`lmablate.tune.lr_minimum.tuning_uncertainty`, at the chosen learning rate, same draws and
seed). The points come from ``trials.csv`` (the full-budget trials at the kept width), the
chosen learning rate from ``best.json``; nats/char throughout.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from lmablate.report.figures.bracket_figure import full_budget_trials
from lmablate.tune.lr_minimum import Point, pooled_spread, tuning_uncertainty


def bracket_points(trials: pd.DataFrame, dataset: str, variant: str, d_model: int
                   ) -> list[Point]:
    """The full-budget points of ``variant`` on ``dataset`` at ``d_model``, sorted by lr: each
    learning rate's loss per tuning seed, ``inf`` for a seed that diverged (no value)."""
    t = full_budget_trials(trials, dataset)
    t = t[(t["variant"] == variant) & (t["params_d_model"] == d_model)]
    points = []
    for lr, group in t.groupby("params_lr", sort=True):
        values = pd.to_numeric(group.sort_values("seed")["value"], errors="coerce")
        points.append(Point(float(lr), tuple(math.inf if np.isnan(v) else float(v)
                                             for v in values)))
    return points


def with_pooled_uncertainty(tuned: pd.DataFrame, trials: pd.DataFrame) -> pd.DataFrame:
    """``tuned`` (the study's tuned rows, :data:`~lmablate.report.run_files.TUNED_COLUMNS`)
    with ``seed_spread_pooled`` per dataset and each bracketed variant's ``regret`` and
    ``tuning_uncertainty`` drawn again with it. Rows without a bracket, or whose points the
    trials do not hold, keep their values; a dataset with no two-seed point keeps them all."""
    out = tuned.copy()
    if out.empty or "bracket_state" not in out or trials is None or trials.empty:
        return out
    out["seed_spread_pooled"] = out["seed_spread_pooled"].astype(float)
    for dataset in out["dataset"].unique():
        rows = out.index[(out["dataset"] == dataset) & out["bracket_state"].notna()]
        points = {i: bracket_points(trials, str(dataset), str(out.at[i, "variant"]),
                                    int(out.at[i, "d_model"])) for i in rows}
        spread = pooled_spread([p for p in points.values() if p])
        if spread is None:
            continue
        for i, pts in points.items():
            out.at[i, "seed_spread_pooled"] = spread
            if not pts:
                continue
            u = tuning_uncertainty(pts, float(out.at[i, "lr"]), spread=spread)
            if u is not None:
                out.at[i, "regret"], out.at[i, "tuning_uncertainty"] = u.median, u.bound
    return out
