"""Each dataset's headline loss (:func:`headline_loss`), and the DVC metrics and verdicts that
rest on it: ``answer_loss`` (nats per answer character) where a dataset has it, since a whole-line
loss is mostly that of random operands; ``test_loss`` (nats/char) elsewhere. Every verdict asks
this module which loss to speak of, so none can disagree."""

from __future__ import annotations

import math

import pandas as pd

from lmablate.report.collect import BASELINE
from lmablate.report.stats import extrapolation as ex
from lmablate.report.stats.statistics import (ANSWER_LOSS, TEXT_LOSS, VERDICT_BETTER,
                                              VERDICT_WORSE)

# each headline loss -> its validation column in history.csv
VALIDATION_TWIN = {TEXT_LOSS: "val_loss", ANSWER_LOSS: "val_answer_loss"}


def headline_loss(frame: pd.DataFrame, dataset: str) -> str:
    """``"answer_loss"`` if ``dataset`` has one in ``frame`` (long, with a ``metric`` column, or
    wide, the ablation table), else ``"test_loss"``."""
    if frame.empty or "dataset" not in frame:
        return TEXT_LOSS
    d = frame[frame["dataset"] == dataset]
    if "metric" in d.columns:
        has = bool((d["metric"] == ANSWER_LOSS).any())
    else:
        has = ANSWER_LOSS in d.columns and bool(d[ANSWER_LOSS].notna().any())
    return ANSWER_LOSS if has else TEXT_LOSS


def verdict_text(comparisons: pd.DataFrame, dataset: str, metric: str) -> str:
    """``"better: swiglu, rope; worse: alibi"`` (or ``"none better or worse"``): the
    Holm-corrected verdicts of ``comparisons`` of ``dataset`` in ``metric``."""
    c = comparisons[(comparisons["dataset"] == dataset) & (comparisons["metric"] == metric)]
    parts = [f"{word}: {', '.join(map(str, c.loc[c['verdict'] == v, 'variant']))}"
             for word, v in (("better", VERDICT_BETTER), ("worse", VERDICT_WORSE))
             if (c["verdict"] == v).any()]
    return "; ".join(parts) or "none better or worse"


def study_metrics(summary: pd.DataFrame, comparisons: pd.DataFrame,
                  extrapolation: pd.DataFrame | None = None,
                  speed: pd.DataFrame | None = None) -> dict[tuple[str, str], dict]:
    """The DVC metrics per dataset x variant: ``seeds``, mean ``test_loss`` (nats/char), the
    headline loss ``h`` (:func:`headline_loss`) if another, ``delta_<h>`` and ``verdict``
    against the baseline, ``exact_match``, ``tokens_to_learn`` (Kaplan-Meier median training
    tokens to exact match 0.5, from ``speed``) and the test loss at the longest length of
    ``extrapolation`` (``test_loss_x<f>``, "n/a" where the scheme cannot run that long). Few
    columns, so ``dvc metrics show`` fits 200 columns; the rest is in the CSVs."""
    out: dict[tuple[str, str], dict] = {}
    means = summary.set_index(["dataset", "variant", "metric"])
    top = (int(extrapolation["factor"].max())
           if extrapolation is not None and len(extrapolation) else None)
    for (dataset, variant), _ in summary.groupby(["dataset", "variant"], observed=True,
                                                 sort=False):
        if (dataset, variant, TEXT_LOSS) not in means.index:
            continue
        row = means.loc[(dataset, variant, TEXT_LOSS)]
        doc = {"seeds": int(row["n"]), TEXT_LOSS: float(row["mean"])}
        head = headline_loss(summary, dataset)
        if head != TEXT_LOSS and (dataset, variant, head) in means.index:
            doc[head] = float(means.loc[(dataset, variant, head), "mean"])
        c = comparisons[(comparisons["dataset"] == dataset) & (comparisons["metric"] == head)
                        & (comparisons["variant"] == variant)]
        if variant == BASELINE:
            doc.update({f"delta_{head}": 0.0, "verdict": "baseline"})
        elif len(c):
            doc.update({f"delta_{head}": float(c["mean_diff"].iloc[0]),
                        "verdict": str(c["verdict"].iloc[0])})
        if (dataset, variant, "exact_match") in means.index:
            doc["exact_match"] = float(means.loc[(dataset, variant, "exact_match"), "mean"])
        _learning(doc, str(dataset), str(variant), speed)
        if top is not None:
            e = extrapolation[(extrapolation["dataset"] == dataset)
                              & (extrapolation["variant"] == variant)
                              & (extrapolation["factor"] == top)]
            if len(e):
                value = e.iloc[0]["mean"]
                doc[ex.metric_name(top)] = float(value) if pd.notna(value) else "n/a"
        out[(str(dataset), str(variant))] = doc
    return out


def _learning(doc: dict, dataset: str, variant: str, speed: pd.DataFrame | None) -> None:
    """Add :func:`study_metrics`' ``tokens_to_learn`` to ``doc``."""
    t = speed[(speed["dataset"] == dataset) & (speed["variant"] == variant)
              & (speed["threshold"] == 0.5)] if speed is not None and len(speed) else None
    if t is not None and len(t):
        median = float(t["median_tokens"].iloc[0])
        doc["tokens_to_learn"] = median if math.isfinite(median) else "not reached"


def dataset_verdicts(summary: pd.DataFrame, comparisons: pd.DataFrame) -> dict[str, dict]:
    """Per dataset, ``seeds`` and ``verdict`` (:func:`verdict_text` in the headline loss): the
    keys of :func:`study_metrics`, so ``dvc metrics show`` gains a row and no column."""
    out: dict[str, dict] = {}
    for dataset, rows in summary[summary["metric"] == TEXT_LOSS].groupby(
            "dataset", observed=True, sort=False):
        out[str(dataset)] = {"seeds": int(rows["n"].max()), "verdict": verdict_text(
            comparisons, dataset, headline_loss(summary, dataset))}
    return out


def metrics_files(summary: pd.DataFrame, comparisons: pd.DataFrame,
                  extrapolation: pd.DataFrame | None = None,
                  speed: pd.DataFrame | None = None) -> dict[str, dict]:
    """``reports/metrics/`` as relative path -> JSON: ``<dataset>.json``
    (:func:`dataset_verdicts`), then ``<dataset>/<variant>.json`` (:func:`study_metrics`)."""
    docs = {f"{ds}.json": doc for ds, doc in dataset_verdicts(summary, comparisons).items()}
    docs.update({f"{ds}/{var}.json": doc
                 for (ds, var), doc in study_metrics(summary, comparisons, extrapolation,
                                                     speed).items()})
    return docs
