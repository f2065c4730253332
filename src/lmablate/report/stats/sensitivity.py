"""Each variant's response to the learning rate and to the width, from its tuning trials (the
stacked ``trials.csv``, :attr:`lmablate.report.collect.RunOutputs.trials`; protocol
:mod:`lmablate.tune.tuning`). Losses in nats/char, learning rates per step (the peak), widths
``d_model``. One seed at the first rung's share of the budget: small differences are no finding.
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np
import pandas as pd

from lmablate.report.collect import with_order

COMPLETE, FAIL = "COMPLETE", "FAIL"  # trial states in trials.csv (FAIL: the run diverged)
DESIGN_RUNG, DESIGN_BATCH = 0, 0  # where the shared design sits in a study
# what a trials frame needs for the design and the width profile
REQUIRED = ("dataset", "variant", "rung", "batch", "state", "value", "params_lr",
            "params_d_model")
SENSITIVITY_COLUMNS = [
    "dataset", "variant", "n_design", "n_design_diverged", "design_d_model",
    "design_tokens_per_parameter", "design_lr_low", "design_lr_high", "budget_fraction",
    "best_design_lr", "best_design_loss", "uniform_loss", "lr_sensitivity", "note",
]
WIDTH_COLUMNS = ["dataset", "variant", "d_model", "tokens_per_parameter", "budget_fraction",
                 "n_trials", "n_diverged", "best_loss", "best_lr"]
# the reasons a study has no sensitivity (its ``note``)
NO_DESIGN = "no design points (rung 0, batch 0)"
SEVERAL_WIDTHS = "design points at several widths: not a learning-rate sweep"
ALL_DIVERGED = "every design point diverged"
NO_UNIFORM = "no loss at initialisation (vocabulary size unknown)"


def _usable(trials: pd.DataFrame) -> pd.DataFrame:
    """The trials that hold a result (COMPLETE or FAIL) in study order, numbers as numbers, and
    ``diverged`` (FAIL, or a value not finite); empty without the :data:`REQUIRED` columns."""
    if trials is None or trials.empty or any(c not in trials for c in REQUIRED):
        return pd.DataFrame(columns=[*REQUIRED, "diverged"])
    t = with_order(trials[trials["state"].isin([COMPLETE, FAIL])])
    t = t.assign(**{c: pd.to_numeric(t[c], errors="coerce") for c in (
        "rung", "batch", "value", "params_lr", "params_d_model", "tokens_per_parameter",
        "budget_fraction") if c in t})  # the last two optional
    t["diverged"] = (t["state"] == FAIL).to_numpy() | ~np.isfinite(t["value"].to_numpy(float))
    return t


def first_rung(trials: pd.DataFrame) -> pd.DataFrame:
    """The first-rung trials (``rung`` 0, any batch) that hold a result, with ``diverged``
    (see :func:`design_points`); rows in file order, study order on the categories."""
    t = _usable(trials)
    return t[t["rung"] == DESIGN_RUNG]


def last_rung(trials: pd.DataFrame) -> pd.DataFrame:
    """The trials of each dataset's highest rung above the first (the full budget when
    ``tune.rungs`` ends at 1.0) that hold a result, with ``diverged``; empty if none."""
    t = _usable(trials)
    t = t[t["rung"] > DESIGN_RUNG]
    return t[t["rung"] == t.groupby("dataset", observed=True)["rung"].transform("max")] \
        if len(t) else t


def design_points(trials: pd.DataFrame) -> pd.DataFrame:
    """The shared design of every study: its rows of ``rung`` 0, ``batch`` 0 with state
    COMPLETE or FAIL, plus a boolean ``diverged`` (FAIL, or a value not finite). Rows in file
    order; empty when ``trials`` lacks a column of :data:`REQUIRED`."""
    t = first_rung(trials)
    return t[t["batch"] == DESIGN_BATCH]


def _one(frame: pd.DataFrame, column: str) -> float:
    """The one value of ``frame[column]`` (NaN if absent, none or several)."""
    distinct = frame[column].dropna().unique() if column in frame else ()
    return float(distinct[0]) if len(distinct) == 1 else math.nan


def _best(trials: pd.DataFrame) -> tuple[float, float]:
    """(lr, loss) of the lowest-loss trial that did not diverge (NaN, NaN if none)."""
    done = trials[~trials["diverged"]]
    if done.empty:
        return math.nan, math.nan
    best = done.loc[done["value"].idxmin()]
    return float(best["params_lr"]), float(best["value"])


def lr_sensitivity(trials: pd.DataFrame, uniform_loss: Mapping[str, float]) -> pd.DataFrame:
    """The learning-rate sensitivity of each dataset x variant over its shared design.

    ``S = mean_i [min(L_i, L0) - L*]`` (M. Wortsman et al., "Small-scale proxies for large-scale
    Transformer training instabilities", arXiv:2309.14322, sec. 2.2) over the design points
    ``i`` (:func:`design_points`: one width, learning rates evenly spaced in log): ``L_i`` the
    final validation loss (a diverged point counts as ``L0``), ``L0`` the loss at
    initialisation, ``uniform_loss[dataset]`` = ``ln(vocab_size)``
    (:func:`lmablate.report.stats.reference_models.uniform_cross_entropy`), ``L*`` the lowest
    design loss (unclipped, as in the paper). All losses in nats/char.

    Returns:
        One row per dataset x variant of ``trials`` (study order), columns
        :data:`SENSITIVITY_COLUMNS`. A study without design points keeps its row with
        ``n_design`` 0; ``note`` says why ``S`` is NaN (:data:`NO_DESIGN`,
        :data:`SEVERAL_WIDTHS`, :data:`ALL_DIVERGED`, :data:`NO_UNIFORM` for a dataset missing
        from ``uniform_loss``), empty when ``S`` is a number.
    """
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
    """The isoFLOP profile of each dataset x variant (Hoffmann et al. 2022, sec. 3.2): every
    first-rung trial (all batches) trains the same share of the budget, so per width: the
    lowest final validation loss of its completed trials and its learning rate, its trials and
    how many diverged, its tokens per parameter.

    Returns:
        Columns :data:`WIDTH_COLUMNS`, one row per dataset x variant x ``d_model`` (study
        order, widths ascending); ``best_loss``/``best_lr`` NaN where every trial diverged.
        Empty when ``trials`` lacks a column of :data:`REQUIRED`.
    """
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
    """Whether every variant of ``dataset`` was tried at the same design points (width and
    learning rates, to 1e-9 relative), so that their curves are paired; False without any."""
    d = design_points(trials)
    d = d[d["dataset"] == dataset]
    points = [np.sort(g[["params_lr", "params_d_model"]].to_numpy(dtype=float), axis=0)
              for _, g in d.groupby("variant", observed=True)]
    return bool(points) and all(p.shape == points[0].shape and np.allclose(
        p, points[0], rtol=1e-9, atol=0) for p in points)


def _study_order(out: pd.DataFrame, like: pd.DataFrame) -> pd.DataFrame:
    """``out`` with the ``dataset``/``variant`` categories of ``like`` (the study order)."""
    if out.empty or like.empty:
        return out
    return with_order(out, list(like["dataset"].cat.categories),
                      list(like["variant"].cat.categories))


__all__ = ["SENSITIVITY_COLUMNS", "WIDTH_COLUMNS", "design_points", "design_is_shared",
           "first_rung", "last_rung", "lr_sensitivity", "width_summary"]
