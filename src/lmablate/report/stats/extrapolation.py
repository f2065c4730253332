"""Length extrapolation (Press et al. 2022, "Train Short, Test Long"; Kazemnejad et al. 2023):
each variant's test loss on windows longer than its training context
(:func:`lmablate.evaluate.metrics.extrapolation`), compared seed by seed with
:func:`reference_variant` (:func:`lmablate.report.stats.statistics.compare`).
"""

from __future__ import annotations

from typing import Callable, Sequence

import pandas as pd

from lmablate.report.collect import BASELINE, present
from lmablate.report.run_files import maybe_int
from lmablate.report.stats.statistics import compare, summarise

REFERENCE = "rope"  # the compared-with variant when the study has it
TABLE_COLUMNS = ["dataset", "variant", "factor", "length", "n", "mean", "ci95_low", "ci95_high",
                 "note"]
CURVE_COLUMNS = ["variant", "factor", "position", "loss", "seeds"]


def metric_name(factor: int) -> str:
    """``test_loss_x<factor>``, the test loss at ``factor`` x context_length (as in MLflow)."""
    return f"test_loss_x{factor}"


def reference_variant(variants: Sequence[str]) -> str:
    """:data:`REFERENCE` if it is among ``variants``, else the baseline (whose learned table
    cannot run past its context: factor 1 only)."""
    return REFERENCE if REFERENCE in variants else BASELINE


def by_seed(frame: pd.DataFrame, column: str = "factor", values: str = "test_loss",
            name: Callable[[int], str] = metric_name) -> tuple[pd.DataFrame, dict[int, str]]:
    """Seeds as rows (``dataset``, ``variant``, ``seed``), a column ``name(level)`` of
    ``values`` per (whole-number) level of ``column``; and level -> that name."""
    levels = sorted(int(f) for f in frame[column].dropna().unique())
    wide = frame.pivot_table(index=["dataset", "variant", "seed"], columns=column, values=values,
                             aggfunc="first", observed=True, dropna=False)
    names = {f: name(f) for f in levels}
    wide = wide.reindex(columns=levels).reset_index()
    wide.columns = ["dataset", "variant", "seed", *names.values()]
    return wide, names


def extrapolation_table(extrapolation: pd.DataFrame) -> pd.DataFrame:
    """:data:`TABLE_COLUMNS`: test loss (nats/char) per dataset x variant x factor, mean and
    interval over seeds (:func:`~lmablate.report.stats.statistics.summarise`), ``length`` in
    tokens, NaNs with the reason in ``note`` where the scheme cannot run that long."""
    if extrapolation.empty:
        return pd.DataFrame(columns=TABLE_COLUMNS)
    wide, metrics = by_seed(extrapolation)
    summary = summarise(wide, list(metrics.values()))
    rows = []
    for (ds, var, factor), g in extrapolation.groupby(["dataset", "variant", "factor"],
                                                      observed=True, sort=True):
        s = summary[(summary["dataset"] == ds) & (summary["variant"] == var)
                    & (summary["metric"] == metric_name(int(factor)))]
        row = {"dataset": ds, "variant": var, "factor": int(factor),
               "length": g["length"].dropna().iloc[0] if g["length"].notna().any() else None,
               "note": "; ".join(sorted(set(g["note"].dropna()) - {""}))}
        if len(s):
            row.update({k: s.iloc[0][k] for k in ("n", "mean", "ci95_low", "ci95_high")})
        rows.append(row)
    table = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    for col in ("length", "n"):  # whole numbers, NaN where the scheme cannot run that long
        table[col] = maybe_int(table[col])
    return table


def extrapolation_comparisons(extrapolation: pd.DataFrame) -> pd.DataFrame:
    """:func:`~lmablate.report.stats.statistics.compare` against :func:`reference_variant` per
    factor (``test_loss_x<f>``, one Holm family each) where both have values, ``reference`` and
    ``reference_mean`` for ``baseline`` and ``baseline_mean``."""
    if extrapolation.empty:
        return pd.DataFrame()
    wide, metrics = by_seed(extrapolation)
    frames = []
    for ds in present(wide["dataset"]):
        d = wide[wide["dataset"] == ds]
        reference = reference_variant(present(d["variant"]))
        for metric in metrics.values():  # each length as the test loss it is, one Holm family each
            c = compare(d[["dataset", "variant", "seed", metric]].rename(
                columns={metric: "test_loss"}), baseline=reference, metrics=["test_loss"])
            c = c[c["n_pairs"] > 0]  # no values at this length: a table that cannot run it
            c = c.drop(columns="baseline").rename(columns={"baseline_mean": "reference_mean"})
            frames.append(c.assign(metric=metric, reference=reference))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def position_curves(position_loss: pd.DataFrame, dataset: str) -> pd.DataFrame:
    """Each variant of ``dataset``'s mean loss (nats/char) over seeds per position bucket
    (``position``: its first, 0-based) at its longest factor. Columns :data:`CURVE_COLUMNS`."""
    p = position_loss[position_loss["dataset"] == dataset]
    if p.empty:
        return pd.DataFrame(columns=CURVE_COLUMNS)
    p = p[p["factor"] == p.groupby("variant", observed=True)["factor"].transform("max")]
    return (p.groupby(["variant", "factor", "position"], observed=True, sort=True)["loss"]
            .agg(loss="mean", seeds="count").reset_index())
