"""The isoFLOP view of a scaling study: per budget, validation loss (nats/char) against
``d_model`` from the lowest rung's tuning trials (equal compute at every width), and the
compute-optimal width (Hoffmann et al. 2022, approach 2, fig. 3)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

ISOFLOP_COLUMNS = ["dataset", "variant", "budget_flops", "trial_flops", "d_model", "val_loss",
                   "lr", "n_trials"]
OPTIMAL_COLUMNS = ["dataset", "variant", "budget_flops", "trial_flops", "n_widths",
                   "optimal_d_model", "method", "tuned_d_model"]
PARABOLA, BEST = "parabola vertex", "best measured"


def isoflop_points(trials: pd.DataFrame) -> pd.DataFrame:
    """:data:`ISOFLOP_COLUMNS`: per dataset x variant x budget of ``trials``
    (``RunOutputs.scaling_trials``), the best completed trial of the lowest rung (the one that
    spans the widths) at each width, ``trial_flops`` its compute (FLOPs), ``n_trials`` there."""
    need = {"budget_flops", "rung", "state", "value", "params_d_model", "params_lr",
            "budget_fraction"}
    if trials.empty or not need <= set(trials.columns):
        return pd.DataFrame(columns=ISOFLOP_COLUMNS)
    done = trials[(trials["state"] == "COMPLETE") & np.isfinite(trials["value"].astype(float))]
    rows = []
    for (dataset, variant, budget), group in done.groupby(
            ["dataset", "variant", "budget_flops"], observed=True, sort=True):
        lowest = group[group["rung"] == group["rung"].min()]
        for d_model, width in lowest.groupby("params_d_model", sort=True):
            best = width.loc[width["value"].astype(float).idxmin()]
            rows.append({"dataset": dataset, "variant": variant, "budget_flops": float(budget),
                         "trial_flops": float(budget) * float(best["budget_fraction"]),
                         "d_model": int(d_model), "val_loss": float(best["value"]),
                         "lr": float(best["params_lr"]), "n_trials": len(width)})
    return pd.DataFrame(rows, columns=ISOFLOP_COLUMNS)


def optimal_width(d_model: np.ndarray, loss: np.ndarray) -> tuple[float, str]:
    """``(width, method)``: the vertex of the parabola in log d fitted to 3+ widths if it opens
    upwards and lies within them (:data:`PARABOLA`), else the width of the lowest loss."""
    d_model, loss = np.asarray(d_model, dtype=float), np.asarray(loss, dtype=float)
    if not len(d_model):
        return math.nan, ""
    if len(d_model) >= 3:
        a, b, _ = np.polyfit(np.log(d_model), loss, 2)
        vertex = math.exp(-b / (2 * a)) if a > 0 else math.nan
        if d_model.min() <= vertex <= d_model.max():
            return float(vertex), PARABOLA
    return float(d_model[int(np.argmin(loss))]), BEST


def optimal_widths(points: pd.DataFrame, tuned: pd.DataFrame) -> pd.DataFrame:
    """:data:`OPTIMAL_COLUMNS`: :func:`optimal_width` per dataset x variant x budget of
    ``points``, with the width tuning chose (``tuned``, one row per budget)."""
    rows = []
    for (dataset, variant, budget), group in points.groupby(
            ["dataset", "variant", "budget_flops"], observed=True, sort=True):
        # a width tried at one lr only may sit well above its best loss: left out of the fit
        # wherever three widths were tried at two or more
        tried = group[group["n_trials"] >= 2]
        used = tried if len(tried) >= 3 else group
        width, method = optimal_width(used["d_model"].to_numpy(), used["val_loss"].to_numpy())
        match = tuned[(tuned["dataset"].astype(str) == str(dataset))
                      & (tuned["variant"].astype(str) == str(variant))
                      & np.isclose(tuned["budget_flops"].astype(float), float(budget))]
        rows.append({"dataset": dataset, "variant": variant, "budget_flops": budget,
                     "trial_flops": float(group["trial_flops"].iloc[0]),
                     "n_widths": len(group), "optimal_d_model": width, "method": method,
                     "tuned_d_model": int(match["d_model"].iloc[0]) if len(match) else None})
    return pd.DataFrame(rows, columns=OPTIMAL_COLUMNS)
