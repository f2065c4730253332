"""Arithmetic tables: floors (answers that ignore the question) and exact match by operand
length (digits of the longer operand) against the baseline. Answer loss in nats per answer
character (``$`` included), accuracies fractions, lengths in digits."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from lmablate.data.arithmetic import split_problem
from lmablate.data.tokenizer import split_lines
from lmablate.report.collect import BASELINE, present
from lmablate.report.run_files import maybe_int
from lmablate.report.stats import reference_models as refs
from lmablate.report.stats.extrapolation import by_seed
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
    """The answers of the train split's problems under ``tokens_dir`` (one dataset's), cut by
    :func:`lmablate.data.tokenizer.split_lines` (empty without ``line_length``). Raises
    FileNotFoundError / TokenizerError (tokenizer or split missing or bad), DataError."""
    return [split_problem(line)[1] for line in split_lines(tokens_dir, "train")]


def answer_references(dataset: str, tokens_dir: Path, targets: Sequence[str]) -> list[dict]:
    """Reference rows (``dataset, reference, metric, value, detail``) on the test answers
    ``targets``: all zeros, the best constant and the most frequent answer, and
    :data:`ANSWER_FLOOR` from :func:`train_answers` if any. Raises ValueError for ``targets``
    empty or not all of the train answers' length, and as :func:`train_answers`."""
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


def _splits(by_digits: pd.DataFrame) -> dict[tuple[str, int], str]:
    s = by_digits.dropna(subset=["split"])
    return {(str(r.dataset), int(r.digits)): str(r.split)
            for r in s[s["split"].astype(str) != ""].itertuples()}


def length_table(by_digits: pd.DataFrame) -> pd.DataFrame:
    """:data:`LENGTH_COLUMNS`: exact match per dataset x variant x digits (study order), mean
    and Student-t interval over seeds (:func:`~lmablate.report.stats.statistics.summarise`),
    ``n_problems`` per seed (the fewest), ``split`` ("test", or "length" past the training
    digits), and NaNs with the reason in ``note`` where the model cannot run that long."""
    if by_digits.empty:
        return pd.DataFrame(columns=LENGTH_COLUMNS)
    wide, metrics = by_seed(by_digits, "digits", "exact_match", "exact_match_d{}".format)
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
    """:data:`LENGTH_COMPARISON_COLUMNS`: :func:`~lmablate.report.stats.statistics.compare`
    against ``baseline`` per operand length (``exact_match_d<n>``, one Holm family each), where
    both have values; by dataset, digits, variant."""
    if by_digits.empty:
        return pd.DataFrame(columns=LENGTH_COMPARISON_COLUMNS)
    wide, metrics = by_seed(by_digits, "digits", "exact_match", "exact_match_d{}".format)
    splits, frames = _splits(by_digits), []
    for ds in present(wide["dataset"]):
        d = wide[wide["dataset"] == ds]
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
    """The most operand digits in training: the config's, else the longest of the test split."""
    digits = getattr(dataset_cfg, "digits", None)
    if digits is not None:
        return int(digits)
    d = by_digits[(by_digits["dataset"] == dataset) & (by_digits["split"] == "test")] \
        if len(by_digits) else by_digits
    return int(d["digits"].max()) if len(d) else None


def has_length_split(by_digits: pd.DataFrame, dataset: str) -> bool:
    """Whether ``dataset`` has results from the split ``"length"``."""
    return bool(len(by_digits)) and bool((by_digits[by_digits["dataset"] == dataset]["split"]
                                          .astype(str) == "length").any())


def unreachable(by_digits: pd.DataFrame, dataset: str) -> list[str]:
    """``"<variant> at <n> digits, <note>"`` per variant x length of ``dataset`` without results."""
    d = by_digits[by_digits["dataset"] == dataset] if len(by_digits) else by_digits
    d = d[d["exact_match"].isna() & (d["note"].fillna("").astype(str) != "")]
    seen = d.drop_duplicates(["variant", "digits"]).sort_values(["variant", "digits"],
                                                                kind="stable")
    return [f"{r.variant} at {digits_label(int(r.digits))}, {r.note}"
            for r in seen.itertuples()]


def digits_label(n: int) -> str:
    """``"1 digit"``, ``"3 digits"``."""
    return f"{n} digit" + ("" if n == 1 else "s")
