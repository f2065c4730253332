"""Length extrapolation: how each position scheme's test loss behaves on sequences longer than
the context it was trained on (Press et al. 2022, "Train Short, Test Long"; Kazemnejad et al.
2023), from the ``extrapolation`` results of the evaluate stage
(:func:`lmablate.evaluate.metrics.extrapolation`).

Every variant is compared with a reference variant, seed by seed, at each factor, with the
study's statistics (:func:`lmablate.report.stats.statistics.compare`: paired t-test, Holm over the
variants of a dataset x factor). The reference is ``rope`` when the study has it, since the
baseline's learned table cannot run past its context; else the baseline (factor 1 only).
"""

from __future__ import annotations

from typing import Sequence

import pandas as pd

from lmablate.report.collect import BASELINE, present
from lmablate.report.run_files import maybe_int
from lmablate.report.stats.statistics import compare, summarise

REFERENCE = "rope"  # the compared-with variant when the study has it
TABLE_COLUMNS = ["dataset", "variant", "factor", "length", "n", "mean", "ci95_low", "ci95_high",
                 "note"]
CURVE_COLUMNS = ["variant", "factor", "position", "loss", "seeds"]


def metric_name(factor: int) -> str:
    """The metric of test loss at ``factor`` x context_length: ``test_loss_x<factor>`` (as in
    MLflow)."""
    return f"test_loss_x{factor}"


def reference_variant(variants: Sequence[str]) -> str:
    """:data:`REFERENCE` if it is among ``variants``, else the baseline."""
    return REFERENCE if REFERENCE in variants else BASELINE


def _wide(extrapolation: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Seeds as rows (dataset, variant, seed) and one ``test_loss_x<f>`` column per factor."""
    factors = sorted(int(f) for f in extrapolation["factor"].dropna().unique())
    wide = extrapolation.pivot_table(index=["dataset", "variant", "seed"], columns="factor",
                                     values="test_loss", aggfunc="first", observed=True,
                                     dropna=False).reset_index()
    wide.columns = ["dataset", "variant", "seed", *(metric_name(f) for f in wide.columns[3:])]
    return wide, [metric_name(f) for f in factors]


def extrapolation_table(extrapolation: pd.DataFrame) -> pd.DataFrame:
    """The test loss at each factor per dataset x variant: mean and 95% Student-t interval over
    seeds (:func:`~lmablate.report.stats.statistics.summarise`), the window ``length`` in tokens,
    and where the scheme cannot run that long, NaNs with the reason in ``note``
    ("n/a (learned table of 64 positions)"). Columns :data:`TABLE_COLUMNS`, in study order."""
    if extrapolation.empty:
        return pd.DataFrame(columns=TABLE_COLUMNS)
    wide, metrics = _wide(extrapolation)
    summary = summarise(wide, metrics)
    rows = []
    for (ds, var, factor), g in extrapolation.groupby(["dataset", "variant", "factor"],
                                                      observed=True, sort=True):
        s = summary[(summary["dataset"] == ds) & (summary["variant"] == var)
                    & (summary["metric"] == metric_name(int(factor)))]
        notes = sorted(set(g["note"].dropna()) - {""})
        row = {"dataset": ds, "variant": var, "factor": int(factor),
               "length": g["length"].dropna().iloc[0] if g["length"].notna().any() else None,
               "note": "; ".join(notes)}
        if len(s):
            row.update({k: s.iloc[0][k] for k in ("n", "mean", "ci95_low", "ci95_high")})
        rows.append(row)
    table = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    for col in ("length", "n"):  # whole numbers, NaN where the scheme cannot run that long
        table[col] = maybe_int(table[col])
    return table


def extrapolation_comparisons(extrapolation: pd.DataFrame) -> pd.DataFrame:
    """Every variant against the reference (:func:`reference_variant`) at each factor, paired
    by seed, Holm within each dataset x factor: the columns of
    :func:`~lmablate.report.stats.statistics.compare` (``metric`` = ``test_loss_x<f>``), with
    ``reference`` (the variant compared with) and ``reference_mean`` in place of ``baseline``
    and ``baseline_mean``. Variants without values at a factor (a learned table past its
    context) are not compared there."""
    if extrapolation.empty:
        return pd.DataFrame()
    wide, metrics = _wide(extrapolation)
    frames = []
    for ds in present(wide["dataset"]):
        d = wide[wide["dataset"] == ds]
        reference = reference_variant(present(d["variant"]))
        for metric in metrics:  # each length as the test loss it is, one Holm family each
            c = compare(d[["dataset", "variant", "seed", metric]].rename(
                columns={metric: "test_loss"}), baseline=reference, metrics=["test_loss"])
            c = c[c["n_pairs"] > 0]  # no values at this length: a table that cannot run it
            c = c.drop(columns="baseline").rename(columns={"baseline_mean": "reference_mean"})
            frames.append(c.assign(metric=metric, reference=reference))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def position_curves(position_loss: pd.DataFrame, dataset: str) -> pd.DataFrame:
    """The loss by position of each variant of ``dataset``, at the longest factor it was run
    at: the mean over seeds per position bucket (``position``: the bucket's first position,
    0-based; ``loss`` in nats/char). Columns :data:`CURVE_COLUMNS`, variants in study order."""
    p = position_loss[position_loss["dataset"] == dataset]
    if p.empty:
        return pd.DataFrame(columns=CURVE_COLUMNS)
    longest = p.groupby("variant", observed=True)["factor"].transform("max")
    p = p[p["factor"] == longest]
    return (p.groupby(["variant", "factor", "position"], observed=True, sort=True)["loss"]
            .agg(loss="mean", seeds="count").reset_index())

