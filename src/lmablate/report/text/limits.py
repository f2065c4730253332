"""The report's "What this study can and cannot say" section, written from the study's tables.

Every sentence is computed from the frames the report stage writes as CSVs (``ablation``,
``summary``, ``comparisons``, ``problem_comparisons``, ``references``,
``tuned``); nothing is typed by hand, so the section follows the results of any profile. It
states, per dataset: the training each model got, where the variants sit between the data's
reference points (the answer floors are the headline's), how much the tuning itself varies
(the minimum detectable effects are the Findings' verdict table's), and every flag raised (a tuned value on the edge of its range, a difference identical
on every seed, a variant trained at another width than the baseline).

Units: losses in nats/char (one token is one character), accuracies as fractions.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import pandas as pd

from lmablate.report.collect import BASELINE, present
from lmablate.report.stats.scaling import SCALING_TITLE
from lmablate.report.stats.statistics import (ALPHA, METRICS, VERDICT_BETTER,
                                          VERDICT_IDENTICAL, VERDICT_UNDECIDED_TUNING,
                                          VERDICT_WORSE)
from lmablate.report.text.mdtable import join_names as _names

# the name of the order-3 reference in references.csv
# (lmablate.report.stats.reference_models.ngram_references)
TRIGRAM = "trigram"


def trigram_reference(references: pd.DataFrame | None, dataset: str,
                      metric: str) -> float | None:
    """The trigram cross-entropy of ``dataset``'s test split in ``metric`` (nats/char), from
    the report's reference table; None where it has none (no tokens given, or a metric other
    than ``test_loss``, such as arithmetic's answer loss)."""
    if references is None or references.empty:
        return None
    r = references[(references["dataset"] == dataset) & (references["metric"] == metric)
                   & (references["reference"] == TRIGRAM)]
    return float(r["value"].iloc[0]) if len(r) else None


def _mean(summary: pd.DataFrame, dataset: str, metric: str) -> pd.Series:
    """variant -> mean over seeds of ``metric`` on ``dataset`` (study order)."""
    s = summary[(summary["dataset"] == dataset) & (summary["metric"] == metric)]
    return s.set_index(s["variant"].astype(str))["mean"]


def _training(ablation: pd.DataFrame, dataset: str, budgets: Sequence[float] = ()) -> str:
    d = ablation[ablation["dataset"] == dataset]
    tokens, flops = d["tokens"].dropna().astype(float), d["train_flops"].dropna().astype(float)
    widths = sorted({int(w) for w in d["d_model"].dropna()})
    def span(lo: float, hi: float, fmt: str) -> str:
        a, b = format(lo, fmt), format(hi, fmt)
        return a if a == b else f"{a} to {b}"

    text = (f"Each final run trained on {span(tokens.min(), tokens.max(), ',.0f')} tokens "
            f"({span(flops.min(), flops.max(), '.3g')} training FLOPs")
    text += f" of a {budgets[-1]:.3g} budget)" if len(budgets) else ")"
    text += (f" at d_model {_names([str(w) for w in widths])}: the conclusions hold for this "
             "size and training length, not necessarily at another scale.")
    if len(budgets) > 1:
        text += (f" The verdicts are drawn at the largest of {len(budgets)} budgets "
                 f"({', '.join(f'{b:.2g}' for b in budgets)} FLOPs); \"{SCALING_TITLE}\" "
                 "gives the trend of each effect across them.")
    elif len(budgets):
        text += (" How an effect changes with compute: `dvc exp run --temp -S "
                 "profile=scaling` (four budgets 3x apart).")
    return text


def _between_references(summary: pd.DataFrame, references: pd.DataFrame,
                        dataset: str) -> list[str]:
    """Where each variant's test loss sits among the n-gram references of ``dataset``."""
    refs = references[(references["dataset"] == dataset)
                      & (references["metric"] == "test_loss")]
    losses = _mean(summary, dataset, "test_loss")
    if refs.empty or losses.empty:
        return []
    refs = refs.sort_values("value", ascending=False)
    named = ", ".join(f"{r.reference} {r.value:.3f}" for r in refs.itertuples())
    best = refs.iloc[-1]
    below = [v for v, x in losses.items() if x < best["value"]]
    text = (f"Test loss against n-gram references of this data ({named} nats/char; "
            f"{refs['detail'].iloc[0]}): the variants reach {losses.min():.3f} to "
            f"{losses.max():.3f}. ")
    if len(below) == len(losses):
        margin = best["value"] - losses
        step = refs["value"].iloc[-2] - best["value"] if len(refs) > 1 else math.nan
        text += (f"All {len(losses)} are below the {best['reference']} reference, by "
                 f"{margin.min():.3f} to {margin.max():.3f}")
        text += (f" (the {best['reference']} is {step:.3f} below the "
                 f"{refs['reference'].iloc[-2]})." if math.isfinite(step) else ".")
    else:
        above = [v for v in losses.index if v not in below]
        text += (f"{len(below)} of {len(losses)} are below the {best['reference']} reference; "
                 f"{_names(above)} are not: they have learned no more than "
                 f"{best['reference']} statistics, and a difference among such models says "
                 "little about the feature at a scale where it matters.")
    return [text]


def _tuning_uncertainty(comparisons: pd.DataFrame, tuned: pd.DataFrame,
                        dataset: str) -> list[str]:
    """Each variant's tuning uncertainty (best.json's full-budget bracket, in the unit of the
    tuning objective: nats/char, or nats per answer character on arithmetic) and the
    verdicts it turned "undecided (tuning)" (:func:`~lmablate.report.stats.statistics.
    tuning_check`); nothing for a study without brackets."""
    if tuned is None or tuned.empty or "tuning_uncertainty" not in tuned:
        return []
    t = tuned[(tuned["dataset"] == dataset) & tuned["bracket_state"].notna()]
    if t.empty:
        return []
    values = "; ".join(f"{r.variant} " + ("not measured" if pd.isna(r.tuning_uncertainty)
                                          else f"{r.tuning_uncertainty:.3f}")
                       for r in t.itertuples())
    c = comparisons[(comparisons["dataset"] == dataset)
                    & (comparisons["verdict"] == VERDICT_UNDECIDED_TUNING)]
    objective = str(t["objective"].iloc[0]) if "objective" in t else "val_loss"
    if objective == "val_answer_loss_mean":
        return [f"[Tuning uncertainty](appendix.md#how-the-learning-rate-was-chosen) (in the mean answer "
                f"loss over a run, nats per answer character; no verdict is in that unit, so "
                f"it checks none): {values}."]
    unit, checks = (("nats per answer character", "the answer-loss verdicts")
                    if objective == "val_answer_loss" else ("nats/char", "the test-loss verdicts"))
    text = (f"[Tuning uncertainty](appendix.md#how-the-learning-rate-was-chosen) ({unit}; it checks "
            f"{checks} only): {values}.")
    if len(c):
        text += (" Significant over seeds but within the larger of the two tuning "
                 "uncertainties, so undecided (tuning): " + _names(
                     [f"{r.variant} (Δ {r.mean_diff:+.3f}, uncertainty "
                      f"{r.tuning_uncertainty:.3f})" for r in c.itertuples()]) + ".")
    return [text]


def _flags(comparisons: pd.DataFrame, problems: pd.DataFrame, tuned: pd.DataFrame,
           ablation: pd.DataFrame, summary: pd.DataFrame, references: pd.DataFrame,
           dataset: str) -> list[str]:
    lines = []
    t = tuned[(tuned["dataset"] == dataset) & tuned["on_edge"].fillna("").astype(bool)]
    if len(t):
        # one clause per flag, naming the variants that share it: with six variants at the
        # same edge, one clause per variant was a run-on of six identical phrases
        flags = {}
        for r in t.itertuples():
            for flag in str(r.on_edge).split("; "):
                flags.setdefault(flag, []).append(str(r.variant))
        lines.append("Tuned values on the edge of their search range (the optimum may lie "
                     "outside it): " + "; ".join(f"{flag} for {_names(vs)}"
                                                 for flag, vs in flags.items()) + ".")
    same = comparisons[(comparisons["dataset"] == dataset)
                       & (comparisons["verdict"] == VERDICT_IDENTICAL)]
    if len(same):
        lines.append("Differences identical on every seed (no spread, so no test and no "
                     "verdict): " + "; ".join(
                         f"{r.variant} in {METRICS[r.metric][0]} (Δ = {r.mean_diff:.3g})"
                         for r in same.itertuples()) + ".")
    d = ablation[ablation["dataset"] == dataset]
    base_w = set(d.loc[d["variant"] == BASELINE, "d_model"].dropna().astype(int))
    other = sorted({str(v) for v, w in zip(d["variant"], d["d_model"])
                    if pd.notna(w) and int(w) not in base_w})
    if other and base_w:
        widths = {v: sorted(set(d.loc[d["variant"] == v, "d_model"].astype(int)))
                  for v in other}
        lines.append(f"Trained at another width than the baseline (d_model "
                     f"{_names([str(w) for w in sorted(base_w)])}): " + "; ".join(
                         f"{v} at {_names([str(w) for w in ws])}" for v, ws in widths.items())
                     + ". Equal compute then means different parameter counts and steps, and "
                     "the comparison mixes the feature with the width.")
    elif base_w and d["variant"].nunique() > 1:
        lines.append(f"Every variant trained at the baseline's width (d_model "
                     f"{_names([str(w) for w in sorted(base_w)])}).")
    lines.append(_can_say(comparisons, dataset))
    unbeaten = []
    for metric in ("answer_loss", "exact_match", "char_accuracy"):
        refs = references[(references["dataset"] == dataset) & (references["metric"] == metric)]
        means = _mean(summary, dataset, metric)
        if len(refs) and len(means) and (means.max() <= refs["value"].max() if METRICS[
                metric][2] else means.min() >= refs["value"].min()):
            unbeaten.append(METRICS[metric][0])
    if unbeaten:
        lines.append(f"No variant beats an answer that ignores the question in "
                     f"{_names(unbeaten)}: every verdict in these metrics compares ways of "
                     "guessing, not of computing the answer.")
    return lines


def _can_say(comparisons: pd.DataFrame, dataset: str) -> str:
    """"What it can say": the better and worse verdicts of ``dataset`` in any metric, each not
    checked by a tuning uncertainty labelled so."""
    if not (comparisons["dataset"] == dataset).any():
        return ("What it can say: nothing about a feature, since no variant was compared with "
                "the baseline.")
    called = comparisons[(comparisons["dataset"] == dataset)
                         & comparisons["verdict"].isin([VERDICT_BETTER, VERDICT_WORSE])]
    verdicts = [f"{r.variant} {r.verdict} in {METRICS[r.metric][0]}"
                + ("" if pd.notna(getattr(r, "tuning_uncertainty", math.nan))
                   else " (not checked against tuning)") for r in called.itertuples()]
    return ("What it can say, over training seeds (paired by seed, Holm at family-wise "
            f"α = {ALPHA}): " + (_names(verdicts) + " than the baseline." if verdicts else
                                 "no variant differs from the baseline beyond chance."))


def limits_bullets(cfg_budgets: Mapping[str, Sequence[float]], ablation: pd.DataFrame,
                   summary: pd.DataFrame, comparisons: pd.DataFrame,
                   problems: pd.DataFrame, references: pd.DataFrame,
                   tuned: pd.DataFrame) -> dict[str, list[str]]:
    """The section's sentences: dataset of ``ablation`` (in study order) -> its bullets, each
    one Markdown sentence or more; the template writes the heading and the lists.

    Args:
        cfg_budgets: each dataset's budgets in training FLOPs, increasing
            (:meth:`lmablate.config.study.StudyConfig.budgets`); the verdicts are the last one's.
        ablation, summary, comparisons, tuned: the report's frames
            (:mod:`lmablate.report.collect`, :mod:`lmablate.report.stats.statistics`).
        problems: :func:`~lmablate.report.stats.problems.compare_problems` (may be empty).
        references: columns ``dataset, reference, metric, value, detail`` (the report stage's
            reference table; losses in nats/char, accuracies as fractions).
    """
    out: dict[str, list[str]] = {}
    for ds in present(ablation["dataset"]):
        bullets = [_training(ablation, ds, cfg_budgets.get(ds, ()))]
        bullets += _between_references(summary, references, ds)
        bullets += _tuning_uncertainty(comparisons, tuned, ds)
        bullets += _flags(comparisons, problems, tuned, ablation, summary, references, ds)
        out[ds] = bullets
    return out
