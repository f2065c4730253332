"""The report's "What this study can and cannot say", per dataset, from the report's frames:
the training each model got, where the variants sit among the data's references, the tuning
uncertainty, and every flag raised. Losses in nats/char, accuracies as fractions.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import pandas as pd

from lmablate.report.collect import BASELINE, present
from lmablate.report.stats.statistics import (ALPHA, METRICS, VERDICT_BETTER,
                                          VERDICT_IDENTICAL, VERDICT_UNDECIDED_TUNING,
                                          VERDICT_WORSE)
from lmablate.report.text.templating import macro_text

LIMITS = "_limits.md.j2"  # the section's sentences, one macro each

TRIGRAM = "trigram"  # the order-3 reference's name in references.csv


def trigram_reference(references: pd.DataFrame | None, dataset: str,
                      metric: str) -> float | None:
    """The trigram cross-entropy of ``dataset``'s test split in ``metric`` (nats/char), from
    the reference table; None where it has none (no tokens, or not ``test_loss``)."""
    if references is None or references.empty:
        return None
    r = references[(references["dataset"] == dataset) & (references["metric"] == metric)
                   & (references["reference"] == TRIGRAM)]
    return float(r["value"].iloc[0]) if len(r) else None


def _mean(summary: pd.DataFrame, dataset: str, metric: str) -> pd.Series:
    s = summary[(summary["dataset"] == dataset) & (summary["metric"] == metric)]
    return s.set_index(s["variant"].astype(str))["mean"]


def say(macro: str, /, **fields) -> str:
    """The sentence of :data:`LIMITS`' macro ``macro`` with ``fields``."""
    return macro_text(LIMITS, macro, **fields)


def _training(ablation: pd.DataFrame, dataset: str, budgets: Sequence[float] = ()) -> str:
    d = ablation[ablation["dataset"] == dataset]
    tokens, flops = d["tokens"].dropna().astype(float), d["train_flops"].dropna().astype(float)
    return say("training", tokens=(tokens.min(), tokens.max()), flops=(flops.min(), flops.max()),
               budgets=list(budgets), widths=[str(w) for w in sorted(
                   {int(w) for w in d["d_model"].dropna()})])


def _between_references(summary: pd.DataFrame, references: pd.DataFrame,
                        dataset: str) -> list[str]:
    refs = references[(references["dataset"] == dataset)
                      & (references["metric"] == "test_loss")]
    losses = _mean(summary, dataset, "test_loss")
    if refs.empty or losses.empty:
        return []
    refs = refs.sort_values("value", ascending=False)
    best = refs["value"].iloc[-1]
    margin = best - losses
    step = refs["value"].iloc[-2] - best if len(refs) > 1 else None
    return [say("references", refs=list(refs.itertuples()), detail=refs["detail"].iloc[0],
                low=losses.min(), high=losses.max(),
                below=[v for v, x in losses.items() if x < best],
                above=[v for v, x in losses.items() if not x < best],
                margin=(margin.min(), margin.max()), step=step,
                next_ref=refs["reference"].iloc[-2] if len(refs) > 1 else None)]


def _tuning_uncertainty(comparisons: pd.DataFrame, tuned: pd.DataFrame,
                        dataset: str) -> list[str]:
    """Each variant's tuning uncertainty and the verdicts it made "undecided (tuning)"."""
    if tuned is None or tuned.empty or "tuning_uncertainty" not in tuned:
        return []
    t = tuned[(tuned["dataset"] == dataset) & tuned["bracket_state"].notna()]
    if t.empty:
        return []
    c = comparisons[(comparisons["dataset"] == dataset)
                    & (comparisons["verdict"] == VERDICT_UNDECIDED_TUNING)]
    return [say("tuning_uncertainty",
                values=[(r.variant, None if pd.isna(r.tuning_uncertainty)
                         else r.tuning_uncertainty) for r in t.itertuples()],
                objective=str(t["objective"].iloc[0]) if "objective" in t else "val_loss",
                undecided=list(c.itertuples()))]


def _widths(ablation: pd.DataFrame, dataset: str) -> list[str]:
    d = ablation[ablation["dataset"] == dataset]
    base_w = set(d.loc[d["variant"] == BASELINE, "d_model"].dropna().astype(int))
    other = sorted({str(v) for v, w in zip(d["variant"], d["d_model"])
                    if pd.notna(w) and int(w) not in base_w})
    base = [str(w) for w in sorted(base_w)]
    if other and base_w:
        return [say("other_width", base=base, widths=[
            (v, [str(w) for w in sorted(set(d.loc[d["variant"] == v, "d_model"].astype(int)))])
            for v in other])]
    return [say("same_width", base=base)] if base_w and d["variant"].nunique() > 1 else []


def _flags(comparisons: pd.DataFrame, problems: pd.DataFrame, tuned: pd.DataFrame,
           ablation: pd.DataFrame, summary: pd.DataFrame, references: pd.DataFrame,
           dataset: str) -> list[str]:
    """Tuned values on an edge, identical differences, other widths, what the study can say,
    and metrics no variant beats a question-blind answer in."""
    lines = []
    t = tuned[(tuned["dataset"] == dataset) & tuned["on_edge"].fillna("").astype(bool)]
    if len(t):
        # one clause per flag, naming the variants that share it
        flags: dict[str, list[str]] = {}
        for r in t.itertuples():
            for flag in str(r.on_edge).split("; "):
                flags.setdefault(flag, []).append(str(r.variant))
        lines.append(say("on_edge", flags=list(flags.items())))
    same = comparisons[(comparisons["dataset"] == dataset)
                       & (comparisons["verdict"] == VERDICT_IDENTICAL)]
    if len(same):
        lines.append(say("identical", rows=[{"variant": r.variant, "mean_diff": r.mean_diff,
                                             "label": METRICS[r.metric][0]}
                                            for r in same.itertuples()]))
    lines += _widths(ablation, dataset)
    lines.append(_can_say(comparisons, dataset))
    unbeaten = []
    for metric in ("answer_loss", "exact_match", "char_accuracy"):
        refs = references[(references["dataset"] == dataset) & (references["metric"] == metric)]
        means = _mean(summary, dataset, metric)
        if len(refs) and len(means) and (means.max() <= refs["value"].max() if METRICS[
                metric][2] else means.min() >= refs["value"].min()):
            unbeaten.append(METRICS[metric][0])
    return lines + ([say("unbeaten", labels=unbeaten)] if unbeaten else [])


def _can_say(comparisons: pd.DataFrame, dataset: str) -> str:
    """The better and worse verdicts in any metric, those unchecked by tuning labelled so."""
    called = comparisons[(comparisons["dataset"] == dataset)
                         & comparisons["verdict"].isin([VERDICT_BETTER, VERDICT_WORSE])]
    verdicts = [{"variant": r.variant, "verdict": r.verdict, "label": METRICS[r.metric][0],
                 "checked": pd.notna(getattr(r, "tuning_uncertainty", math.nan))}
                for r in called.itertuples()]
    return say("can_say", compared=bool((comparisons["dataset"] == dataset).any()),
               verdicts=verdicts, alpha=ALPHA)


def limits_bullets(cfg_budgets: Mapping[str, Sequence[float]], ablation: pd.DataFrame,
                   summary: pd.DataFrame, comparisons: pd.DataFrame,
                   problems: pd.DataFrame, references: pd.DataFrame,
                   tuned: pd.DataFrame) -> dict[str, list[str]]:
    """Dataset of ``ablation`` (study order) -> its bullets, each a Markdown sentence or more.
    ``cfg_budgets``: each dataset's budgets in training FLOPs, increasing
    (:meth:`lmablate.config.study.StudyConfig.budgets`); ``references``: columns ``dataset,
    reference, metric, value, detail``; ``problems``:
    :func:`~lmablate.report.stats.problems.compare_problems` (may be empty)."""
    return {ds: [_training(ablation, ds, cfg_budgets.get(ds, ())),
                 *_between_references(summary, references, ds),
                 *_tuning_uncertainty(comparisons, tuned, ds),
                 *_flags(comparisons, problems, tuned, ablation, summary, references, ds)]
            for ds in present(ablation["dataset"])}
