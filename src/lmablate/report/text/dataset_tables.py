"""Each dataset's tables in ``report.md`` as rows (column -> cell text, formatted by
:mod:`lmablate.report.text.mdtable`), variants in the frames' categorical study order. Losses in
nats/char, accuracies as fractions, times in seconds, throughput in tokens/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np
import pandas as pd

from lmablate.report.stats.statistics import METRICS
from lmablate.report.text.mdtable import digits, integer, interval, num, p_value, verdict_cell

Rows = list[dict[str, Any]]


def _head(metric: str) -> str:
    """``test loss (nats/char)``: a metric's column heading, with its unit if it has one."""
    label, unit, _ = METRICS[metric]
    return f"{label} ({unit})" if unit else label


def metric_label(metric: str) -> str:
    """``test loss (lower is better)``: the metric's label and direction."""
    label, _, higher = METRICS[metric]
    return f"{label} ({'higher' if higher else 'lower'} is better)"


def _of(frame: pd.DataFrame, dataset: str) -> Iterator[tuple[pd.Series, int]]:
    """Each row of ``dataset`` in ``frame``, with the digits of its ``metric`` (if any)."""
    for _, r in frame[frame["dataset"] == dataset].iterrows():
        yield r, digits(r["metric"]) if "metric" in r else 3


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


def comparison_rows(comparisons: pd.DataFrame, dataset: str) -> Rows:
    """Every variant against the baseline, a row per metric x variant: Δ with its raw and
    Holm-adjusted intervals, Holm's p-value, MDE and the verdict."""
    return [{"metric": metric_label(r["metric"]), "variant": r["variant"],
             "paired seeds": int(r["n_pairs"]), "Δ (variant − baseline)": num(r["mean_diff"], d),
             "95% CI of Δ (raw)": interval(r, d),
             "CI of Δ (Holm-adjusted)": interval(r, d, "ci_holm"),
             "p (Holm)": p_value(r["p_holm"]), "MDE (80% power)": num(r["mde"], d),
             "verdict": verdict_cell(r["verdict"])} for r, d in _of(comparisons, dataset)]


@dataclass(frozen=True)
class ProblemDiagnostic:
    """The per-problem comparison of a dataset: ``n_problems`` test problems decoded on
    ``n_seeds`` seeds, and its rows (counts, rates as fractions, intervals, p-values)."""

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
    rows = [{"metric": metric_label(r["metric"]), "variant": r["variant"],
             "baseline → variant": f"{integer(r['baseline_count'])} → "
                                   f"{integer(r['variant_count'])} of {integer(r['total'])}",
             "Δ rate [Holm-adjusted CI]": f"{num(r['mean_diff'], 3)} {interval(r, 3, 'ci_holm')}",
             "problems that differ": f"{integer(r['n_differing'])} of {integer(r['n_problems'])}",
             "p (Holm)": p_value(r["p_holm"])} for _, r in shown.iterrows()]
    return ProblemDiagnostic(int(p.iloc[0]["n_problems"]), int(p.iloc[0]["n_seeds"]), rows)


def _lr_width(lr: float, width: float) -> str:
    return f"{lr:.3g}, {integer(width)}" if pd.notna(lr) else "–"


def replicate_rows(replicates: pd.DataFrame, dataset: str) -> Rows:
    """Each replicate's comparison in the headline loss
    (:func:`~lmablate.report.stats.replication.replicate_verdicts`)."""
    return [{"variant": r["variant"], "replicate": int(r["replicate"]),
             "lr, d_model": _lr_width(r["lr"], r["d_model"]),
             "baseline lr, d_model": _lr_width(r["baseline_lr"], r["baseline_d_model"]),
             "seeds": int(r["n_pairs"]), "Δ vs baseline": num(r["mean_diff"], d),
             "CI of Δ (Holm-adjusted)": interval(r, d, "ci_holm"), "verdict": r["verdict"]}
            for r, d in _of(replicates, dataset)]


def _agree(x: Any) -> str:
    return "yes" if x else "**no**"


def combined_rows(combined: pd.DataFrame, dataset: str) -> Rows:
    """The replicates together (:func:`~lmablate.report.stats.replication.combine_replicates`):
    their verdicts, whether they agree, and the combined Δ counting the tuning draw."""
    return [{"variant": r["variant"], "verdicts by replicate": r["verdicts"],
             "agree": _agree(r["agree"]), "combined Δ": num(r["mean_diff"], d),
             "SD between replicates": num(r["sd_between"], d),
             "of it, the tuning draw": num(r["sd_tuning_draw"], d), "df": integer(r["df"]),
             "CI (Holm-adjusted)": interval(r, d, "ci_holm"), "p (Holm)": p_value(r["p_holm"]),
             "combined verdict": r["verdict"]} for r, d in _of(combined, dataset)]


def speed_replication_rows(speed: pd.DataFrame, dataset: str) -> Rows:
    """The learning speed over the replicates
    (:func:`~lmablate.report.stats.replication.combine_speed`): ratios of tokens to learn."""
    return [{"variant": r["variant"], "ratio by replicate": r["ratios"],
             "verdicts by replicate": r["verdicts"], "agree": _agree(r["agree"]),
             "combined ratio": num(r["ratio"], 2), "df": integer(r["df"]),
             "CI (Holm-adjusted)": interval(r, 2, "ratio_holm"), "p (Holm)": p_value(r["p_holm"]),
             "combined verdict": r["verdict"]} for r, _ in _of(speed, dataset)]


def spread_rows(spread: pd.DataFrame, dataset: str) -> Rows:
    """How far tuning and the final losses moved between replicates
    (:func:`~lmablate.report.stats.replication.tuning_spread`), beside replicate 0's tuning
    uncertainty."""
    return [{"variant": r["variant"], "tuned lr": r["tuned_lr"],
             "tuned d_model": r["tuned_d_model"], "tuned loss": r["tuned_loss"],
             "final mean": r["final_mean"], "SD between replicates": num(r["final_sd_between"], 4),
             "of it, seeds (SE)": num(r["seed_se"], 4),
             "tuning draw (SD)": num(r["sd_tuning_draw"], 4),
             "reported tuning uncertainty": num(r["tuning_uncertainty"], 4),
             "covers 1.96 x the draw": "–" if pd.isna(r["covered"]) else _agree(r["covered"])}
            for r, _ in _of(spread, dataset)]


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
