"""Each variant's tuning uncertainty drawn with the seed spread pooled over its dataset's
full-budget runs: its brackets' points and its final seeds.

A bracket point's loss is one full-budget run per tuning seed; with one tuning seed a study
cannot measure its own spread, and with two it rests on 3-7 degrees of freedom, so a study's
own spread can come out several times too small by chance, and its uncertainty with it. The
final runs are full-budget runs of the same objective (the last evaluation's validation loss,
or an arithmetic run's probe answer loss) on the study's seeds: 4 degrees of freedom per
variant. The variants of a dataset train the same data at nearby widths, so the report pools
the spread over all of them, points and final seeds (:func:`lmablate.tune.lr_minimum.
pooled_spread`), and draws every variant's bootstrap again with it
(:func:`lmablate.tune.lr_minimum.tuning_uncertainty`, at the chosen learning rate, same draws and
seed). The points come from ``trials.csv`` (the full-budget trials at the kept width), the
chosen learning rate from ``best.json``, the final seeds' objective from ``history.csv``'s last
row of each seed; nats/char throughout.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

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
    t = full_budget_trials(trials, dataset)
    t = t[(t["variant"] == variant) & (t["params_d_model"] == d_model)]
    points = []
    for lr, group in t.groupby("params_lr", sort=True):
        values = pd.to_numeric(group.sort_values("seed")["value"], errors="coerce")
        points.append(Point(float(lr), tuple(math.inf if np.isnan(v) else float(v)
                                             for v in values)))
    return points


def final_points(history: pd.DataFrame | None, tuned: pd.DataFrame, dataset: str
                 ) -> list[Point]:
    """One point per variant of ``dataset`` in ``tuned`` whose final seeds ``history`` holds:
    at its tuned lr, the objective (``tuned``'s ``objective``: ``val_loss`` or
    ``val_answer_loss``) of each seed's last evaluation, or for ``val_answer_loss_mean`` the
    mean of each seed's ``val_answer_loss`` over its evaluations, in seed order."""
    if history is None or history.empty:
        return []
    points = []
    for _, row in tuned[tuned["dataset"] == dataset].iterrows():
        column = row.get("objective") if isinstance(row.get("objective"), str) else "val_loss"
        mean = column == "val_answer_loss_mean"
        column = "val_answer_loss" if mean else column
        h = history[(history["dataset"] == dataset) & (history["variant"] == row["variant"])]
        if h.empty or column not in h:
            continue
        h = h.sort_values(["seed", "step"])
        values = pd.to_numeric(h[column], errors="coerce")
        if mean:  # a NaN evaluation makes the seed's mean NaN, so its point is left out
            per_seed = values.groupby(h["seed"], sort=True).agg(lambda v: v.mean(skipna=False))
        else:
            per_seed = values.groupby(h["seed"], sort=True).tail(1)
        losses = tuple(float(v) for v in per_seed)
        if losses and all(math.isfinite(v) for v in losses):
            points.append(Point(float(row["lr"]), losses))
    return points


def with_pooled_uncertainty(tuned: pd.DataFrame, trials: pd.DataFrame,
                            history: pd.DataFrame | None = None) -> pd.DataFrame:
    """``tuned`` (the study's tuned rows, :data:`~lmablate.report.run_files.TUNED_COLUMNS`)
    with ``seed_spread_pooled`` per dataset (over its brackets' points with two seeds or more
    and, with ``history``, its final seeds: :func:`final_points`) and each bracketed variant's
    ``regret`` and ``tuning_uncertainty`` drawn again with it. Rows without a bracket, or whose
    points the trials do not hold, keep their values; a dataset with nothing to pool keeps
    them all."""
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
            if not pts:
                continue
            u = tuning_uncertainty(pts, float(out.at[i, "lr"]), spread=spread)
            if u is not None:
                out.at[i, "regret"], out.at[i, "tuning_uncertainty"] = u.median, u.bound
    return out
