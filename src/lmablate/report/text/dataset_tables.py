"""Each dataset's tables in ``report.md`` as rows of cells: summary, comparison with the baseline,
problem-by-problem diagnostic, re-tunings and tuned values.

Every row is a ``dict`` of column -> cell text, formatted by :mod:`lmablate.report.text.mdtable`;
the template lays them out with its ``md_table`` filter. Tables list variants in the study order
carried by the frames' categorical ``variant`` column (baseline first). Losses in nats/char,
accuracies as fractions, times in seconds, throughput in tokens/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

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


def summary_rows(summary: pd.DataFrame, dataset: str, order: Sequence[str],
                 references: pd.DataFrame | None = None, shown: Sequence[str] = ()) -> Rows:
    """Mean ± CI half-width per variant and metric (but those ``shown`` in another table of the
    section), then one italic row per reference point of ``dataset`` (``references``: the
    report stage's reference table) with a value in these columns; no rows without results."""
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
            if m not in v.index:
                row[_head(m)] = "–"
                continue
            r = v.loc[m]
            d = digits(m)
            if np.isfinite(r["ci95_low"]):
                half = (r["ci95_high"] - r["ci95_low"]) / 2
                row[_head(m)] = f"{num(r['mean'], d)} ± {num(half, d)}"
            else:
                row[_head(m)] = f"{num(r['mean'], d)} (no CI, n={int(r['n'])})"
        rows.append(row)
    if rows and references is not None:
        r = references[references["dataset"] == dataset]
        for name in pd.unique(r["reference"]):
            row = {"variant": f"_reference: {name}_", "seeds": "–"}
            for head in list(rows[0])[2:]:
                row[head] = "–"
            for x in r[r["reference"] == name].itertuples():
                values = {x.metric: x.value}
                if x.metric == "test_loss":  # the same cross-entropy in the derived units
                    values.update(bits_per_char=x.value / math.log(2),
                                  perplexity=math.exp(x.value))
                for m, value in values.items():
                    if _head(m) in row:
                        row[_head(m)] = num(value, digits(m))
            if any(row[head] != "–" for head in list(rows[0])[2:]):
                rows.append(row)
    return rows


def comparison_rows(comparisons: pd.DataFrame, dataset: str) -> Rows:
    """Every variant against the baseline on ``dataset``, one row per metric x variant: Δ with
    its raw and Holm-adjusted intervals, Holm's p-value, MDE and the verdict (the means are the
    summary's, the raw p-value ``comparisons.csv``'s)."""
    rows = []
    for _, r in comparisons[comparisons["dataset"] == dataset].iterrows():
        d = digits(r["metric"])
        rows.append({
            "metric": metric_label(r["metric"]),
            "variant": r["variant"],
            "paired seeds": int(r["n_pairs"]),
            "Δ (variant − baseline)": num(r["mean_diff"], d),
            "95% CI of Δ (raw)": interval(r, d),
            "CI of Δ (Holm-adjusted)": interval(r, d, "ci_holm"),
            "p (Holm)": p_value(r["p_holm"]),
            "MDE (80% power)": num(r["mde"], d),
            "verdict": verdict_cell(r["verdict"]),
        })
    return rows


@dataclass(frozen=True)
class ProblemDiagnostic:
    """The per-problem comparison of a dataset: ``n_problems`` test problems decoded on
    ``n_seeds`` seeds, and its rows (counts, rates as fractions, intervals, p-values; no
    verdict, mark or bold)."""

    n_problems: int
    n_seeds: int
    rows: Rows


def problem_diagnostic(problems: pd.DataFrame, dataset: str) -> ProblemDiagnostic | None:
    """The per-problem comparison of ``dataset``
    (:func:`~lmablate.report.stats.problems.compare_problems`), or None where there is none."""
    p = problems[problems["dataset"] == dataset] if len(problems) else problems
    if p.empty:
        return None
    rows = []
    # exact match alone: character accuracy tells the same story (problem_comparisons.csv)
    shown = p[p["metric"] == "exact_match"] if (p["metric"] == "exact_match").any() else p
    for _, r in shown.iterrows():
        rows.append({
            "metric": metric_label(r["metric"]),
            "variant": r["variant"],
            "baseline → variant": (f"{integer(r['baseline_count'])} → "
                                   f"{integer(r['variant_count'])} of {integer(r['total'])}"),
            "Δ rate [Holm-adjusted CI]": f"{num(r['mean_diff'], 3)} {interval(r, 3, 'ci_holm')}",
            "problems that differ": f"{integer(r['n_differing'])} of {integer(r['n_problems'])}",
            "p (Holm)": p_value(r["p_holm"]),
        })
    first = p.iloc[0]
    return ProblemDiagnostic(int(first["n_problems"]), int(first["n_seeds"]), rows)


def replicate_rows(replicates: pd.DataFrame, dataset: str) -> Rows:
    """Each replicate's comparison of ``dataset`` in its headline loss
    (:func:`~lmablate.report.stats.replication.replicate_verdicts`): tuned values, Δ with its
    Holm-adjusted interval, the verdict."""
    rows = []
    for _, r in replicates[replicates["dataset"] == dataset].iterrows():
        d = digits(r["metric"])
        rows.append({
            "variant": r["variant"], "replicate": int(r["replicate"]),
            "lr, d_model": (f"{r['lr']:.3g}, {integer(r['d_model'])}"
                            if pd.notna(r["lr"]) else "–"),
            "baseline lr, d_model": (f"{r['baseline_lr']:.3g}, {integer(r['baseline_d_model'])}"
                                     if pd.notna(r["baseline_lr"]) else "–"),
            "seeds": int(r["n_pairs"]),
            "Δ vs baseline": num(r["mean_diff"], d),
            "CI of Δ (Holm-adjusted)": interval(r, d, "ci_holm"),
            "verdict": r["verdict"],
        })
    return rows


def combined_rows(combined: pd.DataFrame, dataset: str) -> Rows:
    """The replicates of ``dataset`` together
    (:func:`~lmablate.report.stats.replication.combine_replicates`): their verdicts, whether
    they agree, and the combined Δ whose interval counts the tuning draw."""
    rows = []
    for _, r in combined[combined["dataset"] == dataset].iterrows():
        d = digits(r["metric"])
        rows.append({
            "variant": r["variant"], "verdicts by replicate": r["verdicts"],
            "agree": "yes" if r["agree"] else "**no**",
            "combined Δ": num(r["mean_diff"], d),
            "SD between replicates": num(r["sd_between"], d),
            "of it, the tuning draw": num(r["sd_tuning_draw"], d),
            "df": integer(r["df"]),
            "CI (Holm-adjusted)": interval(r, d, "ci_holm"),
            "p (Holm)": p_value(r["p_holm"]),
            "combined verdict": r["verdict"],
        })
    return rows


def speed_replication_rows(speed: pd.DataFrame, dataset: str) -> Rows:
    """The learning speed of ``dataset`` over the replicates
    (:func:`~lmablate.report.stats.replication.combine_speed`): each replicate's ratio of tokens
    to learn and verdict, whether they agree, and the combined ratio whose interval counts the
    tuning draw."""
    return [{
        "variant": r["variant"], "ratio by replicate": r["ratios"],
        "verdicts by replicate": r["verdicts"], "agree": "yes" if r["agree"] else "**no**",
        "combined ratio": num(r["ratio"], 2), "df": integer(r["df"]),
        "CI (Holm-adjusted)": interval(r, 2, "ratio_holm"), "p (Holm)": p_value(r["p_holm"]),
        "combined verdict": r["verdict"],
    } for _, r in speed[speed["dataset"] == dataset].iterrows()]


def spread_rows(spread: pd.DataFrame, dataset: str) -> Rows:
    """How far tuning and the final losses moved between replicates of ``dataset``
    (:func:`~lmablate.report.stats.replication.tuning_spread`), beside the tuning uncertainty
    replicate 0 reported."""
    rows = []
    for _, r in spread[spread["dataset"] == dataset].iterrows():
        rows.append({
            "variant": r["variant"], "tuned lr": r["tuned_lr"],
            "tuned d_model": r["tuned_d_model"], "tuned loss": r["tuned_loss"],
            "final mean": r["final_mean"], "SD between replicates": num(r["final_sd_between"], 4),
            "of it, seeds (SE)": num(r["seed_se"], 4),
            "tuning draw (SD)": num(r["sd_tuning_draw"], 4),
            "reported tuning uncertainty": num(r["tuning_uncertainty"], 4),
            "covers 1.96 x the draw": ("–" if pd.isna(r["covered"]) else
                                       "yes" if r["covered"] else "**no**"),
        })
    return rows


def tuned_rows(ablation: pd.DataFrame, dataset: str, order: Sequence[str]) -> Rows:
    """What each variant of ``dataset`` trained with: lr, d_model, steps, parameter counts,
    FLOPs per token, throughput (tokens/s) and train time (s), means over its seeds."""
    d = ablation[ablation["dataset"] == dataset]
    rows = []
    for variant in order:
        v = d[d["variant"] == variant]
        if v.empty:
            continue
        rows.append({
            "variant": variant,
            # tuning picks one value per dataset x variant; several would mean stale runs
            "lr": ", ".join(f"{x:.3g}" for x in v["lr"].dropna().unique()) or "–",
            "d_model": ", ".join(integer(x) for x in v["d_model"].dropna().unique()) or "–",
            "steps": ", ".join(integer(x) for x in v["steps"].dropna().unique()) or "–",
            "parameters": integer(v["n_params"].max()),
            "non-embedding parameters": integer(v["n_params_non_embedding"].max()),
            "FLOPs/token": integer(v["flops_per_token"].max()),
            "throughput (tokens/s, mean)": integer(v["tokens_per_second"].mean()),
            "train time (s, mean)": num(v["train_seconds"].mean(), 1),
        })
    return rows
