"""What the models wrote, for a dataset's "Samples" and "Predictions": the first generated sample
(text) or the first decoded problems (arithmetic) of each variant's first seed that has any."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

from lmablate.report.collect import RunOutputs
from lmablate.report.stats.success import seed_status
from lmablate.report.text.dataset_tables import Rows
from lmablate.report.text.mdtable import code_span

MAX_CHARS = 300  # of a generated sample shown
N_PREDICTIONS = 3  # decoded problems shown per variant


@dataclass(frozen=True)
class Shown:
    """One variant's sample or predictions: ``variant``, the seed key (``seed_<n>``), for
    predictions whether that seed learned the task (``status``, "" if unknown), and ``text``
    (at most :data:`MAX_CHARS` characters) or ``rows`` (prompt, target, prediction, ✓/✗)."""

    variant: str
    key: str
    status: str = ""
    text: str = ""
    rows: Rows | None = None


def _first(outputs: Mapping[tuple[str, str], Mapping[str, Any]], dataset: str,
           order: Sequence[str], seeds: Sequence[int]) -> Iterator[tuple[str, str, Any]]:
    """(variant, seed key, outputs) of each variant's configured seed first in ``seeds`` with
    any output, else its first key in sort order with some."""
    for variant in order:
        by_seed = outputs.get((dataset, variant)) or {}
        keys = [k for k in by_seed if by_seed[k]]
        key = ([f"seed_{s}" for s in seeds if f"seed_{s}" in keys] or sorted(keys) or [None])[0]
        if key is not None:
            yield variant, key, by_seed[key]


def samples(runs: RunOutputs, dataset: str, order: Sequence[str],
            seeds: Sequence[int]) -> list[Shown]:
    """The first generated sample of each variant of ``dataset`` (in ``order``) that has one."""
    return [Shown(v, key, text=str(out[0])[:MAX_CHARS])
            for v, key, out in _first(runs.samples, dataset, order, seeds)]


def has_samples(runs: RunOutputs, dataset: str, order: Sequence[str]) -> bool:
    """Whether any variant of ``dataset`` has a samples file (possibly empty)."""
    return any((dataset, v) in runs.samples for v in order)


def has_predictions(runs: RunOutputs, dataset: str, order: Sequence[str]) -> bool:
    """Whether any variant of ``dataset`` has a predictions file (possibly empty)."""
    return any((dataset, v) in runs.predictions for v in order)


def predictions(runs: RunOutputs, dataset: str, order: Sequence[str],
                seeds: Sequence[int]) -> list[Shown]:
    """The first :data:`N_PREDICTIONS` greedy-decoded test problems of each variant of
    ``dataset`` that has any, with whether that seed learned the task
    (:func:`~lmablate.report.stats.success.seed_status`)."""
    shown = []
    for variant, key, out in _first(runs.predictions, dataset, order, seeds):
        last = key.rsplit("_", 1)[-1]
        status = seed_status(runs.ablation, dataset, variant, int(last)) if last.isdigit() else None
        shown.append(Shown(variant, key, status or "", rows=[
            {"prompt": code_span(p.get("prompt", "")), "target": code_span(p.get("target", "")),
             "prediction": code_span(p.get("prediction", "")),
             "correct": "✓" if p.get("prediction") == p.get("target") else "✗"}
            for p in out[:N_PREDICTIONS]]))
    return shown
