"""Arithmetic variants against the baseline problem by problem: the same test problems,
decoded by every variant on every seed, compared with a sign-flip permutation test and Holm's
correction (:func:`compare_problems`). A diagnostic of which problems these trained models get
right, not a verdict: the test treats the problems as independent, but they are problems of the
same few trained models, not independent replications. The study's verdicts are drawn over
seeds (:func:`lmablate.report.stats.statistics.compare`), and the report renders this table without
verdict words or marks (:func:`lmablate.report.text.dataset_tables.problem_diagnostic`). Rates are
fractions of problems (exact match) or of answer characters (char accuracy).
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from lmablate.report.collect import BASELINE
from lmablate.report.stats.statistics import ALPHA, VERDICT_NSD, holm_correct, mean_interval

PROBLEM_COLUMNS = [
    "dataset", "metric", "baseline", "variant", "n_problems", "n_seeds", "baseline_count",
    "variant_count", "total", "baseline_rate", "variant_rate", "n_differing", "mean_diff",
    "ci95_low", "ci95_high", "ci_holm_low", "ci_holm_high", "p_value", "p_holm", "reject_holm",
    "verdict",
]
VERDICT_SAME_PROBLEMS = "identical on every problem"
PERMUTATION_RESAMPLES = 9999  # sign flips drawn when there are too many to enumerate
PERMUTATION_SEED = 0


def problem_outcomes(predictions: Sequence[Mapping[str, str]]) -> tuple[np.ndarray, np.ndarray]:
    """Per problem of one seed's decoded test problems: whether it was solved (exact match, 0/1)
    and its share of correct answer characters (character accuracy), both (N,) float arrays;
    the means over problems are :func:`lmablate.evaluate.metrics.arithmetic_scores`' numbers."""
    exact, chars = [], []
    for p in predictions:
        target, pred = str(p["target"]), str(p["prediction"])
        hits = [a == b for a, b in zip(pred.ljust(len(target)), target)]
        chars.append(sum(hits) / len(target))
        exact.append(float(all(hits)))
    return np.asarray(exact), np.asarray(chars)


def sign_flip_test(diff: np.ndarray) -> float:
    """Two-sided p-value of the paired sign-flip permutation test of mean(diff) = 0 (Fisher
    1935; ``scipy.stats.permutation_test(permutation_type="samples")``): under the null every
    difference is as likely to have either sign. Zero differences are dropped, which leaves the
    statistic's permutation distribution unchanged; the flips are enumerated exactly when there
    are at most :data:`PERMUTATION_RESAMPLES` of them, else drawn with seed
    :data:`PERMUTATION_SEED`. On 0/1 outcomes of one seed this is the exact McNemar test
    (McNemar 1947) on the discordant pairs. NaN without a non-zero difference; exactly 1 with
    one (its two flips, +d and -d, are equally extreme; scipy refuses a sample of one)."""
    d = np.asarray(diff, dtype=float)
    d = d[d != 0]
    if d.size == 0:
        return math.nan
    if d.size == 1:
        return 1.0
    res = stats.permutation_test((d,), np.sum, permutation_type="samples",
                                 n_resamples=PERMUTATION_RESAMPLES, alternative="two-sided",
                                 random_state=np.random.default_rng(PERMUTATION_SEED))
    return float(min(1.0, res.pvalue))


def _paired_outcomes(dataset: str, base: Mapping[str, Sequence[Mapping]],
                     predictions: Mapping[tuple[str, str], Mapping[str, Sequence[Mapping]]],
                     order: Sequence[str]) -> dict[str, tuple]:
    """Per variant of ``order``, once: ``(seeds, n problems, answer width, baseline outcomes,
    variant outcomes)``, its seeds paired with the baseline's ``base``, the problems both have
    (checked to be the same ones) and both sides' :func:`problem_outcomes` per seed.

    Raises:
        ValueError: a prompt differs from the baseline's at the same position."""
    paired = {}
    base_out = {k: problem_outcomes(v) for k, v in base.items() if v}  # shared by variants
    for variant in order:
        other = predictions[(dataset, variant)]
        seeds = [k for k in base if k in other and base[k] and other[k]]
        if not seeds:
            continue
        n = min(min(len(base[k]), len(other[k])) for k in seeds)
        for k in seeds:
            for i, (a, b) in enumerate(zip(base[k][:n], other[k][:n])):
                if a["prompt"] != b["prompt"]:
                    raise ValueError(
                        f"{dataset}: problem {i} of {variant} ({k}) is {b['prompt']!r}, "
                        f"the baseline's is {a['prompt']!r}; evaluate both on the same "
                        "test problems")
        b_out = [tuple(o[:n] for o in base_out[k]) for k in seeds]
        v_out = [problem_outcomes(other[k][:n]) for k in seeds]
        paired[variant] = (seeds, n, len(str(base[seeds[0]][0]["target"])), b_out, v_out)
    return paired


def _problem_row(dataset: str, metric: str, baseline: str, variant: str, n_seeds: int,
                 width: int, b_out: np.ndarray, v_out: np.ndarray) -> dict:
    """One row of :func:`compare_problems` from both sides' outcomes, ``(seeds, problems)``
    each (``width`` answer characters a problem for character accuracy, else 1): identical on
    every problem, or the sign-flip test with the verdict "no significant difference" until
    :func:`holm_correct` judges it."""
    n = b_out.shape[1]
    d = (v_out - b_out).mean(axis=0)  # (n problems,)
    row = {
        "dataset": dataset, "metric": metric, "baseline": baseline,
        "variant": variant, "n_problems": n, "n_seeds": n_seeds,
        "baseline_count": int(round(b_out.sum() * width)),
        "variant_count": int(round(v_out.sum() * width)),
        "total": n * n_seeds * width, "baseline_rate": float(b_out.mean()),
        "variant_rate": float(v_out.mean()),
        "n_differing": int(np.count_nonzero(d)), "mean_diff": float(d.mean()),
        "ci95_low": math.nan, "ci95_high": math.nan, "ci_holm_low": math.nan,
        "ci_holm_high": math.nan, "p_value": math.nan, "p_holm": math.nan,
        "reject_holm": False, "verdict": VERDICT_SAME_PROBLEMS,
    }
    if np.count_nonzero(d):
        sem = float(d.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
        row["ci95_low"], row["ci95_high"] = mean_interval(d.mean(), sem, n)
        row.update(p_value=sign_flip_test(d), verdict=VERDICT_NSD, _sem=sem, _df=n - 1)
    else:
        row.update(dict.fromkeys(("ci95_low", "ci95_high", "ci_holm_low", "ci_holm_high"), 0.0))
    return row


def compare_problems(predictions: Mapping[tuple[str, str], Mapping[str, Sequence[Mapping]]],
                     baseline: str = BASELINE, alpha: float = ALPHA,
                     variants: Sequence[str] | None = None) -> pd.DataFrame:
    """Arithmetic variants against ``baseline`` problem by problem: exact match and character
    accuracy over the same test problems, paired by problem and seed.

    Method: for each variant, the seeds both it and the baseline decoded, and the problems (by
    position in ``test.txt``) both have. Per problem i the difference
    d_i = mean over those seeds of (variant - baseline) outcome (solved 0/1, or the share of
    correct answer characters); averaging over seeds first keeps one problem's seeds together,
    since they are not independent. The test is :func:`sign_flip_test` on the d_i (for exact
    match on one seed: McNemar's exact test); the interval is the
    :data:`~lmablate.report.stats.statistics.CONFIDENCE` Student-t interval of the mean of the d_i
    over problems (its large-sample form, which can be narrower than the exact test implies when
    only a few problems differ: see ``n_differing``). Holm's correction runs over the variants of
    each metric, with :func:`~lmablate.report.stats.statistics.holm_interval`. All d_i zero gives
    ``"identical on every problem"`` and no test.

    Counts: ``baseline_count``/``variant_count`` of ``total`` (problems x seeds): problems
    solved, or answer characters right (``total`` then counts characters).

    Args:
        predictions: ``{(dataset, variant): {"seed_<n>": [{"prompt", "target", "prediction"},
            ...]}}`` (:attr:`~lmablate.report.collect.RunOutputs.predictions`).
        variants: the order of the rows (default: that of ``predictions``).

    Returns:
        Columns :data:`PROBLEM_COLUMNS`; rates, differences and intervals as fractions in
        [0, 1] (differences in [-1, 1]).

    Raises:
        ValueError: a variant's problems are not the baseline's (a prompt differs at the same
            position): they were not decoded on the same test set.
    """
    rows = []
    for dataset in dict.fromkeys(d for d, _ in predictions):
        if (dataset, baseline) not in predictions:
            continue
        order = [v for v in (variants or [v for d, v in predictions if d == dataset])
                 if (dataset, v) in predictions and v != baseline]
        # per variant, once: its seeds paired with the baseline's, the common problems (checked
        # to be the same ones) and both sides' outcomes, (seeds, problems) per metric
        paired = _paired_outcomes(dataset, predictions[(dataset, baseline)], predictions, order)
        for metric, which in (("exact_match", 0), ("char_accuracy", 1)):
            rows += _metric_rows(dataset, metric, which, baseline, paired, alpha)
    out = pd.DataFrame(rows, columns=PROBLEM_COLUMNS)
    for col in ("ci95_low", "ci95_high"):
        out[col] = out[col].astype(float)
    out["reject_holm"] = out["reject_holm"].astype(bool)
    return out


def _metric_rows(dataset: str, metric: str, which: int, baseline: str, paired: dict,
                 alpha: float) -> list[dict]:
    """One dataset's rows of ``metric`` (outcome ``which`` of :func:`problem_outcomes`) from
    the ``paired`` outcomes of :func:`_paired_outcomes`, the tested ones one Holm family."""
    rows = [_problem_row(dataset, metric, baseline, variant, len(seeds),
                         chars if metric == "char_accuracy" else 1,
                         np.stack([o[which] for o in b_all]),  # (seeds, problems)
                         np.stack([o[which] for o in v_all]))
            for variant, (seeds, n, chars, b_all, v_all) in paired.items()]
    # the tested rows: Holm's family
    holm_correct(rows, [i for i, r in enumerate(rows) if r["verdict"] == VERDICT_NSD], alpha,
                 higher=True)
    return rows
