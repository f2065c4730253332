"""The text of ``report.md``: methodology, per-dataset tables, verdicts, figures and samples.

Every number is taken from the tables of :mod:`lmablate.analysis.statistics`, the runs of
:mod:`lmablate.analysis.collect` and the config; none is typed by hand. Tables list variants in
the study order carried by the frames' categorical ``variant`` column (baseline first).

Units in the text: losses in nats/token (bits/char = loss / ln 2), accuracies as fractions,
times in seconds, throughput in tokens/s.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from lmablate.analysis.collect import RunOutputs, present
from lmablate.analysis.limits import limits_section
from lmablate.analysis.sensitivity import design_is_shared, width_summary
from lmablate.analysis.statistics import (ALPHA, CONFIDENCE, METRICS, MIN_SEEDS_FOR_TEST, POWER,
                                          VERDICT_BETTER, VERDICT_FEW, VERDICT_IDENTICAL,
                                          VERDICT_WORSE)
from lmablate.config import StudyConfig

VERDICT_MARKS = {VERDICT_BETTER: "▲", VERDICT_WORSE: "▼"}


def _md_table(df: pd.DataFrame) -> str:
    """A GitHub-flavoured markdown table (kept local so the report needs no ``tabulate``)."""
    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")
    header = "| " + " | ".join(cell(c) for c in df.columns) + " |"
    rule = "|" + "|".join("---" for _ in df.columns) + "|"
    body = ["| " + " | ".join(cell(v) for v in row) + " |"
            for row in df.itertuples(index=False, name=None)]
    return "\n".join([header, rule, *body])


def _num(x: Any, digits: int = 3) -> str:
    """Fixed-point with ``digits`` decimals, "–" for missing."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)) or pd.isna(x):
        return "–"
    return f"{float(x):.{digits}f}"


def _int(x: Any) -> str:
    if x is None or pd.isna(x):
        return "–"
    return f"{int(round(float(x))):,}"


def _p(x: Any) -> str:
    if x is None or pd.isna(x):
        return "–"
    return "<0.001" if x < 0.001 else f"{x:.3f}"


def _digits(metric: str) -> int:
    return {"perplexity": 2, "train_seconds": 1, "tokens_per_second": 0}.get(metric, 3)


def _fence(text: str) -> str:
    """A code block whose fence is longer than any backtick run inside ``text`` (a generated
    sample may well contain ``` and would otherwise close the block)."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text}\n{fence}"


def _code_span(text: str) -> str:
    text = str(text).replace("\n", "\\n")
    return f"`` {text} ``" if "`" in text else f"`{text}`"


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


def _verdict(verdict: str) -> str:
    """A verdict as shown: bold with its mark when better or worse."""
    mark = VERDICT_MARKS.get(verdict, "")
    return f"**{mark} {verdict}**" if mark else verdict


def _delta_cell(c: Mapping[str, Any]) -> str:
    """A comparison row as one cell: mean difference, raw interval and verdict."""
    return f"{_num(c['mean_diff'])} {_interval(c, 3)} {_verdict(c['verdict'])}"


def _interval(row: Mapping[str, Any], digits: int, prefix: str = "ci95") -> str:
    """``[<prefix>_low, <prefix>_high]`` of a table row, or "–" where there is no interval."""
    if not np.isfinite(row[f"{prefix}_low"]):
        return "–"
    return f"[{_num(row[f'{prefix}_low'], digits)}, {_num(row[f'{prefix}_high'], digits)}]"


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
            f"Test loss (nats/token) on windows of 1 to {max(factors)} times the training "
            f"context of {ctx} tokens, the same test tokens at every length (mean ± 95% CI "
            "half-width over seeds). A learned position table has no rows past the context, "
            "so it is measured at 1x only. Δ is paired by seed against "
            f"{reference}, with its raw 95% interval, Holm-corrected over the variants at each "
            "length (▲ better / ▼ worse; lower loss is better). The figure \"test loss by "
            "token position\" shows where along the window the loss changes.", "",
            _md_table(pd.DataFrame(rows)), ""]


def _count(n: Any, total: Any) -> str:
    return f"{_int(n)} of {_int(total)}"


def _problem_table(problems: pd.DataFrame, dataset: str) -> list[str]:
    """The per-problem comparison of ``dataset`` (:func:`~lmablate.analysis.statistics.
    compare_problems`): counts, rates, intervals, test and verdict; no lines without one."""
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
            "p (sign-flip)": _p(r["p_value"]),
            "p (Holm)": _p(r["p_holm"]),
            "verdict": _verdict(r["verdict"]),
        })
    first = p.iloc[0]
    return ["### Problem by problem", "",
            f"The same {_int(first['n_problems'])} test problems, decoded by every variant on "
            f"{_int(first['n_seeds'])} seeds, paired problem by problem: the per-problem "
            "difference is averaged over seeds (a problem's seeds are not independent), tested "
            "with a sign-flip permutation test over problems (on one seed, McNemar's exact "
            "test) and Holm-corrected over the variants. The t-interval over problems is the "
            "large-sample one; with few problems that differ, trust the test. The unit is the "
            "problem and the models are these trained seeds: a verdict here generalises to "
            "other problems, not to other training seeds, which the comparison above (paired "
            "by seed) tests.", "",
            _md_table(pd.DataFrame(rows)), ""]


def _tuning_variation_section(variation: pd.DataFrame, dataset: str) -> list[str]:
    """The re-tunings of ``dataset`` (:func:`~lmablate.analysis.statistics.tuning_variation`):
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


def _compute_table(cfg: StudyConfig, ablation: pd.DataFrame, datasets: Sequence[str],
                   order: Sequence[str]) -> str:
    """Per dataset x variant: tuned width, steps, tokens and training FLOPs of its final runs,
    and those FLOPs as a share of the dataset's budget."""
    rows = []
    for ds in datasets:
        budget = cfg.train.budget_flops.get(ds)
        for variant in order:
            v = ablation[(ablation["dataset"] == ds) & (ablation["variant"] == variant)]
            if v.empty:
                continue
            flops = v["train_flops"].dropna()
            rows.append({
                "dataset": ds, "variant": variant,
                "d_model": ", ".join(_int(x) for x in v["d_model"].dropna().unique()) or "–",
                "steps": ", ".join(_int(x) for x in v["steps"].dropna().unique()) or "–",
                "tokens": _int(v["tokens"].max()),
                "training FLOPs": f"{flops.max():.3g}" if len(flops) else "–",
                "of budget": (f"{flops.max() / budget:.1%}" if len(flops) and budget else "–"),
            })
    return _md_table(pd.DataFrame(rows)) if rows else "_No runs._"


LR_SECTION = "### How each variant responds to the learning rate"


def _missing(x: Any) -> bool:
    """None, NaN or an empty string."""
    return x is None or (isinstance(x, str) and not x) or (not isinstance(x, str) and pd.isna(x))


def _lr_table(sens: pd.DataFrame, tuned: pd.DataFrame, widths: pd.DataFrame,
              order: Sequence[str]) -> str:
    """One row per variant of ``sens`` or ``tuned`` (one dataset): S, its design points, the
    best design lr, and the tuned values of ``tuned`` (best.json) with the tokens per
    parameter of the tuned width (``widths``: :func:`~lmablate.analysis.sensitivity.
    width_summary`)."""
    ratios = {int(r.d_model): r.tokens_per_parameter for r in widths.itertuples()}
    rows = []
    for variant in order:
        s, t = sens[sens["variant"] == variant], tuned[tuned["variant"] == variant]
        if s.empty and t.empty:
            continue
        s = s.iloc[0].to_dict() if len(s) else {}
        t = t.iloc[0].to_dict() if len(t) else {}
        n, width = s.get("n_design"), t.get("d_model")
        ratio = None if _missing(width) else ratios.get(int(width))
        rows.append({
            "variant": variant,
            "LR sensitivity S (nats)": _num(s.get("lr_sensitivity")),
            "design points (diverged)": "–" if _missing(n) else
            f"{int(n)} ({int(s['n_design_diverged'])})",
            "best design lr": "–" if _missing(s.get("best_design_lr")) else
            f"{s['best_design_lr']:.3g}",
            "tuned lr": "–" if _missing(t.get("lr")) else f"{t['lr']:.3g}",
            "tuned d_model (tokens/param)": "–" if _missing(width) else f"{int(width)}" + (
                "" if _missing(ratio) else f" ({ratio:.3g})"),
            "trained at full budget": "–" if _missing(t.get("full_budget")) else (
                "yes" if str(t["full_budget"]).strip().lower() in ("true", "1", "yes")
                else "no"),
            "range extended": "–" if _missing(t.get("extended")) else str(t["extended"]),
            "on edge": "–" if _missing(t.get("on_edge")) else str(t["on_edge"]),
        })
    return _md_table(pd.DataFrame(rows)) if rows else "_No tuning trials._"


def _lr_section(cfg: StudyConfig, sensitivity: pd.DataFrame, tuned: pd.DataFrame,
                trials: pd.DataFrame, dataset: str, order: Sequence[str],
                figure: tuple[str, str] | None) -> list[str]:
    """"How each variant responds to the learning rate": the definition of the sensitivity
    and what it rests on, the table (:func:`_lr_table`) and the figure; no lines when the
    dataset has neither a sensitivity row nor a figure."""
    sens = sensitivity[sensitivity["dataset"] == dataset] if len(sensitivity) else sensitivity
    if sens.empty and figure is None:
        return []
    tu = cfg.tune
    design = sens.dropna(subset=["design_d_model"])
    n = int(design["n_design"].max()) if len(design) else tu.trials_per_batch
    width = ", ".join(str(int(w)) for w in pd.unique(design["design_d_model"])) or "–"
    ratio = ", ".join(f"{x:.3g}" for x in pd.unique(design["design_tokens_per_parameter"]
                                                     .dropna()))
    fraction = ", ".join(f"{x:g}" for x in pd.unique(design["budget_fraction"].dropna())) \
        or f"{tu.rungs[0][1]:g}"
    l0 = sens["uniform_loss"].dropna()
    if len(l0):
        start = (f"L0 = ln V = {l0.iloc[0]:.3f} nats, the loss of the uniform prediction over "
                 f"the V = {round(math.exp(l0.iloc[0]))} tokens of the vocabulary (the loss "
                 "at initialisation), at which a diverged trial counts")
    else:
        start = ("L0 the loss of the uniform prediction, ln of the vocabulary size, which "
                 "comes from the tokenized data: not given to this report, so S is not "
                 "computed")
    text = (
        "Learning-rate sensitivity (Wortsman et al. 2023, \"Small-scale proxies for "
        "large-scale Transformer training instabilities\", sec. 2.2): S = mean over the "
        "design's learning rates of min(L, L0) − L*, with L the validation loss (nats/token) at "
        f"the end of a trial, L* the lowest of them and {start}. Small S: the loss stays near "
        "its best over the whole range; large S: only a narrow band of learning rates trains "
        f"well. The design is each study's first batch: {n} learning rates evenly spaced in "
        f"log over [{tu.lr_low:g}, {tu.lr_high:g}] at d_model {width}"
        + (f" ({ratio} training tokens per parameter)" if ratio else "")
        + (", the same points for every variant, so the curves are paired"
           if design_is_shared(trials, dataset) else
           "; the variants were NOT tried at the same points, so the curves are not paired")
        + f", each trial trained for {fraction} of the budget. Every point is one training "
        f"seed ({tu.seed}) at that share of the budget, not the final runs: a difference in S "
        "between variants smaller than the seed-to-seed spread of a loss is not a finding. "
        "The tuned values are the study's answer (best.json): the best trial of the last "
        "rung, at the full budget unless every trial there diverged; tokens per parameter "
        "are those of the baseline at that width.")
    missing = [f"{r.variant}: {r.note}" for r in sens.itertuples()
               if isinstance(r.note, str) and r.note]
    lines = [LR_SECTION, "", text, "",
             _lr_table(sens, tuned[tuned["dataset"] == dataset] if len(tuned) else tuned,
                       width_summary(trials[trials["dataset"] == dataset]
                                     if len(trials) else trials), order), ""]
    if missing:
        lines += ["No sensitivity for " + "; ".join(missing) + ".", ""]
    if figure is not None:
        caption, rel = figure
        lines += [f"**{caption}**", "", f"![{Path(rel).stem}]({rel})", ""]
    return lines


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
                  "variant.", ""]
        for variant, by_seed in shown:
            key = first_seed_key(by_seed)
            if key is None:
                continue
            rows = [{"prompt": _code_span(p.get("prompt", "")),
                     "target": _code_span(p.get("target", "")),
                     "prediction": _code_span(p.get("prediction", "")),
                     "correct": "✓" if p.get("prediction") == p.get("target") else "✗"}
                    for p in by_seed[key][:n_predictions]]
            lines += [f"**{variant}** ({key}):", "", _md_table(pd.DataFrame(rows)), ""]
    return lines


def _rungs_text(tu) -> str:
    """``tune.rungs`` in words: "8 configurations at 0.125 of the budget, the best 2 at 1"."""
    parts = [f"{tu.rungs[0][0]} configurations at {tu.rungs[0][1]:g} of the budget"]
    parts += [f"the best {n} at {f:g}" for n, f in tu.rungs[1:]]
    return ", then ".join(parts)


def _widths_text(tu) -> str:
    """The widths searched, in words."""
    if tu.d_model_choices is not None:
        return "one of " + ", ".join(map(str, tu.d_model_choices))
    low, high = tu.tokens_per_parameter
    return (f"{tu.n_widths} multiples of 2 n_heads with {low:g} to {high:g} training tokens per "
            "non-embedding parameter at the budget (Hoffmann et al. 2022), extended by a step "
            "past an edge")


def _methodology(cfg: StudyConfig, ablation: pd.DataFrame,
                 environment: Mapping[str, Any] | None) -> list[str]:
    tr, tu, m, ev = cfg.train, cfg.tune, cfg.model, cfg.evaluate
    datasets = ", ".join(f"{name} ({d.kind})" for name, d in cfg.datasets.items())
    changes = [f"{v}: " + ", ".join(f"{k}={val}" for k, val in cfg.variants[v].items())
               for v in cfg.study_variants if cfg.variants.get(v)]
    budgets = ", ".join(f"{name} {tr.budget_flops[name]:.3g}" for name in cfg.datasets)
    text = (
        f"Each of {len(cfg.study_variants)} variants was trained on each of "
        f"{len(cfg.datasets)} datasets ({datasets}) with {len(cfg.seeds)} seeds "
        f"({', '.join(map(str, cfg.seeds))}); the same seeds are used for every variant, so "
        f"results can be paired by seed. "
        f"The baseline is a {m.n_layers}-layer GPT with {m.n_heads} heads, {m.ffn} "
        f"feed-forward, {m.norm_placement}-{m.norm}, {m.position} positions and a context of "
        f"{m.context_length} characters" + (f"; the variants change {'; '.join(changes)}. "
                                            if changes else ". ") +
        f"Every final run of a dataset spends the same training compute (FLOPs: {budgets}; "
        f"6 N + 6 n_layers n_ctx d_model per token, Kaplan et al. 2020), so its number of "
        f"optimizer steps of {tr.batch_size} sequences x {m.context_length} tokens follows "
        f"from its width. "
        f"Before training, the learning rate (log-uniform in [{tu.lr_low:g}, {tu.lr_high:g}], "
        f"extended by 10x past an edge within [{tu.lr_limits[0]:g}, {tu.lr_limits[1]:g}]) and "
        f"d_model ({_widths_text(tu)}) were tuned per dataset x variant by successive halving "
        f"with Optuna: {_rungs_text(tu)}, every trial on seed {tu.seed} (not a final seed), "
        f"objective the validation loss at the end of the trial; the first "
        f"{tu.trials_per_batch} configurations are the same for every variant, "
        f"{tu.trials_per_batch} learning rates evenly spaced in log over the range at the "
        f"width nearest {math.sqrt(tu.tokens_per_parameter[0] * tu.tokens_per_parameter[1]):g}"
        f" training tokens per parameter (the design of the learning-rate sensitivity), the "
        f"rest of the first rung proposed by TPE with each study's own seed (sampler seed "
        f"{tu.sampler_seed}); the tuned values (per variant below) replace the configured "
        f"learning rate {tr.lr:g} and width {m.d_model}. "
        f"Each run then trained with a {tr.lr_schedule} learning-rate "
        f"schedule warming up over {tr.warmup_fraction:.0%} of its steps, weight decay "
        f"{tr.weight_decay:g}, "
        f"betas ({tr.beta1:g}, {tr.beta2:g}), gradient clipping at {tr.grad_clip:g}, "
        f"validation every {tr.eval_interval} steps over {tr.eval_iters} batches. "
        f"Test loss is measured on up to {ev.max_batches} batches of held-out data; arithmetic "
        f"answers are greedy-decoded for up to {ev.max_problems} test problems."
    )
    if cfg.match_params:
        text += (" Each variant's feed-forward width was adjusted so that its non-embedding "
                 "parameter count matches the baseline's at the same d_model.")
    stats_text = (
        f"Statistics: each table gives the mean over seeds ± the half-width of its "
        f"{CONFIDENCE:.0%} Student-t interval. Variants are compared with the baseline by a "
        f"two-sided paired t-test on the per-seed differences (scipy.stats.ttest_rel); the "
        f"p-values of all variants within a dataset x metric are corrected with Holm's method "
        f"(statsmodels multipletests) at a family-wise α = {ALPHA}. Next to the raw "
        f"{CONFIDENCE:.0%} interval of Δ stands its Holm-adjusted interval, the t-interval at "
        f"level 1 − α·p/p_Holm, which excludes 0 exactly when the verdict is better or worse. "
        f"A difference that is the same on every seed has no spread to test against: it is "
        f"reported as \"{VERDICT_IDENTICAL}\", without a p-value. MDE is the smallest true "
        f"difference the paired t-test would detect with {POWER:.0%} power at the observed SD "
        f"of the differences and Holm's strictest level α/m (statsmodels TTestPower). With "
        f"fewer than {MIN_SEEDS_FOR_TEST} paired seeds no test is run. Arithmetic answers are "
        f"also compared problem by problem (sign-flip permutation test over the same test "
        f"problems, Holm-corrected). Reference points come from the data: n-gram "
        f"cross-entropies of the test split under train-split counts, and scores of answers "
        f"that ignore the question."
    )
    lines = ["## Methodology", "", text, "", stats_text, ""]
    env = dict(environment or {})
    hardware = next((env[k] for k in ("hardware", "device", "gpu", "cpu") if env.get(k)), None)
    torch_v = next((env[k] for k in ("torch", "torch_version") if env.get(k)), None)
    total = ablation["train_seconds"].sum(min_count=1)
    if hardware or torch_v:
        sentence = (f"Runs executed on {hardware or 'unrecorded hardware'} with torch "
                    f"{torch_v or '(version not recorded)'}")
    else:
        sentence = "Environment not recorded"
    if pd.notna(total):
        sentence += (f"; training took {total:,.1f} s in total over {len(ablation)} runs "
                     f"(sum of train_seconds)")
    lines += [sentence + ".", ""]
    if env:
        lines += ["Environment:", ""]
        for key, value in env.items():
            if isinstance(value, Mapping):
                value = ", ".join(f"{k}={_env_value(v)}" for k, v in value.items())
            lines.append(f"- {key}: {_env_value(value)}")
        lines.append("")
    return lines


def _env_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.1f}" if abs(v) >= 10 else f"{v:.3g}"
    return str(v)


def render_markdown(cfg: StudyConfig, runs: RunOutputs, summary: pd.DataFrame,
                    comparisons: pd.DataFrame,
                    figures: Sequence[tuple[str | None, str, str | None]],
                    environment: Mapping[str, Any] | None = None,
                    notes: Sequence[str] = (),
                    variation: pd.DataFrame | None = None, *,
                    problems: pd.DataFrame | None = None,
                    detectable: pd.DataFrame | None = None,
                    references: pd.DataFrame | None = None,
                    tuned: pd.DataFrame | None = None,
                    extrapolation: tuple[pd.DataFrame, pd.DataFrame] | None = None,
                    sensitivity: pd.DataFrame | None = None,
                    lr_figures: Mapping[str, tuple[str, str]] | None = None,
                    arithmetic: Mapping[str, Sequence[str]] | None = None) -> str:
    """The text of ``report.md`` (GitHub-flavoured Markdown, ``\n`` line ends, one final
    newline).

    Args:
        cfg: the study config, for the methodology paragraph.
        runs: the study's runs (:func:`~lmablate.analysis.collect.restrict_to_study`): the
            ablation table, samples and predictions. Its datasets and variants, in their
            categorical order, give the sections and the rows of every table.
        summary: :func:`~lmablate.analysis.statistics.summarise` of ``runs.ablation``.
        comparisons: :func:`~lmablate.analysis.statistics.compare` of ``runs.ablation``.
        figures: ``(dataset or None, caption, relative path)`` per figure written; each appears
            in its dataset's section (None: in the closing section), linked relatively. A path
            None is a figure not drawn: its caption, the sentence saying why, stands in its
            place.
        environment: free-form facts for the methodology paragraph (see
            :func:`lmablate.stages.report.build_report`).
        notes: extra lines for the data section (e.g. missing or ignored runs).
        variation: :func:`~lmablate.analysis.statistics.tuning_variation` of the runs; each
            dataset's rows are shown after its comparison with the baseline.
        problems: :func:`~lmablate.analysis.statistics.compare_problems` (arithmetic).
        detectable: :func:`~lmablate.analysis.statistics.detectable_effects`.
        references: the report stage's reference points (``dataset, reference, metric,
            value, detail``), shown in the summary tables.
        tuned: :attr:`~lmablate.analysis.collect.RunOutputs.tuned` (range-edge flags).
        extrapolation: ``(table, comparisons)`` of :mod:`lmablate.analysis.extrapolation`,
            shown per dataset as "Length extrapolation".
        sensitivity: :func:`~lmablate.analysis.sensitivity.lr_sensitivity` of the trials,
            shown per dataset with the tuned values as "How each variant responds to the
            learning rate" (:data:`LR_SECTION`).
        lr_figures: dataset -> ``(caption, relative path)`` of its learning-rate figure
            (:func:`~lmablate.analysis.tuning_figure.plot_lr_response`), shown in that section
            rather than among the dataset's other figures.
        arithmetic: dataset -> the lines opening its section (:mod:`~lmablate.analysis.arithmetic`).

    The section "What this study can and cannot say" (:mod:`lmablate.analysis.limits`) follows
    the introduction; it is written from the same frames.
    """
    empty = pd.DataFrame(columns=["dataset", "metric", "verdict", "reference", "on_edge"])
    problems, detectable, references = (x if x is not None else empty
                                        for x in (problems, detectable, references))
    tuned = tuned if tuned is not None else runs.tuned
    sensitivity = sensitivity if sensitivity is not None else pd.DataFrame(
        columns=["dataset", "variant", "uniform_loss", "note"])
    ablation = runs.ablation
    order = present(ablation["variant"])
    datasets = present(ablation["dataset"])
    lines = [
        "# Ablation study report", "",
        f"{len(ablation)} runs: {len(datasets)} dataset(s) x "
        f"{ablation['variant'].nunique()} variant(s) x {ablation['seed'].nunique()} seed(s). "
        "Generated by `lmablate report` "
        "from the run outputs; every number below is computed, none typed by hand.", "",
        "**How to read this report.** Losses are cross-entropy in nats per character (lower is "
        "better); bits/char = loss / ln 2. Tables show the mean over seeds ± the half-width of "
        f"its {CONFIDENCE:.0%} t-interval; italic rows are reference points computed from the "
        f"data. A variant is called better or worse than the "
        f"baseline only when the paired t-test survives Holm's correction (α = {ALPHA}): "
        f"**▲ better** / **▼ worse**, and then its Holm-adjusted interval excludes 0; anything "
        f"else is \"no significant difference\", which is not evidence that the variants are "
        f"equal: MDE says how large a difference the study could have missed. Raw numbers are "
        "in `ablation.csv`, `summary.csv` (long format: one row per dataset x variant x "
        "metric), `comparisons.csv`, `problem_comparisons.csv`, `detectable_effects.csv`, "
        "`references.csv`, `tuned.csv`, `lr_sensitivity.csv`, `tuning_variation.csv`, "
        "`extrapolation.csv`, "
        "`extrapolation_comparisons.csv` and `extrapolation_positions.csv`.", "",
        "**Compared at equal training compute.** Within a dataset every final run spends the "
        "same training FLOPs (`train.budget_flops`); each variant's width was tuned, and its "
        "step count follows from that width, so a narrower model trains more steps:", "",
        _compute_table(cfg, ablation, datasets, order), "",
    ]
    lines += limits_section(dict(cfg.train.budget_flops), ablation, summary, comparisons,
                            problems, detectable, references, variation, tuned)
    lines += _methodology(cfg, ablation, environment)
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
        lines += _lr_section(cfg, sensitivity, tuned, runs.trials, ds, order,
                             (lr_figures or {}).get(ds))
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

