"""Each variant's response to the learning rate and to the width, from its tuning trials
(:attr:`lmablate.report.collect.RunOutputs.trials`, one seed at the first rung's budget share).
Losses in nats/char, learning rates per step (the schedule's peak), widths ``d_model``."""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np
import pandas as pd

from lmablate.report.collect import with_order

COMPLETE, FAIL = "COMPLETE", "FAIL"  # trial states in trials.csv (FAIL: the run diverged)
DESIGN_RUNG, DESIGN_BATCH = 0, 0  # where the shared design sits in a study
REQUIRED = ("dataset", "variant", "rung", "batch", "state", "value", "params_lr",
            "params_d_model")
SENSITIVITY_COLUMNS = ["dataset", "variant", "n_design", "n_design_diverged", "design_d_model",
                       "design_tokens_per_parameter", "design_lr_low", "design_lr_high",
                       "budget_fraction", "best_design_lr", "best_design_loss", "uniform_loss",
                       "lr_sensitivity", "note"]
WIDTH_COLUMNS = ["dataset", "variant", "d_model", "tokens_per_parameter", "budget_fraction",
                 "n_trials", "n_diverged", "best_loss", "best_lr"]
NO_DESIGN = "no design points (rung 0, batch 0)"
SEVERAL_WIDTHS = "design points at several widths: not a learning-rate sweep"
ALL_DIVERGED = "every design point diverged"
NO_UNIFORM = "no loss at initialisation (vocabulary size unknown)"


def _usable(trials: pd.DataFrame) -> pd.DataFrame:
    """The trials with a result, numbers as numbers, and ``diverged`` (FAIL, or not finite)."""
    if trials is None or trials.empty or any(c not in trials for c in REQUIRED):
        return pd.DataFrame(columns=[*REQUIRED, "diverged"])
    t = with_order(trials[trials["state"].isin([COMPLETE, FAIL])])
    t = t.assign(**{c: pd.to_numeric(t[c], errors="coerce") for c in (
        "rung", "batch", "value", "params_lr", "params_d_model", "tokens_per_parameter",
        "budget_fraction") if c in t})  # the last two optional
    t["diverged"] = (t["state"] == FAIL).to_numpy() | ~np.isfinite(t["value"].to_numpy(float))
    return t


def first_rung(trials: pd.DataFrame) -> pd.DataFrame:
    """The first-rung trials (any batch) with a result and ``diverged`` (:func:`design_points`)."""
    t = _usable(trials)
    return t[t["rung"] == DESIGN_RUNG]


def last_rung(trials: pd.DataFrame) -> pd.DataFrame:
    """The trials with a result of each dataset's highest rung above the first, if any."""
    t = _usable(trials)
    t = t[t["rung"] > DESIGN_RUNG]
    return t[t["rung"] == t.groupby("dataset", observed=True)["rung"].transform("max")] \
        if len(t) else t


def design_points(trials: pd.DataFrame) -> pd.DataFrame:
    """The shared design of every study: its trials of ``rung`` 0, ``batch`` 0 with a result, and
    ``diverged``; empty when ``trials`` lacks a column of :data:`REQUIRED`."""
    t = first_rung(trials)
    return t[t["batch"] == DESIGN_BATCH]


def _one(frame: pd.DataFrame, column: str) -> float:
    """The one value of ``frame[column]``, else NaN."""
    distinct = frame[column].dropna().unique() if column in frame else ()
    return float(distinct[0]) if len(distinct) == 1 else math.nan


def _best(trials: pd.DataFrame) -> tuple[float, float]:
    """(lr, loss) of the best trial that did not diverge."""
    done = trials[~trials["diverged"]]
    if done.empty:
        return math.nan, math.nan
    best = done.loc[done["value"].idxmin()]
    return float(best["params_lr"]), float(best["value"])


def lr_sensitivity(trials: pd.DataFrame, uniform_loss: Mapping[str, float]) -> pd.DataFrame:
    """The learning-rate sensitivity ``S = mean_i [min(L_i, L0) - L*]`` (Wortsman et al.,
    arXiv:2309.14322, sec. 2.2) of each dataset x variant over its :func:`design_points` ``i``:
    ``L_i`` the final validation loss (a diverged point counts as ``L0``), ``L0`` =
    ``uniform_loss[dataset]`` the loss at initialisation (``ln(vocab_size)``), ``L*`` the lowest
    (nats/char). Columns :data:`SENSITIVITY_COLUMNS`, one row per study of ``trials`` in study
    order; ``note`` why ``S`` is NaN (:data:`NO_DESIGN`, :data:`SEVERAL_WIDTHS`,
    :data:`ALL_DIVERGED`, :data:`NO_UNIFORM`), else empty."""
    studies = _usable(trials)
    rows = []
    for (dataset, variant), g in studies.groupby(["dataset", "variant"], observed=True,
                                                 sort=True):
        d = g[(g["rung"] == DESIGN_RUNG) & (g["batch"] == DESIGN_BATCH)]
        l0 = float(uniform_loss.get(str(dataset), math.nan))
        best_lr, best_loss = _best(d)
        note = (NO_DESIGN if d.empty else SEVERAL_WIDTHS if d["params_d_model"].nunique() > 1
                else ALL_DIVERGED if math.isnan(best_loss)
                else NO_UNIFORM if not math.isfinite(l0) else "")
        losses = np.where(d["diverged"].to_numpy(), l0, d["value"].to_numpy(dtype=float))
        rows.append({
            "dataset": dataset, "variant": variant, "n_design": len(d),
            "n_design_diverged": int(d["diverged"].sum()),
            "design_d_model": _one(d, "params_d_model"),
            "design_tokens_per_parameter": _one(d, "tokens_per_parameter"),
            "design_lr_low": d["params_lr"].min(), "design_lr_high": d["params_lr"].max(),
            "budget_fraction": _one(d, "budget_fraction"), "best_design_lr": best_lr,
            "best_design_loss": best_loss, "uniform_loss": l0, "note": note,
            "lr_sensitivity": math.nan if note
            else float(np.mean(np.minimum(losses, l0) - best_loss))})
    out = pd.DataFrame(rows, columns=SENSITIVITY_COLUMNS)
    out["design_d_model"] = out["design_d_model"].astype("Int64")  # a width, or <NA>
    return _study_order(out, studies)


def width_summary(trials: pd.DataFrame) -> pd.DataFrame:
    """The isoFLOP profile (Hoffmann et al. 2022, sec. 3.2; every first-rung trial trains the
    same share of the budget) of each dataset x variant: per width, the lowest loss of its
    trials that did not diverge and its lr (NaN if none), its trials and tokens per parameter.
    Columns :data:`WIDTH_COLUMNS`, by study (study order), then ``d_model``."""
    t = first_rung(trials)
    rows = [{"dataset": dataset, "variant": variant, "d_model": int(d_model),
             "tokens_per_parameter": _one(g, "tokens_per_parameter"),
             "budget_fraction": _one(g, "budget_fraction"), "n_trials": len(g),
             "n_diverged": int(g["diverged"].sum()),
             **dict(zip(("best_lr", "best_loss"), _best(g)))}
            for (dataset, variant, d_model), g in t.groupby(
                ["dataset", "variant", "params_d_model"], observed=True, sort=True)]
    return _study_order(pd.DataFrame(rows, columns=WIDTH_COLUMNS), t)


def design_is_shared(trials: pd.DataFrame, dataset: str) -> bool:
    """Whether every variant of ``dataset`` has the same design points (to 1e-9 relative)."""
    d = design_points(trials)
    d = d[d["dataset"] == dataset]
    points = [np.sort(g[["params_lr", "params_d_model"]].to_numpy(dtype=float), axis=0)
              for _, g in d.groupby("variant", observed=True)]
    return bool(points) and all(p.shape == points[0].shape and np.allclose(
        p, points[0], rtol=1e-9, atol=0) for p in points)


def _study_order(out: pd.DataFrame, like: pd.DataFrame) -> pd.DataFrame:
    if out.empty or like.empty:
        return out
    return with_order(out, *(list(like[c].cat.categories) for c in ("dataset", "variant")))


__all__ = ["SENSITIVITY_COLUMNS", "WIDTH_COLUMNS", "design_points", "design_is_shared",
           "first_rung", "last_rung", "lr_sensitivity", "width_summary"]
