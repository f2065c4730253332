"""How each variant responds to the learning rate and to the width, from its tuning trials.

Pure functions over the stacked ``trials.csv`` files (:attr:`lmablate.report.collect.
RunOutputs.trials`: one row per slot of a dataset x variant study, columns of
:data:`lmablate.tune.trials.TRIALS_COLUMNS` after ``dataset`` and ``variant``). The protocol
that produced them is :mod:`lmablate.tune.tuning`:

* **The shared design** (:func:`design_points`): the first batch of the first rung (``rung`` 0,
  ``batch`` 0) is a learning-rate sweep, ``tune.trials_per_batch`` learning rates evenly spaced
  in log over the configured ``[tune.lr_low, tune.lr_high]``, at one width (the one nearest 20
  training tokens per parameter), the same points for every variant of a dataset. The
  variants' learning-rate curves are thus paired point by point.
* **Learning-rate sensitivity** (:func:`lr_sensitivity`), as defined by M. Wortsman et al.,
  "Small-scale proxies for large-scale Transformer training instabilities", arXiv:2309.14322
  (2023; ICLR 2024), sec. 2.2 ("LR vs. loss curves and learning rate sensitivity"; fig. 1
  shows such curves): over the learning rates of a sweep, ``S = mean_i [min(L_i, L0) - L*]``
  (the paper's expectation over a log-spaced grid), with ``L_i`` the final loss at rate ``i``,
  ``L*`` the lowest of them and ``L0`` the loss at initialisation, so that a run that diverged
  or ended worse than it started counts as ``L0`` and no more. Small S: the loss stays near its
  best over the whole range; large S: only a narrow band of learning rates trains well.
* **Width at equal compute** (:func:`width_summary`): every first-rung trial trains the same
  share of the dataset's training FLOPs, whatever its width (its step count follows from the
  width), so the best first-rung loss per width is an isoFLOP profile (Hoffmann et al. 2022,
  "Training compute-optimal large language models", sec. 3.2).

Caveats, stated wherever these numbers are shown: each point is one training seed
(``tune.seed``) at the first rung's share of the budget (``tune.rungs[0][1]``), not the final
runs' budget, so a difference between two variants' sensitivities smaller than the
seed-to-seed spread of a loss is not a finding.

Units: losses and sensitivities in nats/char (natural-log cross-entropy per character token);
learning rates per optimizer step (the schedule's peak); widths (``d_model``) in units;
``tokens_per_parameter`` training tokens of a final run per non-embedding parameter of the
baseline at that width.
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np
import pandas as pd

from lmablate.report.collect import rows_of, with_order

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
    """The rows of ``trials`` that hold a result (state COMPLETE or FAIL), in the study order
    (:func:`~lmablate.report.collect.with_order`), numbers as numbers, and ``diverged``:
    True for a FAIL and for a COMPLETE whose value is not finite. Empty without the
    :data:`REQUIRED` columns (``trials.csv`` of an older protocol, or none at all)."""
    if trials is None or trials.empty or any(c not in trials for c in REQUIRED):
        return pd.DataFrame(columns=[*REQUIRED, "diverged"])
    t = with_order(trials[trials["state"].isin([COMPLETE, FAIL])])
    t = t.assign(**{c: pd.to_numeric(t[c], errors="coerce") for c in (
        "rung", "batch", "value", "params_lr", "params_d_model", "tokens_per_parameter",
        "budget_fraction") if c in t})  # the last two optional
    value = t["value"].to_numpy(dtype=float)
    t["diverged"] = (t["state"] == FAIL).to_numpy() | ~np.isfinite(value)
    return t


def first_rung(trials: pd.DataFrame) -> pd.DataFrame:
    """The first-rung trials (``rung`` 0, any batch) that hold a result, with ``diverged``
    (see :func:`design_points`); rows in file order, study order on the categories."""
    t = _usable(trials)
    return t[t["rung"] == DESIGN_RUNG]


def last_rung(trials: pd.DataFrame) -> pd.DataFrame:
    """The trials of each dataset's highest rung above the first (with ``tune.rungs`` ending
    at 1.0, those trained at the full budget) that hold a result, with ``diverged``; empty if
    no study got past its first rung."""
    t = _usable(trials)
    t = t[t["rung"] > DESIGN_RUNG]
    if t.empty:
        return t
    top = t.groupby("dataset", observed=True)["rung"].transform("max")
    return t[t["rung"] == top]


def design_points(trials: pd.DataFrame) -> pd.DataFrame:
    """The shared design of every study in ``trials``: its rows of ``rung`` 0, ``batch`` 0
    with state COMPLETE or FAIL, plus a boolean ``diverged`` (state FAIL, or a value that is
    not finite). Rows in file order; empty when ``trials`` lacks a column of
    :data:`REQUIRED`."""
    t = first_rung(trials)
    return t[t["batch"] == DESIGN_BATCH]


def _one(frame: pd.DataFrame, column: str) -> float:
    """The one value of ``frame[column]`` (NaN if the column is absent, or has none or
    several)."""
    distinct = frame[column].dropna().unique() if column in frame else ()
    return float(distinct[0]) if len(distinct) == 1 else math.nan


def _best(trials: pd.DataFrame) -> tuple[float, float]:
    """The learning rate and the loss of the lowest-loss trial that did not diverge (NaN, NaN
    if every one did)."""
    done = trials[~trials["diverged"]]
    if done.empty:
        return math.nan, math.nan
    best = done.loc[done["value"].idxmin()]
    return float(best["params_lr"]), float(best["value"])


def _sensitivity(design: pd.DataFrame, l0: float, best_loss: float) -> float:
    """``S = mean_i [min(L_i, L0) - L*]`` over the ``design`` points, a diverged one counting
    as ``L0``."""
    losses = np.where(design["diverged"].to_numpy(), l0, design["value"].to_numpy(dtype=float))
    return float(np.mean(np.minimum(losses, l0) - best_loss))


def _design_row(d: pd.DataFrame, l0: float) -> dict:
    """One study's row of :data:`SENSITIVITY_COLUMNS` (less dataset and variant) from its
    design points ``d`` and its loss at initialisation ``l0``."""
    best_lr, best_loss = _best(d)
    note = (NO_DESIGN if d.empty else SEVERAL_WIDTHS if d["params_d_model"].nunique() > 1
            else ALL_DIVERGED if math.isnan(best_loss) else NO_UNIFORM if not math.isfinite(l0)
            else "")
    return {"n_design": len(d), "n_design_diverged": int(d["diverged"].sum()),
            "design_d_model": _one(d, "params_d_model"),
            "design_tokens_per_parameter": _one(d, "tokens_per_parameter"),
            "design_lr_low": d["params_lr"].min(), "design_lr_high": d["params_lr"].max(),
            "budget_fraction": _one(d, "budget_fraction"),
            "best_design_lr": best_lr, "best_design_loss": best_loss, "uniform_loss": l0,
            "lr_sensitivity": math.nan if note else _sensitivity(d, l0, best_loss),
            "note": note}


def lr_sensitivity(trials: pd.DataFrame, uniform_loss: Mapping[str, float]) -> pd.DataFrame:
    """The learning-rate sensitivity of each dataset x variant over its shared design.

    ``S = mean_i [min(L_i, L0) - L*]`` (Wortsman et al. 2023, sec. 2.2; module docstring) over
    the design points ``i`` (:func:`design_points`: rung 0, batch 0; one width; learning rates
    evenly spaced in log over the configured range), where

    * ``L_i`` is the point's final validation loss (``value``), and a diverged point (state
      FAIL, or a non-finite value) counts as ``L0``;
    * ``L0`` is the loss at initialisation, taken as the loss of the uniform prediction,
      ``ln(vocab_size)`` of the dataset
      (:func:`lmablate.report.stats.reference_models.uniform_cross_entropy`):
      ``uniform_loss[dataset]``;
    * ``L*`` is the lowest design loss (unclipped, as in the paper).

    Measured on one seed (``tune.seed``) at the first rung's share of the budget, not at the
    final runs' budget: a small difference between variants is not a finding.

    Args:
        trials: the stacked ``trials.csv`` files (``dataset``, ``variant`` and the columns of
            :data:`REQUIRED`; ``tokens_per_parameter`` and ``budget_fraction`` when present).
        uniform_loss: dataset -> ``L0`` in nats/char. A dataset missing here gets no
            sensitivity (NaN, note :data:`NO_UNIFORM`) but its other columns.

    Returns:
        One row per dataset x variant of ``trials`` (study order), columns
        :data:`SENSITIVITY_COLUMNS`: the number of design points and how many diverged, their
        width and its tokens per parameter, the lowest and highest design learning rate, the
        share of the budget they trained, the design learning rate with the lowest loss and
        that loss ``L*``, ``L0`` and ``S`` (all losses in nats/char). A study without design
        points keeps its row with ``n_design`` 0 and NaN elsewhere, and ``note`` says why
        ``S`` is NaN (:data:`NO_DESIGN`, :data:`SEVERAL_WIDTHS`, :data:`ALL_DIVERGED`,
        :data:`NO_UNIFORM`); ``note`` is empty when ``S`` is a number. A study with no row at
        all in ``trials`` is absent.
    """
    studies = _usable(trials)
    design = design_points(trials)
    rows = []
    for (dataset, variant), _ in studies.groupby(["dataset", "variant"], observed=True,
                                                 sort=True):
        d = rows_of(design, dataset, variant)
        rows.append({"dataset": dataset, "variant": variant,
                     **_design_row(d, float(uniform_loss.get(str(dataset), math.nan)))})
    out = pd.DataFrame(rows, columns=SENSITIVITY_COLUMNS)
    out["design_d_model"] = out["design_d_model"].astype("Int64")  # a width, or <NA>
    return _study_order(out, studies)


def width_summary(trials: pd.DataFrame) -> pd.DataFrame:
    """The isoFLOP profile of each dataset x variant: per width tried on the first rung
    (``rung`` 0, every batch: the shared design and the TPE proposals), the lowest final
    validation loss of its completed trials and the learning rate that reached it, how many
    trials it had and how many of them diverged, and its tokens per parameter. Every
    first-rung trial trains the same share of the budget (``budget_fraction``), so the widths
    are compared at equal training FLOPs.

    Returns:
        Columns :data:`WIDTH_COLUMNS`, one row per dataset x variant x ``d_model`` (study
        order, widths ascending); ``best_loss`` and ``best_lr`` NaN for a width whose trials
        all diverged. Empty when ``trials`` lacks a column of :data:`REQUIRED`.
    """
    t = first_rung(trials)
    rows = []
    for (dataset, variant, d_model), g in t.groupby(
            ["dataset", "variant", "params_d_model"], observed=True, sort=True):
        best_lr, best_loss = _best(g)
        rows.append({
            "dataset": dataset, "variant": variant, "d_model": int(d_model),
            "tokens_per_parameter": _one(g, "tokens_per_parameter"),
            "budget_fraction": _one(g, "budget_fraction"),
            "n_trials": len(g), "n_diverged": int(g["diverged"].sum()),
            "best_loss": best_loss, "best_lr": best_lr})
    out = pd.DataFrame(rows, columns=WIDTH_COLUMNS)
    return _study_order(out, t)


def design_is_shared(trials: pd.DataFrame, dataset: str) -> bool:
    """Whether every variant of ``dataset`` was tried at the same design points (the same
    width and the same learning rates, to 1e-9 relative), so that their curves are paired;
    False without design points."""
    d = design_points(trials)
    d = d[d["dataset"] == dataset]
    if d.empty:
        return False
    points = [np.sort(g[["params_lr", "params_d_model"]].to_numpy(dtype=float), axis=0)
              for _, g in d.groupby("variant", observed=True)]
    return all(p.shape == points[0].shape and np.allclose(p, points[0], rtol=1e-9, atol=0)
               for p in points)


def _study_order(out: pd.DataFrame, like: pd.DataFrame) -> pd.DataFrame:
    """``out`` with the ``dataset``/``variant`` categories of ``like`` (the study order)."""
    if out.empty or like.empty:
        return out
    return with_order(out, list(like["dataset"].cat.categories),
                      list(like["variant"].cat.categories))


__all__ = ["SENSITIVITY_COLUMNS", "WIDTH_COLUMNS", "design_points", "design_is_shared",
           "first_rung", "last_rung", "lr_sensitivity", "width_summary"]
