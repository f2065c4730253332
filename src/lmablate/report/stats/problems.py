"""Arithmetic variants against the baseline problem by problem (:func:`compare_problems`): a
diagnostic of which problems the trained models get right, not a verdict, as the problems of the
same few models are not independent replications (the verdicts are
:func:`lmablate.report.stats.statistics.compare`'s). Rates are fractions of problems (exact
match) or of answer characters (char accuracy).
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from lmablate.report.collect import BASELINE
from lmablate.report.stats.statistics import (ALPHA, INTERVAL_COLUMNS, VERDICT_NSD, holm_correct,
                                              mean_interval)

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
    """Per decoded test problem of one seed: solved (exact match, 0/1) and the share of correct
    answer characters, both (N,) float arrays (their means are
    :func:`lmablate.evaluate.metrics.arithmetic_scores`')."""
    exact, chars = [], []
    for p in predictions:
        target, pred = str(p["target"]), str(p["prediction"])
        hits = [a == b for a, b in zip(pred.ljust(len(target)), target)]
        chars.append(sum(hits) / len(target))
        exact.append(float(all(hits)))
    return np.asarray(exact), np.asarray(chars)


def sign_flip_test(diff: np.ndarray) -> float:
    """Two-sided p-value of the paired sign-flip permutation test of mean(diff) = 0 (Fisher
    1935; ``scipy.stats.permutation_test(permutation_type="samples")``, exact up to
    :data:`PERMUTATION_RESAMPLES` flips, else drawn with :data:`PERMUTATION_SEED`), zero
    differences dropped; on one seed's 0/1 outcomes McNemar's exact test (McNemar 1947). NaN
    without a non-zero difference, 1 with one (scipy refuses a sample of one)."""
    d = np.asarray(diff, dtype=float)
    d = d[d != 0]
    if d.size <= 1:
        return 1.0 if d.size else math.nan
    res = stats.permutation_test((d,), np.sum, permutation_type="samples",
                                 n_resamples=PERMUTATION_RESAMPLES, alternative="two-sided",
                                 random_state=np.random.default_rng(PERMUTATION_SEED))
    return float(min(1.0, res.pvalue))


def _paired_outcomes(dataset: str, base: Mapping[str, Sequence[Mapping]],
                     predictions: Mapping[tuple[str, str], Mapping[str, Sequence[Mapping]]],
                     order: Sequence[str]) -> dict[str, tuple]:
    """variant -> (seeds, answer width, baseline outcomes, variant outcomes) per seed both
    decoded, on the problems both have; raises ValueError where a prompt differs."""
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
        paired[variant] = (seeds, len(str(base[seeds[0]][0]["target"])),
                           [tuple(o[:n] for o in base_out[k]) for k in seeds],
                           [problem_outcomes(other[k][:n]) for k in seeds])
    return paired


def _problem_row(dataset: str, metric: str, baseline: str, variant: str, n_seeds: int,
                 width: int, b_out: np.ndarray, v_out: np.ndarray) -> dict:
    """A row of :func:`compare_problems` from (seeds, problems) outcomes, ``width`` characters a
    problem: identical, or the sign-flip test, NSD until Holm judges it."""
    n = b_out.shape[1]
    d = (v_out - b_out).mean(axis=0)  # (n problems,)
    row = {"dataset": dataset, "metric": metric, "baseline": baseline, "variant": variant,
           "n_problems": n, "n_seeds": n_seeds,
           "baseline_count": int(round(b_out.sum() * width)),
           "variant_count": int(round(v_out.sum() * width)),
           "total": n * n_seeds * width, "baseline_rate": float(b_out.mean()),
           "variant_rate": float(v_out.mean()),
           "n_differing": int(np.count_nonzero(d)), "mean_diff": float(d.mean()),
           **dict.fromkeys(PROBLEM_COLUMNS[13:19], math.nan), "reject_holm": False,
           "verdict": VERDICT_SAME_PROBLEMS}
    if not np.count_nonzero(d):
        return {**row, **dict.fromkeys(INTERVAL_COLUMNS, 0.0)}
    sem = float(d.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
    row["ci95_low"], row["ci95_high"] = mean_interval(d.mean(), sem, n)
    return {**row, "p_value": sign_flip_test(d), "verdict": VERDICT_NSD, "_sem": sem,
            "_df": n - 1}


def compare_problems(predictions: Mapping[tuple[str, str], Mapping[str, Sequence[Mapping]]],
                     baseline: str = BASELINE, alpha: float = ALPHA,
                     variants: Sequence[str] | None = None) -> pd.DataFrame:
    """Arithmetic variants against ``baseline`` in exact match and character accuracy, paired by
    problem (position in ``test.txt``) and seed, on the seeds and problems both decoded.

    Per problem i, d_i = the mean over seeds of (variant - baseline) outcome (averaging first
    keeps a problem's dependent seeds together); the test is :func:`sign_flip_test` on the d_i,
    the interval the large-sample :data:`~lmablate.report.stats.statistics.CONFIDENCE` t-interval
    of their mean (it can be narrower than the exact test implies when few problems differ: see
    ``n_differing``); Holm's correction runs over each metric's variants. All d_i zero gives
    "identical on every problem" and no test. ``baseline_count``/``variant_count`` of ``total``
    (problems x seeds, x answer characters for char accuracy).

    ``predictions``: ``{(dataset, variant): {"seed_<n>": [{"prompt", "target", "prediction"}]}}``
    (:attr:`~lmablate.report.collect.RunOutputs.predictions`); ``variants`` orders the rows.
    Returns columns :data:`PROBLEM_COLUMNS`, as fractions (differences in [-1, 1]).

    Raises:
        ValueError: a variant's prompt differs from the baseline's at the same position.
    """
    rows = []
    for dataset in dict.fromkeys(d for d, _ in predictions):
        if (dataset, baseline) not in predictions:
            continue
        order = [v for v in (variants or [v for d, v in predictions if d == dataset])
                 if (dataset, v) in predictions and v != baseline]
        paired = _paired_outcomes(dataset, predictions[(dataset, baseline)], predictions, order)
        for metric, which in (("exact_match", 0), ("char_accuracy", 1)):
            new = [_problem_row(dataset, metric, baseline, variant, len(seeds),
                                chars if which else 1, np.stack([o[which] for o in b_all]),
                                np.stack([o[which] for o in v_all]))
                   for variant, (seeds, chars, b_all, v_all) in paired.items()]
            holm_correct(new, [i for i, r in enumerate(new) if r["verdict"] == VERDICT_NSD],
                         alpha, higher=True)
            rows += new
    out = pd.DataFrame(rows, columns=PROBLEM_COLUMNS)
    out[["ci95_low", "ci95_high"]] = out[["ci95_low", "ci95_high"]].astype(float)
    out["reject_holm"] = out["reject_holm"].astype(bool)
    return out
