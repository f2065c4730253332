"""Each dataset's tables in ``report.md`` as rows: column -> cell text (formatted by
:mod:`lmablate.report.text.mdtable`), or a frame's records for the template's ``_tables.md.j2``;
variants in the frames' categorical study order. Losses in nats/char, accuracies as fractions,
times in seconds, throughput in tokens/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pandas as pd

from lmablate.report.stats.statistics import METRICS
from lmablate.report.text.mdtable import digits, integer, num

Rows = list[dict[str, Any]]


def _head(metric: str) -> str:
    """``test loss (nats/char)``: a metric's column heading, with its unit if it has one."""
    label, unit, _ = METRICS[metric]
    return f"{label} ({unit})" if unit else label


def summary_rows(summary: pd.DataFrame, dataset: str, order: Sequence[str],
                 references: pd.DataFrame | None = None, shown: Sequence[str] = ()) -> Rows:
    """Mean ± CI half-width per variant and metric (but those ``shown`` in another table), then
    an italic row per reference point of ``dataset`` (the report's reference table) with a
    value in these columns; no rows without results."""
    s = summary[summary["dataset"] == dataset]
    metrics = [m for m in METRICS if m in set(s["metric"])
               and m not in ("train_seconds", "tokens_per_second", *shown)]
    rows = []
    for variant in order:
        v = s[s["variant"] == variant].set_index("metric")
        if v.empty:
            continue
        row = {"variant": variant, "seeds": int(v["n"].max())}
        for m in metrics:
            r, d = (v.loc[m] if m in v.index else None), digits(m)
            row[_head(m)] = "–" if r is None else (
                f"{num(r['mean'], d)} ± {num((r['ci95_high'] - r['ci95_low']) / 2, d)}"
                if np.isfinite(r["ci95_low"]) else f"{num(r['mean'], d)} (no CI, n={int(r['n'])})")
        rows.append(row)
    if not rows or references is None:
        return rows
    heads = list(rows[0])[2:]
    r = references[references["dataset"] == dataset]
    for name in pd.unique(r["reference"]):
        row = {"variant": f"_reference: {name}_", "seeds": "–", **dict.fromkeys(heads, "–")}
        for x in r[r["reference"] == name].itertuples():
            values = {x.metric: x.value}
            if x.metric == "test_loss":  # the same cross-entropy in the derived units
                values.update(bits_per_char=x.value / math.log(2), perplexity=math.exp(x.value))
            row.update({_head(m): num(value, digits(m)) for m, value in values.items()
                        if _head(m) in row})
        if any(row[head] != "–" for head in heads):
            rows.append(row)
    return rows


def records(frame: pd.DataFrame, dataset: str) -> Rows:
    """``frame``'s rows of ``dataset`` as dicts, as they are: the template's ``_tables.md.j2``
    formats them (``comparisons.csv``, ``replicates.csv``, ``replication.csv``,
    ``learning_speed_replication.csv``, ``tuning_spread.csv``)."""
    return frame[frame["dataset"] == dataset].to_dict("records")


@dataclass(frozen=True)
class ProblemDiagnostic:
    """The per-problem comparison of a dataset: ``n_problems`` test problems decoded on
    ``n_seeds`` seeds, and its rows of ``problem_comparisons.csv`` (counts, rates as
    fractions), formatted by ``_tables.md.j2``."""

    n_problems: int
    n_seeds: int
    rows: Rows


def problem_diagnostic(problems: pd.DataFrame, dataset: str) -> ProblemDiagnostic | None:
    """The per-problem comparison of ``dataset``
    (:func:`~lmablate.report.stats.problems.compare_problems`), or None where there is none."""
    p = problems[problems["dataset"] == dataset] if len(problems) else problems
    if p.empty:
        return None
    # exact match alone: character accuracy tells the same story (problem_comparisons.csv)
    shown = p[p["metric"] == "exact_match"] if (p["metric"] == "exact_match").any() else p
    return ProblemDiagnostic(int(p.iloc[0]["n_problems"]), int(p.iloc[0]["n_seeds"]),
                             shown.to_dict("records"))


def _values(v: pd.Series, fmt: Any) -> str:
    # tuning picks one value per dataset x variant; several would mean stale runs
    return ", ".join(fmt(x) for x in v.dropna().unique()) or "–"


def tuned_rows(ablation: pd.DataFrame, dataset: str, order: Sequence[str]) -> Rows:
    """What each variant trained with: lr, d_model, steps, parameter counts, FLOPs per token,
    throughput (tokens/s) and train time (s), means over its seeds."""
    d = ablation[ablation["dataset"] == dataset]
    return [{"variant": variant, "lr": _values(v["lr"], lambda x: f"{x:.3g}"),
             "d_model": _values(v["d_model"], integer), "steps": _values(v["steps"], integer),
             "parameters": integer(v["n_params"].max()),
             "non-embedding parameters": integer(v["n_params_non_embedding"].max()),
             "FLOPs/token": integer(v["flops_per_token"].max()),
             "throughput (tokens/s, mean)": integer(v["tokens_per_second"].mean()),
             "train time (s, mean)": num(v["train_seconds"].mean(), 1)}
            for variant in order if len(v := d[d["variant"] == variant])]
