"""An arithmetic dataset's text: the headline against its floors (:func:`headline_lines`), the
answer loss by operation and answer length (:func:`breakdown_lines`) and length generalisation
(:func:`length_lines`), from :mod:`lmablate.report.stats.arithmetic_tables`' tables. Answer loss
in nats per answer character (closing ``$`` included), accuracies as fractions, lengths in digits.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from lmablate.report.collect import BASELINE
from lmablate.report.headline import ANSWER_LOSS, headline_loss, verdict_text
from lmablate.report.stats.arithmetic_tables import FLOORS, MIN_BUCKET_PROBLEMS, digits_label
from lmablate.report.stats.statistics import CONFIDENCE, METRICS, fraction_bounds
from lmablate.report.text.mdtable import (delta_cell as _delta_cell, md_table as _md_table,
                                          num as _num)
from lmablate.report.text.templating import macro_text

ARITHMETIC = "_arithmetic.md.j2"  # the sentences of an arithmetic dataset's sections


def _interval_cell(mean: float, low: float, high: float, metric: str) -> str:
    """``mean ± CI half-width``; ``mean [low, high]`` for a fraction, whose interval is clipped
    to [0, 1] (:func:`~lmablate.report.stats.statistics.fraction_bounds`)."""
    if fraction_bounds(metric) is not None:
        return f"{_num(mean)} [{_num(low)}, {_num(high)}]"
    return f"{_num(mean)} ± {_num((high - low) / 2)}"


def _cell(summary: pd.DataFrame, variant: str, metric: str) -> str:
    s = summary[(summary["variant"] == variant) & (summary["metric"] == metric)]
    if s.empty:
        return "–"
    r = s.iloc[0]
    if not np.isfinite(r["ci95_low"]):
        return f"{_num(r['mean'])} (no CI, n={int(r['n'])})"
    return _interval_cell(r["mean"], r["ci95_low"], r["ci95_high"], metric)


def headline_metrics(summary: pd.DataFrame, dataset: str) -> list[str]:
    """The metrics of an arithmetic dataset's headline table: its headline loss
    (:func:`~lmablate.report.headline.headline_loss`), exact match and character accuracy."""
    return [headline_loss(summary, dataset), "exact_match", "char_accuracy"]


def headline_lines(summary: pd.DataFrame, comparisons: pd.DataFrame,
                   references: pd.DataFrame, dataset: str, order: Sequence[str]) -> list[str]:
    """The lines below "Headline": a table of :func:`headline_metrics` per variant (mean ± CI
    half-width over seeds) with the floors of :data:`~lmablate.report.stats.arithmetic_tables.
    FLOORS` as italic rows, which variants beat them, and the verdicts in the headline loss;
    none without summary rows."""
    s = summary[summary["dataset"] == dataset]
    if s.empty:
        return []
    metrics = headline_metrics(s, dataset)
    loss = metrics[0]
    heads = {m: f"{METRICS[m][0]} ({METRICS[m][1]})" for m in metrics}
    rows = [{"variant": v, "seeds": int(s.loc[s["variant"] == v, "n"].max()),
             **{heads[m]: _cell(s, v, m) for m in metrics}}
            for v in order if (s["variant"] == v).any()]
    r = references[references["dataset"] == dataset] if len(references) else references
    floors = {}
    for m in metrics:
        f = r[(r["metric"] == m) & (r["reference"] == FLOORS.get(m))] if len(r) else r
        if len(f):
            floors[m] = float(f["value"].iloc[0])
            rows.append({"variant": f"_floor: {FLOORS[m]}_", "seeds": "–",
                         **{heads[k]: _num(floors[m]) if k == m else "–" for k in metrics}})
    return [macro_text(ARITHMETIC, "headline_intro", label=METRICS[loss][0],
                       unit=METRICS[loss][1], answer_loss=loss == ANSWER_LOSS,
                       confidence=CONFIDENCE), "", _md_table(pd.DataFrame(rows)), "",
            macro_text(ARITHMETIC, "floors", groups=_beaten(s, rows, floors),
                       floors=[(METRICS[m][0], not METRICS[m][2], x) for m, x in floors.items()]),
            "", macro_text(ARITHMETIC, "headline_verdicts", label=METRICS[loss][0],
                           verdicts=verdict_text(comparisons, dataset, loss)), ""]


def _beaten(summary: pd.DataFrame, rows: Sequence[dict],
            floors: dict[str, float]) -> list[tuple[str, list[str]]]:
    """The variants of ``rows`` that beat every floor, some (named) or none, on the mean."""
    means = summary.set_index(["variant", "metric"])["mean"]

    def beats(v: str, m: str) -> bool:
        x = float(means.loc[(v, m)])
        return x > floors[m] if METRICS[m][2] else x < floors[m]
    beaten = {v: [m for m in floors if (v, m) in means.index and beats(v, m)]
              for v in (x["variant"] for x in rows if x["seeds"] != "–")}
    groups = {"every floor": [v for v, b in beaten.items() if len(b) == len(floors)],
              "some": [f"{v} ({', '.join(METRICS[m][0] for m in b)})"
                       for v, b in beaten.items() if 0 < len(b) < len(floors)],
              "none": [v for v, b in beaten.items() if not b]}
    return [(k, g) for k, g in groups.items() if g]


def breakdown_lines(per_op: pd.DataFrame, by_answer: pd.DataFrame, dataset: str,
                    order: Sequence[str]) -> list[str]:
    """The answer loss of each variant per operation and per answer length (digits of its
    integer part), the mean over seeds of :attr:`~lmablate.report.collect.RunOutputs.per_op`
    and ``by_answer_digits``; each heading gives its problems per seed (the fewest of any
    seed), † below ``MIN_BUCKET_PROBLEMS``. No lines without an answer loss."""
    parts = []
    for frame, key, label in ((per_op, "op", "{}"), (by_answer, "digits", "{}-digit answers")):
        f = frame[frame["dataset"] == dataset] if len(frame) else frame
        if len(f) and ANSWER_LOSS in f and f[ANSWER_LOSS].notna().any():
            wide = f.pivot_table(index="variant", columns=key, values=ANSWER_LOSS,
                                 aggfunc="mean", observed=True)
            # each bucket's problems per seed (the fewest of any seed), † when few
            counts = (pd.to_numeric(f["n"], errors="coerce").groupby(f[key].astype(str)).min()
                      if "n" in f else pd.Series(dtype=float))

            def head(c, label=label, counts=counts):
                n = counts.get(str(c))
                return label.format(c) + ("" if n is None or pd.isna(n) else
                                          f" ({int(n)}{' †' if n < MIN_BUCKET_PROBLEMS else ''})")
            parts.append(wide.rename(columns=head))
    if not parts:
        return []
    table = pd.concat(parts, axis=1)
    rows = [{"variant": v, **{c: _num(table.loc[v, c]) for c in table.columns}}
            for v in order if v in table.index]
    few = any("†" in str(c) for c in table.columns)
    return [macro_text(ARITHMETIC, "breakdown_intro", unit=METRICS[ANSWER_LOSS][1], few=few,
                       minimum=MIN_BUCKET_PROBLEMS), "", _md_table(pd.DataFrame(rows)), ""]


def _length_cells(tv: pd.DataFrame, cv: pd.DataFrame, lengths: Sequence[int],
                  heading) -> dict[str, str]:
    """One variant's cells: exact match at each length (``tv``), then Δ to the baseline."""
    row = {}
    for n in lengths:
        r = tv[tv["digits"] == n]
        r = r.iloc[0] if len(r) else None
        row[heading(n)] = "–" if r is None else str(r["note"]) if r["note"] else (
            _interval_cell(r["mean"], r["ci95_low"], r["ci95_high"], "exact_match")
            if pd.notna(r["ci95_low"]) else _num(r["mean"]))
    for n in lengths:
        d = cv[cv["digits"] == n] if len(cv) else cv
        row[f"Δ vs {BASELINE} at {n}"] = _delta_cell(d.iloc[0]) if len(d) else "–"
    return row


def length_lines(table: pd.DataFrame, comparisons: pd.DataFrame, dataset: str,
                 digits: int | None, order: Sequence[str]) -> list[str]:
    """The lines of "Length generalisation": the split, the exact match per variant x operand
    length (:func:`~lmablate.report.stats.arithmetic_tables.length_table`) and Δ to the
    baseline with its Holm verdict (:func:`~lmablate.report.stats.arithmetic_tables.
    length_comparisons`); none without a length table."""
    t = table[table["dataset"] == dataset] if len(table) else table
    if t.empty:
        return []
    c = comparisons[comparisons["dataset"] == dataset] if len(comparisons) else comparisons
    lengths = sorted(int(x) for x in t["digits"].unique())
    split = {int(r.digits): r.split for r in t.itertuples() if r.split}
    problems = t.dropna(subset=["n_problems"]).groupby("digits")["n_problems"].min()
    few = [n for n in lengths if n in problems.index and problems[n] < MIN_BUCKET_PROBLEMS]

    def heading(n: int) -> str:
        what = [split[n]] if n in split else []
        if n in problems.index:
            what.append(f"{int(problems[n])} problems" + (" †" if n in few else ""))
        return digits_label(n) + (f" ({', '.join(what)})" if what else "")

    rows = [{"variant": v, **_length_cells(t[t["variant"] == v],
                                           c[c["variant"] == v] if len(c) else c, lengths,
                                           heading)}
            for v in order if (t["variant"] == v).any()]
    lines = [macro_text(ARITHMETIC, "length_intro", digits=digits, baseline=BASELINE,
                        confidence=CONFIDENCE), "", _md_table(pd.DataFrame(rows)), ""]
    if few:
        lines += [macro_text(ARITHMETIC, "few_problems", minimum=MIN_BUCKET_PROBLEMS,
                             labels=[digits_label(n) for n in few]), ""]
    return lines
