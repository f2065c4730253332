"""The arithmetic part of the report: the headline, the floors and length generalisation.

* **Floors** (:func:`answer_references`): what answers that ignore the question score on the
  evaluated test problems: the constant answers of :mod:`lmablate.report.stats.reference_models`
  (character accuracy, exact match) and the answer-position floor
  (:func:`lmablate.report.stats.reference_models.answer_position_floor`, answer loss) from the
  answers of the train split (:func:`train_answers`).
* **Headline** (:func:`headline_lines`): first in an arithmetic dataset's section, the answer
  loss (:func:`lmablate.report.headline.headline_loss`) and exact match of every variant
  beside those floors, and which variants beat them.
* **Figures** in :mod:`lmablate.report.figures.arithmetic_figures`: by operation (exact match or
  character accuracy per operation and variant, beside the floor) and by operand length.
* **Length generalisation** (:func:`length_table`, :func:`length_comparisons`,
  :func:`length_lines`): exact match by operand length
  (digits of the longer operand), up to the training ``digits`` on the in-distribution test
  problems and past them on the length split (problems longer than any seen in training;
  Kazemnejad et al. 2023, "The impact of positional encoding on length generalization in
  transformers"), each variant against the baseline at each length, paired by seed
  (:func:`lmablate.report.stats.statistics.compare`: paired t-test, Holm over the variants of a
  dataset x length).

Units: answer loss in nats per answer character (closing ``$`` included), accuracies as
fractions in [0, 1], lengths in digits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from lmablate.data.arithmetic import split_problem
from lmablate.data.tokenizer import split_lines
from lmablate.report.collect import BASELINE, present
from lmablate.report.headline import ANSWER_LOSS, headline_loss, verdict_text
from lmablate.report.run_files import maybe_int
from lmablate.report.stats import reference_models as refs
from lmablate.report.stats.statistics import (CONFIDENCE, COMPARISON_COLUMNS, METRICS, compare,
                                          fraction_bounds, summarise)
from lmablate.report.text.mdtable import (delta_cell as _delta_cell, md_table as _md_table,
                                          num as _num)

ANSWER_FLOOR = "answer ignoring the question"  # the reference name of the answer-loss floor
# metric -> the reference that is its floor in the headline table
FLOORS = {ANSWER_LOSS: ANSWER_FLOOR, "exact_match": "most frequent answer",
          "char_accuracy": "best constant answer"}
LENGTH_COLUMNS = ["dataset", "variant", "digits", "split", "n_seeds", "n_problems", "mean",
                  "ci95_low", "ci95_high", "note"]
# a bucket of fewer test problems per seed than this is marked: one problem is over 3% of it
MIN_BUCKET_PROBLEMS = 30
LENGTH_COMPARISON_COLUMNS = [*COMPARISON_COLUMNS[:2], "digits", "split",
                             *COMPARISON_COLUMNS[2:]]


# ---------------------------------------------------------------------------------------------
# Floors
# ---------------------------------------------------------------------------------------------

def train_answers(tokens_dir: Path) -> list[str]:
    """The answers (targets, :func:`lmablate.data.arithmetic.split_problem`) of the train split's
    problems under ``tokens_dir`` (one dataset's ``data/tokens/<dataset>/``), cut by
    :func:`lmablate.data.tokenizer.split_lines`. Empty when meta.json has no ``line_length``
    (tokens written before it was recorded).

    Raises:
        FileNotFoundError / TokenizerError: the tokenizer or train split is missing or bad.
        DataError: a cut piece is not a problem, or the split is not a whole number of
            ``line_length`` problems (``line_length`` does not describe this split).
    """
    return [split_problem(line)[1] for line in split_lines(tokens_dir, "train")]


def answer_references(dataset: str, tokens_dir: Path, targets: Sequence[str]) -> list[dict]:
    """The reference rows (``dataset, reference, metric, value, detail``) of an arithmetic
    dataset, scored on the evaluated test answers ``targets`` (reversed, closing ``$``
    included): all zeros (char accuracy, exact match), the best constant answer (char
    accuracy), the most frequent answer (exact match), ``detail`` the answer as written; and
    :data:`ANSWER_FLOOR` (``answer_loss``, nats per answer character,
    :func:`lmablate.report.stats.reference_models.answer_position_floor` of :func:`train_answers`),
    left out when the train split's problems cannot be cut (no ``line_length``).

    Raises:
        ValueError: ``targets`` empty or of unequal lengths, or of another length than the
            train answers. Also those of :func:`train_answers`.
    """
    targets = [str(t) for t in targets]
    answers = [("all zeros", refs.constant_answer_scores(
                    targets, refs.all_zeros_answer(len(targets[0]))),
                ("char_accuracy", "exact_match")),
               ("best constant answer", refs.best_constant_answer(targets), ("char_accuracy",)),
               ("most frequent answer", refs.most_frequent_answer(targets), ("exact_match",))]
    rows = [{"dataset": dataset, "reference": name, "metric": metric,
             "value": score[metric], "detail": f"`{score['answer']}`"}
            for name, score, metrics in answers for metric in metrics]
    train = train_answers(Path(tokens_dir))
    if train:
        rows.append({"dataset": dataset, "reference": ANSWER_FLOOR, "metric": ANSWER_LOSS,
                     "value": refs.answer_position_floor(train, targets),
                     "detail": refs.ANSWER_SMOOTHING})
    return rows


# ---------------------------------------------------------------------------------------------
# Length generalisation
# ---------------------------------------------------------------------------------------------

def _metric(digits: int) -> str:
    return f"exact_match_d{digits}"


def _wide(by_digits: pd.DataFrame) -> tuple[pd.DataFrame, dict[int, str]]:
    """Seeds as rows (dataset, variant, seed), one ``exact_match_d<n>`` column per length."""
    lengths = sorted(int(d) for d in by_digits["digits"].dropna().unique())
    wide = by_digits.pivot_table(index=["dataset", "variant", "seed"], columns="digits",
                                 values="exact_match", aggfunc="first", observed=True,
                                 dropna=False).reindex(columns=lengths).reset_index()
    wide.columns = ["dataset", "variant", "seed", *(_metric(int(d)) for d in lengths)]
    return wide, {d: _metric(d) for d in lengths}


def _splits(by_digits: pd.DataFrame) -> dict[tuple[str, int], str]:
    """(dataset, digits) -> the split its results come from ("test" or "length")."""
    s = by_digits.dropna(subset=["split"])
    s = s[s["split"].astype(str) != ""]
    return {(str(r.dataset), int(r.digits)): str(r.split) for r in s.itertuples()}


def length_table(by_digits: pd.DataFrame) -> pd.DataFrame:
    """Exact match by operand length per dataset x variant x digits: the mean over seeds and
    its :data:`~lmablate.report.stats.statistics.CONFIDENCE` Student-t interval
    (:func:`~lmablate.report.stats.statistics.summarise`, fractions), ``n_seeds`` with a value,
    ``n_problems`` each seed was scored on (the fewest of its seeds), the ``split`` the problems
    come from ("test" up to the training digits, "length" past
    them), and where the model cannot run that long, NaNs with the reason in ``note`` ("n/a
    (learned table of 64 positions)").

    Args:
        by_digits: :attr:`~lmablate.report.collect.RunOutputs.by_operand_digits`.

    Returns:
        Columns :data:`LENGTH_COLUMNS`, rows by dataset and variant (study order), then digits.
    """
    if by_digits.empty:
        return pd.DataFrame(columns=LENGTH_COLUMNS)
    wide, metrics = _wide(by_digits)
    summary = summarise(wide, list(metrics.values())).set_index(
        ["dataset", "variant", "metric"])
    splits = _splits(by_digits)
    rows = []
    for (ds, var, digits), g in by_digits.groupby(["dataset", "variant", "digits"],
                                                  observed=True, sort=True):
        notes = sorted(set(g["note"].dropna().astype(str)) - {""})
        counts = pd.to_numeric(g["n"], errors="coerce").dropna() if "n" in g else []
        row = {"dataset": ds, "variant": var, "digits": int(digits),
               "split": splits.get((str(ds), int(digits)), ""), "n_seeds": 0,
               "n_problems": int(counts.min()) if len(counts) else None,
               "note": "; ".join(notes)}
        key = (ds, var, metrics[int(digits)])
        if key in summary.index:
            s = summary.loc[key]
            row.update(n_seeds=s["n"], mean=s["mean"], ci95_low=s["ci95_low"],
                       ci95_high=s["ci95_high"])
        rows.append(row)
    table = pd.DataFrame(rows, columns=LENGTH_COLUMNS)
    for col in ("digits", "n_seeds", "n_problems"):
        table[col] = maybe_int(table[col])
    return table


def length_comparisons(by_digits: pd.DataFrame, baseline: str = BASELINE) -> pd.DataFrame:
    """Every variant against ``baseline`` in exact match at each operand length, paired by seed,
    Holm within each dataset x length: the columns of
    :func:`~lmablate.report.stats.statistics.compare` (``metric`` = ``exact_match_d<n>``,
    differences as fractions) with ``digits`` and ``split``. A length where the baseline or a
    variant has no values (a learned table that cannot reach it) has no row for it.

    Returns:
        Columns :data:`LENGTH_COMPARISON_COLUMNS`, by dataset, then digits, then variant.
    """
    if by_digits.empty:
        return pd.DataFrame(columns=LENGTH_COMPARISON_COLUMNS)
    wide, metrics = _wide(by_digits)
    splits = _splits(by_digits)
    frames = []
    for ds in present(wide["dataset"]):
        d = wide[wide["dataset"] == ds]
        for digits, metric in metrics.items():  # each length one Holm family
            c = compare(d[["dataset", "variant", "seed", metric]].rename(
                columns={metric: "exact_match"}), baseline=baseline, metrics=["exact_match"])
            c = c[c["n_pairs"] > 0]
            frames.append(c.assign(metric=metric, digits=digits,
                                   split=splits.get((ds, digits), "")))
    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame(columns=LENGTH_COMPARISON_COLUMNS)
    return pd.concat(frames, ignore_index=True)[LENGTH_COMPARISON_COLUMNS]


def training_digits(dataset_cfg: Any, by_digits: pd.DataFrame, dataset: str) -> int | None:
    """The most operand digits of ``dataset``'s training problems: the config's ``digits``
    when it has one, else the longest length whose results come from the test split; None
    when neither is known."""
    digits = getattr(dataset_cfg, "digits", None)
    if digits is not None:
        return int(digits)
    d = by_digits[(by_digits["dataset"] == dataset) & (by_digits["split"] == "test")] \
        if len(by_digits) else by_digits
    return int(d["digits"].max()) if len(d) else None


def unreachable(by_digits: pd.DataFrame, dataset: str) -> list[str]:
    """``"<variant> at <n> digits, <note>"`` for each variant x length of ``dataset`` without
    results, in study order: what the length figure leaves out."""
    d = by_digits[by_digits["dataset"] == dataset] if len(by_digits) else by_digits
    d = d[d["exact_match"].isna() & (d["note"].fillna("").astype(str) != "")]
    seen = d.drop_duplicates(["variant", "digits"]).sort_values(["variant", "digits"],
                                                                kind="stable")
    return [f"{r.variant} at {_digits_label(int(r.digits))}, {r.note}"
            for r in seen.itertuples()]


def _digits_label(n: int) -> str:
    return f"{n} digit" + ("" if n == 1 else "s")


# ---------------------------------------------------------------------------------------------
# Markdown
# ---------------------------------------------------------------------------------------------

def _interval_cell(mean: float, low: float, high: float, metric: str) -> str:
    """``mean ± CI half-width``; for a fraction (:func:`~lmablate.report.stats.statistics.
    fraction_bounds`), whose interval is clipped to [0, 1] and so may be lopsided,
    ``mean [low, high]``."""
    if fraction_bounds(metric) is not None:
        return f"{_num(mean)} [{_num(low)}, {_num(high)}]"
    return f"{_num(mean)} ± {_num((high - low) / 2)}"


def _cell(summary: pd.DataFrame, variant: str, metric: str) -> str:
    """:func:`_interval_cell` of ``metric`` for ``variant`` in ``summary`` (one dataset)."""
    s = summary[(summary["variant"] == variant) & (summary["metric"] == metric)]
    if s.empty:
        return "–"
    r = s.iloc[0]
    if not np.isfinite(r["ci95_low"]):
        return f"{_num(r['mean'])} (no CI, n={int(r['n'])})"
    return _interval_cell(r["mean"], r["ci95_low"], r["ci95_high"], metric)


def _beats(mean: float, floor: float, metric: str) -> bool:
    return mean < floor if not METRICS[metric][2] else mean > floor


def headline_lines(summary: pd.DataFrame, comparisons: pd.DataFrame,
                   references: pd.DataFrame, dataset: str, order: Sequence[str]) -> list[str]:
    """The headline block of an arithmetic dataset's section: a table of the headline loss
    (:func:`~lmablate.report.headline.headline_loss`), exact match and character accuracy
    per variant (mean ± CI half-width over seeds) with the floors of :data:`FLOORS` as italic
    rows, one sentence naming the variants that beat the floors, and the verdicts in the
    headline loss; below the heading "Headline" (the report template's). No lines when
    ``dataset`` has no summary rows."""
    s = summary[summary["dataset"] == dataset]
    if s.empty:
        return []
    loss = headline_loss(s, dataset)
    metrics = [loss, "exact_match", "char_accuracy"]
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
    what = ("teacher-forced, on the answer characters given the question, closing `$` "
            "included" if loss == ANSWER_LOSS else "on whole problems: these runs have no "
            "answer loss")
    lines = [f"{METRICS[loss][0].capitalize()} ({METRICS[loss][1]}; the loss this dataset's "
             f"verdicts are stated in: {what}), exact match and character accuracy of the "
             f"greedy-decoded answers: mean ± {CONFIDENCE:.0%} CI half-width over seeds "
             "(for the fractions, mean [the interval, clipped to 0 and 1]). "
             "Italic rows are floors: answers that ignore the question.", "",
             _md_table(pd.DataFrame(rows)), ""]
    if floors:
        means = s.set_index(["variant", "metric"])["mean"]
        beaten = {v: [m for m in floors if (v, m) in means.index
                      and _beats(float(means.loc[(v, m)]), floors[m], m)]
                  for v in (x["variant"] for x in rows if x["seeds"] != "–")}
        groups = {"every floor": [v for v, b in beaten.items() if len(b) == len(floors)],
                  "some": [f"{v} ({', '.join(METRICS[m][0] for m in b)})"
                           for v, b in beaten.items() if 0 < len(b) < len(floors)],
                  "none": [v for v, b in beaten.items() if not b]}
        parts = [f"beat {k}: {', '.join(g)}" for k, g in groups.items() if g]
        lines += ["Against the floors (" + ", ".join(
            f"{METRICS[m][0]} {'below' if not METRICS[m][2] else 'above'} {_num(x)}"
            for m, x in floors.items()) + "), on the mean over seeds: "
            + "; ".join(parts) + ".", ""]
    else:
        lines += ["No floors: they need the tokenized data, not given to this report.", ""]
    lines += [f"In {METRICS[loss][0]} against the baseline (paired by seed, Holm-corrected): "
              f"{verdict_text(comparisons, dataset, loss)}.", ""]
    return lines


def breakdown_lines(per_op: pd.DataFrame, by_answer: pd.DataFrame, dataset: str,
                    order: Sequence[str]) -> list[str]:
    """The answer loss (nats per answer character) of each variant of ``dataset`` per
    operation and per answer length (digits of the answer's integer part): the mean over
    seeds of :attr:`~lmablate.report.collect.RunOutputs.per_op` and ``by_answer_digits``,
    one row per variant; each column heading gives its problems per seed (the fewest of any
    seed), marked † below :data:`MIN_BUCKET_PROBLEMS`. No lines when neither frame has an
    answer loss for ``dataset``."""
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
    return [f"Answer loss ({METRICS[ANSWER_LOSS][1]}, mean over seeds) by operation and by "
            "answer length (in brackets: test problems per seed"
            + (f"; † fewer than {MIN_BUCKET_PROBLEMS}, a rough indication only" if few else "")
            + "):", "", _md_table(pd.DataFrame(rows)), ""]


def length_lines(table: pd.DataFrame, comparisons: pd.DataFrame, dataset: str,
                 digits: int | None, order: Sequence[str]) -> list[str]:
    """"Length generalisation", below its heading and above its figure (both the report
    template's): what the split is, the exact match per variant x operand length
    (:func:`length_table`: mean ± CI half-width, or the reason there is none) and the
    difference to the baseline at each length with its Holm verdict
    (:func:`length_comparisons`). No lines without a length table for ``dataset``."""
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
        return _digits_label(n) + (f" ({', '.join(what)})" if what else "")

    rows = []
    for v in order:
        tv = t[t["variant"] == v]
        if tv.empty:
            continue
        row = {"variant": v}
        for n in lengths:
            r = tv[tv["digits"] == n]
            head = heading(n)
            if r.empty:
                row[head] = "–"
            elif r.iloc[0]["note"]:
                row[head] = str(r.iloc[0]["note"])
            elif pd.notna(r.iloc[0]["ci95_low"]):
                r = r.iloc[0]
                row[head] = _interval_cell(r["mean"], r["ci95_low"], r["ci95_high"],
                                           "exact_match")
            else:
                row[head] = _num(r.iloc[0]["mean"])
        for n in lengths:
            cv = c[(c["variant"] == v) & (c["digits"] == n)] if len(c) else c
            head = f"Δ vs {BASELINE} at {n}"
            if cv.empty:
                row[head] = "–"
                continue
            row[head] = _delta_cell(cv.iloc[0])
        rows.append(row)
    trained = (f"Trained on operands of up to {digits} digits; tested on longer ones"
               if digits is not None else "Tested on operands longer than in training")
    lines = [f"{trained} (the length split: problems longer than any seen in training, "
             "marked \"length\"; up to the training length, the in-distribution test problems, "
             "marked \"test\"); n/a where a learned position table cannot reach that length. "
             f"Exact match (fraction) by the digits of the longer operand: mean "
             f"[{CONFIDENCE:.0%} CI over seeds, clipped to 0 and 1]; Δ is paired by seed "
             "against the "
             f"{BASELINE}, with its raw {CONFIDENCE:.0%} interval, Holm-corrected over the "
             "variants at each length (▲ better / ▼ worse).", "",
             _md_table(pd.DataFrame(rows)), ""]
    if few:
        lines += [f"† Fewer than {MIN_BUCKET_PROBLEMS} test problems per seed at "
                  + ", ".join(_digits_label(n) for n in few)
                  + ": one problem moves that exact match by more than "
                  f"{1 / MIN_BUCKET_PROBLEMS:.0%}; read it as a rough indication only.", ""]
    return lines
