"""Arithmetic results as tables: the floors (answers that ignore the question, on the evaluated
test problems) and exact match by operand length (digits of the longer operand), each variant
against the baseline at each length. Answer loss in nats per answer character (``$`` included),
accuracies fractions in [0, 1], lengths in digits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from lmablate.data.arithmetic import split_problem
from lmablate.data.tokenizer import split_lines
from lmablate.report.collect import BASELINE, present
from lmablate.report.run_files import maybe_int
from lmablate.report.stats import reference_models as refs
from lmablate.report.stats.statistics import ANSWER_LOSS, COMPARISON_COLUMNS, compare, summarise

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


def train_answers(tokens_dir: Path) -> list[str]:
    """The answers (:func:`lmablate.data.arithmetic.split_problem`) of the train split's
    problems under ``tokens_dir`` (``data/tokens/<dataset>/``), cut by
    :func:`lmablate.data.tokenizer.split_lines`; empty without ``line_length`` in meta.json.

    Raises:
        FileNotFoundError / TokenizerError: the tokenizer or train split is missing or bad.
        DataError: a piece is not a problem, or the split not a whole number of problems.
    """
    return [split_problem(line)[1] for line in split_lines(tokens_dir, "train")]


def answer_references(dataset: str, tokens_dir: Path, targets: Sequence[str]) -> list[dict]:
    """The reference rows (``dataset, reference, metric, value, detail``) of an arithmetic
    dataset on the evaluated test answers ``targets`` (reversed, ``$`` included): all zeros
    (char accuracy, exact match), the best constant answer (char accuracy), the most frequent
    answer (exact match), ``detail`` the answer; and :data:`ANSWER_FLOOR` (``answer_loss``,
    :func:`lmablate.report.stats.reference_models.answer_position_floor` of
    :func:`train_answers`) unless those are empty.

    Raises:
        ValueError: ``targets`` empty or of unequal lengths, or of another length than the
            train answers; and those of :func:`train_answers`.
    """
    targets = [str(t) for t in targets]
    zeros = refs.constant_answer_scores(targets, refs.all_zeros_answer(len(targets[0])))
    rows = [{"dataset": dataset, "reference": name, "metric": metric,
             "value": score[metric], "detail": f"`{score['answer']}`"}
            for name, score, metrics in (
                ("all zeros", zeros, ("char_accuracy", "exact_match")),
                ("best constant answer", refs.best_constant_answer(targets), ("char_accuracy",)),
                ("most frequent answer", refs.most_frequent_answer(targets), ("exact_match",)))
            for metric in metrics]
    train = train_answers(Path(tokens_dir))
    if train:
        rows.append({"dataset": dataset, "reference": ANSWER_FLOOR, "metric": ANSWER_LOSS,
                     "value": refs.answer_position_floor(train, targets),
                     "detail": refs.ANSWER_SMOOTHING})
    return rows


def _wide(by_digits: pd.DataFrame) -> tuple[pd.DataFrame, dict[int, str]]:
    """Seeds as rows (dataset, variant, seed), one ``exact_match_d<n>`` column per length."""
    lengths = sorted(int(d) for d in by_digits["digits"].dropna().unique())
    metrics = {d: f"exact_match_d{d}" for d in lengths}
    wide = by_digits.pivot_table(index=["dataset", "variant", "seed"], columns="digits",
                                 values="exact_match", aggfunc="first", observed=True,
                                 dropna=False).reindex(columns=lengths).reset_index()
    wide.columns = ["dataset", "variant", "seed", *metrics.values()]
    return wide, metrics


def _splits(by_digits: pd.DataFrame) -> dict[tuple[str, int], str]:
    """(dataset, digits) -> the split its results come from ("test" or "length")."""
    s = by_digits.dropna(subset=["split"])
    return {(str(r.dataset), int(r.digits)): str(r.split)
            for r in s[s["split"].astype(str) != ""].itertuples()}


def length_table(by_digits: pd.DataFrame) -> pd.DataFrame:
    """Exact match by operand length (:attr:`~lmablate.report.collect.RunOutputs.
    by_operand_digits`) per dataset x variant x digits: the mean over seeds and its Student-t
    interval (:func:`~lmablate.report.stats.statistics.summarise`), ``n_seeds``, ``n_problems``
    per seed (the fewest), the ``split`` ("test" up to the training digits, "length" past
    them), and NaNs with the reason in ``note`` where the model cannot run that long.
    Columns :data:`LENGTH_COLUMNS`, by dataset and variant (study order), then digits."""
    if by_digits.empty:
        return pd.DataFrame(columns=LENGTH_COLUMNS)
    wide, metrics = _wide(by_digits)
    summary = summarise(wide, list(metrics.values())).set_index(
        ["dataset", "variant", "metric"])
    splits = _splits(by_digits)
    rows = []
    for (ds, var, digits), g in by_digits.groupby(["dataset", "variant", "digits"],
                                                  observed=True, sort=True):
        counts = pd.to_numeric(g["n"], errors="coerce").dropna() if "n" in g else []
        row = {"dataset": ds, "variant": var, "digits": int(digits),
               "split": splits.get((str(ds), int(digits)), ""), "n_seeds": 0,
               "n_problems": int(counts.min()) if len(counts) else None,
               "note": "; ".join(sorted(set(g["note"].dropna().astype(str)) - {""}))}
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
    Holm within each dataset x length (:func:`~lmablate.report.stats.statistics.compare`,
    ``metric`` = ``exact_match_d<n>``, differences as fractions), with ``digits`` and
    ``split``; no row where either has no values. Columns :data:`LENGTH_COMPARISON_COLUMNS`,
    by dataset, then digits, then variant."""
    frames = []
    wide, metrics = _wide(by_digits) if len(by_digits) else (by_digits, {})
    for ds in present(wide["dataset"]) if metrics else ():
        splits, d = _splits(by_digits), wide[wide["dataset"] == ds]
        for digits, metric in metrics.items():  # each length one Holm family
            c = compare(d[["dataset", "variant", "seed", metric]].rename(
                columns={metric: "exact_match"}), baseline=baseline, metrics=["exact_match"])
            frames.append(c[c["n_pairs"] > 0].assign(metric=metric, digits=digits,
                                                     split=splits.get((ds, digits), "")))
    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame(columns=LENGTH_COMPARISON_COLUMNS)
    return pd.concat(frames, ignore_index=True)[LENGTH_COMPARISON_COLUMNS]


def training_digits(dataset_cfg: Any, by_digits: pd.DataFrame, dataset: str) -> int | None:
    """The most operand digits of ``dataset``'s training problems: the config's ``digits``, else
    the longest length with results from the test split; None when neither is known."""
    digits = getattr(dataset_cfg, "digits", None)
    if digits is not None:
        return int(digits)
    d = by_digits[(by_digits["dataset"] == dataset) & (by_digits["split"] == "test")] \
        if len(by_digits) else by_digits
    return int(d["digits"].max()) if len(d) else None


def has_length_split(by_digits: pd.DataFrame, dataset: str) -> bool:
    """Whether ``dataset`` has results from the split ``"length"`` (problems longer than any in
    training)."""
    return bool(len(by_digits)) and bool((by_digits[by_digits["dataset"] == dataset]["split"]
                                          .astype(str) == "length").any())


def unreachable(by_digits: pd.DataFrame, dataset: str) -> list[str]:
    """``"<variant> at <n> digits, <note>"`` for each variant x length of ``dataset`` without
    results, in study order: what the length figure leaves out."""
    d = by_digits[by_digits["dataset"] == dataset] if len(by_digits) else by_digits
    d = d[d["exact_match"].isna() & (d["note"].fillna("").astype(str) != "")]
    seen = d.drop_duplicates(["variant", "digits"]).sort_values(["variant", "digits"],
                                                                kind="stable")
    return [f"{r.variant} at {digits_label(int(r.digits))}, {r.note}"
            for r in seen.itertuples()]


def digits_label(n: int) -> str:
    """``"1 digit"``, ``"3 digits"``."""
    return f"{n} digit" + ("" if n == 1 else "s")
