"""The text of ``report.md``: methodology, per-dataset tables, verdicts, figures and samples.

Every number is taken from the tables of :mod:`lmablate.report.stats.statistics`, the runs of
:mod:`lmablate.report.collect` and the config; none is typed by hand. Tables list variants in
the study order carried by the frames' categorical ``variant`` column (baseline first).

Units in the text: losses in nats/char (bits/char = loss / ln 2), accuracies as fractions,
times in seconds, throughput in tokens/s.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from lmablate.report.collect import RunOutputs, present
from lmablate.report.text.limits import limits_section
from lmablate.report.text.methods import methods_section
from lmablate.report.text.mdtable import (code_span as _code_span,
                                       delta_cell as _delta_cell, digits as _digits,
                                       fence as _fence, integer as _int,
                                       interval as _interval, md_table as _md_table,
                                       num as _num, p_value as _p,
                                       verdict_cell as _verdict)
from lmablate.report.figures.bracket_figure import bracket_lines
from lmablate.report.text.lr_section import lr_section
from lmablate.report.stats.success import seed_status
from lmablate.report.stats.statistics import (ALPHA, CONFIDENCE, METRICS, MIN_SEEDS_FOR_TEST,
                                          VERDICT_BETTER, VERDICT_FEW, VERDICT_WORSE)
from lmablate.config.study import StudyConfig


def _summary_table(summary: pd.DataFrame, dataset: str, order: Sequence[str],
                   references: pd.DataFrame | None = None) -> str:
    """Mean ± CI half-width per variant and metric, then one italic row per reference point of
    ``dataset`` (``references``: the report stage's reference table) in the same columns."""
    s = summary[summary["dataset"] == dataset]
    metrics = [m for m in METRICS if m in set(s["metric"])
               and m not in ("train_seconds", "tokens_per_second")]
    rows = []
    for variant in order:
        v = s[s["variant"] == variant].set_index("metric")
        if v.empty:
            continue
        row = {"variant": variant, "seeds": int(v["n"].max())}
        for m in metrics:
            label, unit, _ = METRICS[m]
            head = f"{label} ({unit})" if unit else label
            if m not in v.index:
                row[head] = "–"
                continue
            r = v.loc[m]
            digits = _digits(m)
            if np.isfinite(r["ci95_low"]):
                half = (r["ci95_high"] - r["ci95_low"]) / 2
                row[head] = f"{_num(r['mean'], digits)} ± {_num(half, digits)}"
            else:
                row[head] = f"{_num(r['mean'], digits)} (no CI, n={int(r['n'])})"
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
                    label, unit, _ = METRICS[m]
                    head = f"{label} ({unit})" if unit else label
                    if head in row:
                        row[head] = _num(value, _digits(m))
            rows.append(row)
    return _md_table(pd.DataFrame(rows)) if rows else "_No results._"


def _metric_label(metric: str) -> str:
    """``test loss (lower is better)``: the metric's label and direction."""
    label, _, higher = METRICS[metric]
    return f"{label} ({'higher' if higher else 'lower'} is better)"


def _comparison_table(comparisons: pd.DataFrame, dataset: str) -> str:
    c = comparisons[comparisons["dataset"] == dataset]
    if c.empty:
        return ("_No comparisons: they need runs of the baseline and of at least one other "
                "variant on this dataset._")
    rows = []
    for _, r in c.iterrows():
        digits = _digits(r["metric"])
        shown = _verdict(r["verdict"])
        rows.append({
            "metric": _metric_label(r["metric"]),
            "variant": r["variant"],
            "paired seeds": int(r["n_pairs"]),
            "baseline mean": _num(r["baseline_mean"], digits),
            "variant mean": _num(r["variant_mean"], digits),
            "Δ (variant − baseline)": _num(r["mean_diff"], digits),
            "95% CI of Δ (raw)": _interval(r, digits),
            "CI of Δ (Holm-adjusted)": _interval(r, digits, "ci_holm"),
            "p (paired t)": _p(r["p_value"]),
            "p (Holm)": _p(r["p_holm"]),
            "MDE (80% power)": _num(r["mde"], digits),
            "verdict": shown,
        })
    return _md_table(pd.DataFrame(rows))


def _extrapolation_section(cfg: StudyConfig, table: pd.DataFrame, comparisons: pd.DataFrame,
                           dataset: str, order: Sequence[str]) -> list[str]:
    """"### Length extrapolation": per variant its position scheme and the test loss at each
    factor x context_length (mean ± CI half-width over seeds, or why there is none), then the
    difference to the reference variant at each factor with its Holm verdict."""
    t = table[table["dataset"] == dataset] if len(table) else table
    if t.empty:
        return []
    factors = sorted(int(f) for f in t["factor"].unique())
    ctx = cfg.model.context_length
    reference = (comparisons[comparisons["dataset"] == dataset]["reference"].iloc[0]
                 if len(comparisons) and (comparisons["dataset"] == dataset).any() else None)
    rows = []
    for v in order:
        tv = t[t["variant"] == v]
        if tv.empty:
            continue
        row = {"variant": v, "positions": cfg.model_config(v, vocab_size=1).position}
        for f in factors:
            r = tv[tv["factor"] == f]
            head = f"{f}x ({f * ctx} tokens)"
            if r.empty:
                row[head] = "–"
            elif r.iloc[0]["note"]:
                row[head] = str(r.iloc[0]["note"])
            else:
                r = r.iloc[0]
                half = (r["ci95_high"] - r["mean"]) if pd.notna(r["ci95_high"]) else float("nan")
                row[head] = _num(r["mean"]) + (f" ± {_num(half)}" if pd.notna(half) else "")
        for f in factors:
            c = comparisons[(comparisons["dataset"] == dataset) & (comparisons["variant"] == v)
                            & (comparisons["metric"] == f"test_loss_x{f}")] \
                if len(comparisons) else comparisons
            head = f"Δ vs {reference} at {f}x"
            if c.empty:
                row[head] = "reference" if v == reference else "–"
                continue
            row[head] = _delta_cell(c.iloc[0])
        rows.append(row)
    return ["### Length extrapolation", "",
            f"Test loss (nats/char) on windows of 1 to {max(factors)} times the training "
            f"context of {ctx} tokens, the same test tokens at every length (mean ± 95% CI "
            "half-width over seeds). A learned position table has no rows past the context, "
            "so it is measured at 1x only. The 1x column reads only the tokens the longest "
            "windows cover, so it can differ in the last digits from the summary's test loss, "
            "measured on windows of its own (up to `evaluate.max_batches` batches). Δ is "
            "paired by seed against "
            f"{reference}, with its raw 95% interval, Holm-corrected over the variants at each "
            "length (▲ better / ▼ worse; lower loss is better). The figure \"test loss by "
            "token position\" shows where along the window the loss changes.", "",
            _md_table(pd.DataFrame(rows)), ""]


def _count(n: Any, total: Any) -> str:
    return f"{_int(n)} of {_int(total)}"


PROBLEM_TITLE = "### Problem by problem (a diagnostic, not a verdict)"


def _problem_table(problems: pd.DataFrame, dataset: str) -> list[str]:
    """The per-problem comparison of ``dataset`` (:func:`~lmablate.report.stats.problems.
    compare_problems`) as a diagnostic: counts, rates (fractions), intervals and p-values,
    with no verdict, mark or bold; no lines without one."""
    p = problems[problems["dataset"] == dataset] if len(problems) else problems
    if p.empty:
        return []
    rows = []
    for _, r in p.iterrows():
        unit = "problems solved" if r["metric"] == "exact_match" else "answer characters right"
        rows.append({
            "metric": _metric_label(r["metric"]),
            "variant": r["variant"],
            "baseline": f"{_count(r['baseline_count'], r['total'])} {unit}",
            "variant ": f"{_count(r['variant_count'], r['total'])}",
            "Δ rate": _num(r["mean_diff"], 4),
            "95% CI of Δ (raw)": _interval(r, 4),
            "CI of Δ (Holm-adjusted)": _interval(r, 4, "ci_holm"),
            "problems that differ": f"{_int(r['n_differing'])} of {_int(r['n_problems'])}",
            "p (sign-flip, problems as independent)": _p(r["p_value"]),
            "p (Holm)": _p(r["p_holm"]),
        })
    first = p.iloc[0]
    return [PROBLEM_TITLE, "",
            f"A diagnostic of which problems the models get right: the same "
            f"{_int(first['n_problems'])} test problems, decoded by every variant on "
            f"{_int(first['n_seeds'])} seeds, paired problem by problem (the per-problem "
            "difference averaged over seeds), with a sign-flip permutation test over problems "
            "(on one seed, McNemar's exact test), Holm-corrected over the variants. Its "
            "p-values treat the problems as independent, but they are problems of the same "
            f"{_int(first['n_seeds'])} trained models, not independent replications, so they "
            "are not the study's verdict, which is drawn over seeds (the comparison above).",
            "", _md_table(pd.DataFrame(rows)), ""]


def _tuning_variation_section(variation: pd.DataFrame, dataset: str) -> list[str]:
    """The re-tunings of ``dataset`` (:func:`~lmablate.report.stats.statistics.tuning_variation`):
    tuned values and the paired difference of each metric; no lines if there is none."""
    v = variation[variation["dataset"] == dataset]
    if v.empty:
        return []
    rows = []
    for _, r in v.iterrows():
        digits = _digits(r["metric"])
        rows.append({
            "variant": r["variant"], "replicate": int(r["replicate"]),
            "metric": _metric_label(r["metric"]),
            "lr, d_model": f"{r['lr']:.3g}, {int(r['d_model'])}",
            "re-tuned lr, d_model": f"{r['replicate_lr']:.3g}, {int(r['replicate_d_model'])}",
            "paired seeds": int(r["n_pairs"]),
            "mean": _num(r["mean"], digits),
            "re-tuned mean": _num(r["replicate_mean"], digits),
            "Δ (re-tuned − original)": _num(r["mean_diff"], digits),
            "95% CI of Δ": _interval(r, digits),
        })
    return ["### How much the tuning varies", "",
            "The variant tuned again from scratch with another sampler seed "
            "(`tune.sampler_seed` + replicate), and its values trained on the same final seeds. "
            "An effect against the baseline no larger than this Δ may owe as much to the "
            "tuner's luck as to the feature.", "",
            _md_table(pd.DataFrame(rows)), ""]


def _tuned_table(ablation: pd.DataFrame, dataset: str, order: Sequence[str]) -> str:
    d = ablation[ablation["dataset"] == dataset]
    rows = []
    for variant in order:
        v = d[d["variant"] == variant]
        if v.empty:
            continue
        lrs = v["lr"].dropna().unique()
        widths = v["d_model"].dropna().unique()
        rows.append({
            "variant": variant,
            # tuning picks one value per dataset x variant; several would mean stale runs
            "lr": ", ".join(f"{x:.3g}" for x in lrs) or "–",
            "d_model": ", ".join(_int(x) for x in widths) or "–",
            "steps": ", ".join(_int(x) for x in v["steps"].dropna().unique()) or "–",
            "parameters": _int(v["n_params"].max()),
            "non-embedding parameters": _int(v["n_params_non_embedding"].max()),
            "FLOPs/token": _int(v["flops_per_token"].max()),
            "throughput (tokens/s, mean)": _int(v["tokens_per_second"].mean()),
            "train time (s, mean)": _num(v["train_seconds"].mean(), 1),
        })
    return _md_table(pd.DataFrame(rows)) if rows else "_No runs._"


def _samples_section(runs: RunOutputs, dataset: str, order: Sequence[str],
                     seeds: Sequence[int], max_chars: int = 600,
                     n_predictions: int = 5) -> list[str]:
    """The first generated sample (text corpora) or the first ``n_predictions`` decoded
    problems (arithmetic) of each variant's first seed that has any."""
    lines: list[str] = []

    def first_seed_key(by_seed: Mapping[str, Any]) -> str | None:
        keys = [k for k in by_seed if by_seed[k]]
        preferred = [f"seed_{s}" for s in seeds if f"seed_{s}" in keys]
        return (preferred or sorted(keys) or [None])[0]

    samples = runs.samples
    shown = [(v, samples[(dataset, v)]) for v in order if (dataset, v) in samples]
    if shown:
        lines += ["### Samples", "",
                  "First sample of the first seed of each variant (truncated to "
                  f"{max_chars} characters).", ""]
        for variant, by_seed in shown:
            key = first_seed_key(by_seed)
            if key is None:
                continue
            text = str(by_seed[key][0])[:max_chars]
            lines += [f"**{variant}** ({key}):", "", _fence(text), ""]
    predictions = runs.predictions
    shown = [(v, predictions[(dataset, v)]) for v in order if (dataset, v) in predictions]
    if shown:
        lines += ["### Predictions", "",
                  f"Up to {n_predictions} greedy-decoded test problems of the first seed of each "
                  "variant, with that seed's exact match and whether it learned the task "
                  "(analysis/success.py).", ""]
        for variant, by_seed in shown:
            key = first_seed_key(by_seed)
            if key is None:
                continue
            seed = int(key.rsplit("_", 1)[-1]) if key.rsplit("_", 1)[-1].isdigit() else None
            status = (seed_status(runs.ablation, dataset, variant, seed)
                      if seed is not None else None)
            rows = [{"prompt": _code_span(p.get("prompt", "")),
                     "target": _code_span(p.get("target", "")),
                     "prediction": _code_span(p.get("prediction", "")),
                     "correct": "✓" if p.get("prediction") == p.get("target") else "✗"}
                    for p in by_seed[key][:n_predictions]]
            lines += [f"**{variant}** ({key}" + (f", {status}" if status else "") + "):", "",
                      _md_table(pd.DataFrame(rows)), ""]
    return lines


def _plural(n: int, noun: str) -> str:
    """``1 seed``, ``5 seeds``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def render_markdown(cfg: StudyConfig, runs: RunOutputs, summary: pd.DataFrame,
                    comparisons: pd.DataFrame,
                    figures: Sequence[tuple[str | None, str, str | None]],
                    environment: Mapping[str, Any] | None = None,
                    notes: Sequence[str] = (),
                    variation: pd.DataFrame | None = None, *,
                    problems: pd.DataFrame | None = None,
                    references: pd.DataFrame | None = None,
                    tuned: pd.DataFrame | None = None,
                    extrapolation: tuple[pd.DataFrame, pd.DataFrame] | None = None,
                    sensitivity: pd.DataFrame | None = None,
                    lr_figures: Mapping[str, tuple[str, str]] | None = None,
                    bracket_figures: Mapping[str, tuple[str, str]] | None = None,
                    arithmetic: Mapping[str, Sequence[str]] | None = None,
                    findings: Sequence[str] = (), scaling: Sequence[str] = ()) -> str:
    """The text of ``report.md`` (GitHub-flavoured Markdown, ``\n`` line ends, one final
    newline).

    Args:
        cfg: the study config, for the methodology paragraph.
        runs: the study's runs (:func:`~lmablate.report.collect.restrict_to_study`): the
            ablation table, samples and predictions. Its datasets and variants, in their
            categorical order, give the sections and the rows of every table.
        summary: :func:`~lmablate.report.stats.statistics.summarise` of ``runs.ablation``.
        comparisons: :func:`~lmablate.report.stats.statistics.compare` of ``runs.ablation``.
        figures: ``(dataset or None, caption, relative path)`` per figure written; each appears
            in its dataset's section (None: in the closing section), linked relatively. A path
            None is a figure not drawn: its caption, the sentence saying why, stands in its
            place.
        environment: free-form facts for the methodology paragraph (see
            :func:`lmablate.stages.report.build_report`).
        notes: extra lines for the data section (e.g. missing or ignored runs).
        variation: :func:`~lmablate.report.stats.statistics.tuning_variation` of the runs; each
            dataset's rows are shown after its comparison with the baseline.
        problems: :func:`~lmablate.report.stats.problems.compare_problems` (arithmetic).
        references: the report stage's reference points (``dataset, reference, metric,
            value, detail``), shown in the summary tables.
        tuned: :attr:`~lmablate.report.collect.RunOutputs.tuned` (range-edge flags).
        extrapolation: ``(table, comparisons)`` of :mod:`lmablate.report.stats.extrapolation`,
            shown per dataset as "Length extrapolation".
        sensitivity: :func:`~lmablate.report.stats.sensitivity.lr_sensitivity` of the trials,
            shown per dataset with the tuned values as "How each variant responds to the
            learning rate" (:data:`lmablate.report.text.lr_section.LR_SECTION`).
        bracket_figures: dataset -> ``(caption, relative path)`` of its full-budget bracket
            figure (:func:`~lmablate.report.figures.bracket_figure.plot_bracket`).
        lr_figures: dataset -> ``(caption, relative path)`` of its learning-rate figure
            (:func:`~lmablate.report.figures.tuning_figure.plot_lr_response`), shown in that section
            rather than among the dataset's other figures.
        arithmetic: dataset -> the lines opening its section
        (:mod:`~lmablate.report.text.arithmetic_section`). findings: the lines of "Findings"
            (:func:`~lmablate.report.text.findings.findings_section`), which open the report.
        scaling: the lines of a scaling study's section "How the effects change with compute"
            (:func:`~lmablate.report.text.scaling_section.scaling_section`), after the limits.

    The section "What this study can and cannot say" (:mod:`lmablate.report.text.limits`) follows
    the introduction; it is written from the same frames.
    """
    empty = pd.DataFrame(columns=["dataset", "metric", "verdict", "reference", "on_edge"])
    problems, references = (x if x is not None else empty for x in (problems, references))
    tuned = tuned if tuned is not None else runs.tuned
    sensitivity = sensitivity if sensitivity is not None else pd.DataFrame(
        columns=["dataset", "variant", "uniform_loss", "note"])
    ablation = runs.ablation
    order = present(ablation["variant"])
    datasets = present(ablation["dataset"])
    lines = [
        "# Ablation study report", "",
        f"{len(ablation)} runs: {_plural(len(datasets), 'dataset')} x "
        f"{_plural(ablation['variant'].nunique(), 'variant')} x "
        f"{_plural(ablation['seed'].nunique(), 'seed')}, of the {cfg.profile} profile "
        f"(`study.profile`). Generated by `lmablate report` "
        "from the run outputs; every number below is computed, none typed by hand.", "",
        *findings,
        "**How to read this report.** Losses are cross-entropy in nats per character (lower is "
        "better); bits/char = loss / ln 2. Tables show the mean over seeds ± the half-width of "
        f"its {CONFIDENCE:.0%} t-interval; italic rows are reference points computed from the "
        f"data. A variant is called better or worse than the "
        f"baseline only when the paired t-test survives Holm's correction (α = {ALPHA}): "
        f"**▲ better** / **▼ worse**, and then its Holm-adjusted interval excludes 0; anything "
        f"else is \"no significant difference\", which is not evidence that the variants are "
        f"equal: MDE, one per comparison (the comparison table's column, also in "
        f"`detectable_effects.csv`), says how large a difference that comparison could have "
        f"missed. The problem-by-problem tables are diagnostics, not verdicts, and "
        f"`grad_flow.csv` is a one-batch diagnostic (see its figure). Raw numbers are "
        "in `ablation.csv`, `summary.csv` (long format: one row per dataset x variant x "
        "metric), `comparisons.csv`, `problem_comparisons.csv`, `detectable_effects.csv`, "
        "`references.csv`, `tuned.csv`, `lr_sensitivity.csv`, `tuning_variation.csv`, "
        "`extrapolation.csv`, `extrapolation_comparisons.csv`, `extrapolation_positions.csv`, "
        "`length_generalisation.csv`, `length_generalisation_comparisons.csv`, "
        "`convergence.csv` and `grad_flow.csv`.", "",
    ]
    lines += limits_section({d: cfg.budgets(d) for d in cfg.datasets}, ablation,
                            summary, comparisons, problems, references, variation, tuned)
    lines += scaling
    lines += methods_section(cfg, ablation, environment, datasets, order)
    if notes:
        lines += ["Data notes:", "", *[f"- {n}" for n in notes], ""]

    for ds in datasets:
        lines += [f"## {ds}", "", *(arithmetic or {}).get(ds, [])]
        lines += [f"### Summary (mean ± {CONFIDENCE:.0%} CI half-width over seeds)", "",
                  _summary_table(summary, ds, order, references), ""]
        s = summary[summary["dataset"] == ds]
        if len(s) and int(s["n"].min()) < 2:
            lines += ["Some cells rest on a single seed: their spread, and hence their "
                      "confidence interval, cannot be estimated.", ""]
        lines += ["### Comparison with the baseline", "", _comparison_table(comparisons, ds), ""]
        c = comparisons[comparisons["dataset"] == ds]
        if len(c) and (c["verdict"] == VERDICT_FEW).any():
            few = list(pd.unique(c.loc[c["verdict"] == VERDICT_FEW, "variant"]))
            lines += [f"Too few seeds to conclude for {', '.join(few)}: fewer than "
                      f"{MIN_SEEDS_FOR_TEST} seeds pair with the baseline, so no test was run "
                      "and the differences shown are descriptive only.", ""]
        if len(c):
            wins = c[c["verdict"] == VERDICT_BETTER]
            losses = c[c["verdict"] == VERDICT_WORSE]
            def listing(rows: pd.DataFrame) -> str:
                return ", ".join(f"{r.variant} ({METRICS[r.metric][0]})"
                                 for r in rows.itertuples()) or "none"
            lines += [f"Significantly better than the baseline: {listing(wins)}. "
                      f"Significantly worse: {listing(losses)}.", ""]
        lines += _problem_table(problems, ds)
        if variation is not None:
            lines += _tuning_variation_section(variation, ds)
        if extrapolation is not None:
            lines += _extrapolation_section(cfg, *extrapolation, ds, order)
        lines += ["### Tuned hyper-parameters, size and throughput", "",
                  _tuned_table(ablation, ds, order), ""]
        lines += lr_section(cfg, sensitivity, tuned, runs.trials, ds, order,
                             (lr_figures or {}).get(ds))
        if tuned is not None and "bracket_state" in tuned:
            lines += bracket_lines(cfg, tuned, ds, order, (bracket_figures or {}).get(ds))
        ds_figs = [(cap, rel) for d, cap, rel in figures if d == ds]
        if ds_figs:
            lines += ["### Figures", ""]
            for caption, rel in ds_figs:
                lines += ([f"**{caption}**", "", f"![{Path(rel).stem}]({rel})", ""]
                          if rel is not None else [caption, ""])  # a figure not drawn
        lines += _samples_section(runs, ds, order, cfg.seeds)
    other = [(cap, rel) for d, cap, rel in figures if d is None]
    if other:
        lines += ["## Other figures", ""]
        for caption, rel in other:
            lines += ([f"**{caption}**", "", f"![{Path(rel).stem}]({rel})", ""]
                      if rel is not None else [caption, ""])
    return "\n".join(lines).rstrip() + "\n"

