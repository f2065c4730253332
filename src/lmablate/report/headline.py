"""Each dataset's headline loss, and the study-level verdicts and DVC metrics that rest on it.

The headline loss is the one loss a dataset's verdict is stated in (:func:`headline_loss`):

* ``answer_loss`` where the dataset has it (arithmetic): the teacher-forced loss on the answer
  characters given the question, in nats per answer character, closing ``$`` included. A
  whole-line loss is mostly the loss of predicting random operands, which no model can learn
  and which dilutes any difference in how well the answer is computed;
* ``test_loss`` elsewhere (text corpora): the whole-text loss in nats/char.

The DVC metrics (:func:`study_metrics`, :func:`dataset_verdicts`), the report's verdict
sentences (:mod:`lmablate.report.text.arithmetic_section`) and "What this study can and cannot say"
(:mod:`lmablate.report.text.limits`) all ask this module which loss to speak of, so they cannot
disagree.
"""

from __future__ import annotations

import math

import pandas as pd

from lmablate.report.collect import BASELINE
from lmablate.report.stats import extrapolation as ex
from lmablate.report.stats.statistics import (ANSWER_LOSS, TEXT_LOSS, VERDICT_BETTER,
                                              VERDICT_WORSE)

# each headline loss -> the column of history.csv that measures it on the validation split
# during training (the curves of :func:`lmablate.report.figures.losses.plot_val_loss_curves`)
VALIDATION_TWIN = {TEXT_LOSS: "val_loss", ANSWER_LOSS: "val_answer_loss"}



def headline_loss(frame: pd.DataFrame, dataset: str) -> str:
    """``"answer_loss"`` if ``dataset`` has an answer loss in ``frame``, else ``"test_loss"``.

    ``frame`` is either long, with a ``metric`` column (the summary or the comparisons of
    :mod:`lmablate.report.stats.statistics`: a row of metric ``answer_loss`` for ``dataset``), or
    wide, one column per metric (the ablation table: a non-missing ``answer_loss`` of
    ``dataset``). An empty frame, or one without the dataset, gives ``"test_loss"``.
    """
    if frame.empty or "dataset" not in frame:
        return TEXT_LOSS
    d = frame[frame["dataset"] == dataset]
    if "metric" in d.columns:
        has = bool((d["metric"] == ANSWER_LOSS).any())
    else:
        has = ANSWER_LOSS in d.columns and bool(d[ANSWER_LOSS].notna().any())
    return ANSWER_LOSS if has else TEXT_LOSS


def verdict_text(comparisons: pd.DataFrame, dataset: str, metric: str) -> str:
    """Which variants of ``dataset`` were better and which worse than the baseline in
    ``metric`` (Holm-corrected verdicts of ``comparisons``), in its row order, e.g.
    ``"better: swiglu, rope; worse: alibi"``, or ``"none better or worse"``."""
    c = comparisons[(comparisons["dataset"] == dataset) & (comparisons["metric"] == metric)]
    parts = [f"{word}: {', '.join(map(str, c.loc[c['verdict'] == v, 'variant']))}"
             for word, v in (("better", VERDICT_BETTER), ("worse", VERDICT_WORSE))
             if (c["verdict"] == v).any()]
    return "; ".join(parts) or "none better or worse"


def study_metrics(summary: pd.DataFrame, comparisons: pd.DataFrame,
                  extrapolation: pd.DataFrame | None = None,
                  speed: pd.DataFrame | None = None) -> dict[tuple[str, str], dict]:
    """The study-level DVC metrics, one small dict per dataset x variant.

    Every row: ``seeds``, the mean ``test_loss`` (nats/char). Then, for the dataset's
    headline loss ``h`` (:func:`headline_loss`): on an arithmetic dataset the mean
    ``answer_loss`` (nats per answer character); ``delta_<h>``, the mean paired difference to
    the baseline's, and ``verdict``, the Holm-corrected verdict in ``h`` (the baseline's are 0
    and ``"baseline"``). Then the mean ``exact_match`` (arithmetic, a fraction), and the mean
    test loss at the longest length of ``extrapolation``
    (:func:`lmablate.report.stats.extrapolation.extrapolation_table`) as ``test_loss_x<f>``,
    "n/a" where the position scheme cannot run that long. On arithmetic, from ``speed``
    (``learning_speed.csv``) ``tokens_to_learn``, the Kaplan-Meier median training tokens to an
    exact match of 0.5 ("not reached" where fewer than half the seeds got there): one column,
    so that ``dvc metrics show`` still fits a 200-column terminal; the seeds learned and the
    paired comparison are in ``success.csv`` and ``learning_speed_comparisons.csv``.

    So a Shakespeare row is ``{seeds, test_loss, delta_test_loss, verdict, exact_match?,
    test_loss_x<f>?}`` and an arithmetic row ``{seeds, test_loss, answer_loss,
    delta_answer_loss, verdict, exact_match, ...}``. What ``dvc metrics show`` and ``dvc exp
    show`` list; the per-seed and per-operation values stay in ``runs/`` and the CSVs.
    """
    out: dict[tuple[str, str], dict] = {}
    means = summary.set_index(["dataset", "variant", "metric"])
    # the longest length measured: its loss is the extrapolation metric
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
    """Add :func:`study_metrics`' ``tokens_to_learn`` of ``dataset`` x ``variant`` to ``doc``
    (``speed``: ``learning_speed.csv``)."""
    t = speed[(speed["dataset"] == dataset) & (speed["variant"] == variant)
              & (speed["threshold"] == 0.5)] if speed is not None and len(speed) else None
    if t is not None and len(t):
        median = float(t["median_tokens"].iloc[0])
        doc["tokens_to_learn"] = median if math.isfinite(median) else "not reached"


def dataset_verdicts(summary: pd.DataFrame, comparisons: pd.DataFrame) -> dict[str, dict]:
    """One study-level DVC metrics row per dataset: the seeds and, in the column the variants'
    rows call ``verdict``, which variants were better and which worse than the baseline in the
    dataset's headline loss (:func:`headline_loss`; Holm-corrected, as in
    ``comparisons.csv``), in study order (:func:`verdict_text`), e.g.
    ``"better: swiglu, rope; worse: alibi"``, or ``"none better or worse"``.

    The keys are those of :func:`study_metrics`, so ``dvc metrics show`` gains a row per dataset
    and no column; ``dvc exp show --keep '...<dataset>.json:verdict'`` then lists, per
    experiment, the study's answer in one short column per dataset (DVC names a column
    ``path:key`` when the key is in several files)."""
    out: dict[str, dict] = {}
    for dataset, rows in summary[summary["metric"] == TEXT_LOSS].groupby(
            "dataset", observed=True, sort=False):
        out[str(dataset)] = {"seeds": int(rows["n"].max()), "verdict": verdict_text(
            comparisons, dataset, headline_loss(summary, dataset))}
    return out


def metrics_files(summary: pd.DataFrame, comparisons: pd.DataFrame,
                  extrapolation: pd.DataFrame | None = None,
                  speed: pd.DataFrame | None = None) -> dict[str, dict]:
    """The DVC metrics directory (``reports/metrics/``) as relative path -> JSON document:
    ``<dataset>.json`` each dataset's verdicts (:func:`dataset_verdicts`), then
    ``<dataset>/<variant>.json`` each dataset x variant's metrics (:func:`study_metrics`). One
    file each, so ``dvc metrics show`` lists one row each."""
    docs = {f"{ds}.json": doc for ds, doc in dataset_verdicts(summary, comparisons).items()}
    docs.update({f"{ds}/{var}.json": doc
                 for (ds, var), doc in study_metrics(summary, comparisons, extrapolation,
                                                     speed).items()})
    return docs
