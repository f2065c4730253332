"""Tuning uncertainties drawn again with the seed spread pooled over a dataset's full-budget runs
(``trials.csv``, ``history.csv``), as one study's own can be far too small. Nats/char."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from lmablate.report.collect import rows_of
from lmablate.tune.lr_minimum import Point, pooled_spread, tuning_uncertainty


def full_budget_trials(trials: pd.DataFrame, dataset: str) -> pd.DataFrame:
    """``dataset``'s trials at the full budget (``budget_fraction`` 1) of a study whose last
    rung is a bracket (trials carry a ``seed``); empty otherwise."""
    if trials is None or trials.empty or "seed" not in trials:
        return pd.DataFrame(columns=getattr(trials, "columns", []))
    t = trials[(trials["dataset"] == dataset)
               & np.isclose(trials["budget_fraction"].astype(float), 1.0)]
    return t.sort_values(["variant", "params_lr", "seed"], kind="stable")


def bracket_points(trials: pd.DataFrame, dataset: str, variant: str, d_model: int
                   ) -> list[Point]:
    """The full-budget points of ``variant`` on ``dataset`` at ``d_model``, sorted by lr: each
    learning rate's loss per tuning seed, ``inf`` for a seed that diverged (no value)."""
    t = rows_of(full_budget_trials(trials, dataset), dataset, variant)
    return [Point(float(lr), tuple(math.inf if np.isnan(v) else float(v) for v in
                                   pd.to_numeric(g.sort_values("seed")["value"], errors="coerce")))
            for lr, g in t[t["params_d_model"] == d_model].groupby("params_lr", sort=True)]


def final_points(history: pd.DataFrame | None, tuned: pd.DataFrame, dataset: str
                 ) -> list[Point]:
    """Per variant of ``dataset`` in ``tuned`` with final seeds in ``history``, a point at its
    tuned lr: each seed's ``objective`` at its last evaluation (or mean over them)."""
    if history is None or history.empty:
        return []
    points = []
    for _, row in tuned[tuned["dataset"] == dataset].iterrows():
        objective = row.get("objective") if isinstance(row.get("objective"), str) else "val_loss"
        column = objective.removesuffix("_mean")  # val_answer_loss_mean: the mean over a run
        h = rows_of(history, dataset, row["variant"])
        if h.empty or column not in h:
            continue
        h = h.sort_values(["seed", "step"])
        by_seed = pd.to_numeric(h[column], errors="coerce").groupby(h["seed"], sort=True)
        # a NaN evaluation makes the seed's mean NaN, so its point is left out
        losses = tuple(float(v) for v in (by_seed.agg(lambda v: v.mean(skipna=False))
                                          if column != objective else by_seed.tail(1)))
        if losses and all(math.isfinite(v) for v in losses):
            points.append(Point(float(row["lr"]), losses))
    return points


def with_pooled_uncertainty(tuned: pd.DataFrame, trials: pd.DataFrame,
                            history: pd.DataFrame | None = None) -> pd.DataFrame:
    """``tuned`` (:data:`~lmablate.report.run_files.TUNED_COLUMNS`) with each dataset's pooled
    spread (:func:`lmablate.tune.lr_minimum.pooled_spread`) and each bracketed variant's
    ``regret`` and ``tuning_uncertainty`` drawn again with it; others keep theirs."""
    out = tuned.copy()
    if out.empty or "bracket_state" not in out or trials is None or trials.empty:
        return out
    out["seed_spread_pooled"] = out["seed_spread_pooled"].astype(float)
    for dataset in out["dataset"].unique():
        rows = out.index[(out["dataset"] == dataset) & out["bracket_state"].notna()]
        points = {i: bracket_points(trials, str(dataset), str(out.at[i, "variant"]),
                                    int(out.at[i, "d_model"])) for i in rows}
        spread = pooled_spread([p for p in points.values() if p]
                               + [[p] for p in final_points(history, out, str(dataset))])
        if spread is None:
            continue
        for i, pts in points.items():
            out.at[i, "seed_spread_pooled"] = spread
            u = tuning_uncertainty(pts, float(out.at[i, "lr"]), spread=spread) if pts else None
            if u is not None:
                out.at[i, "regret"], out.at[i, "tuning_uncertainty"] = u.median, u.bound
    return out
