"""Arithmetic variants against the baseline problem by problem: a diagnostic, not a verdict, as
the problems of a few models are not independent replications. Rates are fractions."""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from lmablate.report.collect import BASELINE
from lmablate.report.stats.statistics import (ALPHA, INTERVAL_COLUMNS, VERDICT_NSD, holm_correct,
                                              mean_interval)

PROBLEM_COLUMNS = ("dataset metric baseline variant n_problems n_seeds baseline_count "
                   "variant_count total baseline_rate variant_rate n_differing mean_diff ci95_low "
                   "ci95_high ci_holm_low ci_holm_high p_value p_holm reject_holm verdict").split()
VERDICT_SAME_PROBLEMS = "identical on every problem"
PERMUTATION_RESAMPLES = 9999  # sign flips drawn when there are too many to enumerate
PERMUTATION_SEED = 0


def problem_outcomes(predictions: Sequence[Mapping[str, str]]) -> tuple[np.ndarray, np.ndarray]:
    """Per decoded test problem of one seed: solved (0/1) and the share of correct answer
    characters, (N,) float arrays (means: :func:`lmablate.evaluate.metrics.arithmetic_scores`)."""
    hits = [[a == b for a, b in zip(str(p["prediction"]).ljust(len(str(p["target"]))),
                                    str(p["target"]))] for p in predictions]
    return np.asarray([float(all(h)) for h in hits]), np.asarray([sum(h) / len(h) for h in hits])


def sign_flip_test(diff: np.ndarray) -> float:
    """Two-sided p-value of the sign-flip permutation test of mean(diff) = 0 (Fisher 1935;
    ``scipy.stats.permutation_test``) on the non-zero differences: McNemar's exact test on one
    seed's 0/1 outcomes (McNemar 1947). NaN without a non-zero difference, 1 with one."""
    d = np.asarray(diff, dtype=float)
    d = d[d != 0]
    if d.size <= 1:
        return 1.0 if d.size else math.nan
    res = stats.permutation_test((d,), np.sum, permutation_type="samples",
                                 n_resamples=PERMUTATION_RESAMPLES, alternative="two-sided",
                                 random_state=np.random.default_rng(PERMUTATION_SEED))
    return float(min(1.0, res.pvalue))


def _variant_rows(dataset: str, baseline: str, variant: str, base: Mapping[str, Sequence],
                  other: Mapping[str, Sequence], base_out: Mapping[str, tuple]) -> list[dict]:
    """The exact-match and char-accuracy rows of :func:`compare_problems` of ``variant``: on the
    seeds and problems both decoded, identical or the sign-flip test, NSD until Holm judges."""
    seeds = [k for k in base if k in other and base[k] and other[k]]
    if not seeds:
        return []
    n = min(min(len(base[k]), len(other[k])) for k in seeds)
    for k in seeds:
        for i, (a, b) in enumerate(zip(base[k][:n], other[k][:n])):
            if a["prompt"] != b["prompt"]:
                raise ValueError(f"{dataset}: problem {i} of {variant} ({k}) is {b['prompt']!r}, "
                                 f"the baseline's is {a['prompt']!r}; evaluate both on the same "
                                 "test problems")
    v_all = [problem_outcomes(other[k][:n]) for k in seeds]
    rows = []
    for metric, which in (("exact_match", 0), ("char_accuracy", 1)):
        b_out = np.stack([base_out[k][which][:n] for k in seeds])  # (seeds, problems)
        v_out = np.stack([o[which] for o in v_all])
        width = len(str(base[seeds[0]][0]["target"])) if which else 1  # characters a problem
        d = (v_out - b_out).mean(axis=0)  # (n problems,)
        row = {"dataset": dataset, "metric": metric, "baseline": baseline, "variant": variant,
               "n_problems": n, "n_seeds": len(seeds),
               "baseline_count": int(round(b_out.sum() * width)),
               "variant_count": int(round(v_out.sum() * width)),
               "total": n * len(seeds) * width, "baseline_rate": float(b_out.mean()),
               "variant_rate": float(v_out.mean()), "n_differing": int(np.count_nonzero(d)),
               "mean_diff": float(d.mean()), **dict.fromkeys(PROBLEM_COLUMNS[13:19], math.nan),
               "reject_holm": False, "verdict": VERDICT_SAME_PROBLEMS}
        if not np.count_nonzero(d):
            row.update(dict.fromkeys(INTERVAL_COLUMNS, 0.0))
        else:
            sem = float(d.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
            row["ci95_low"], row["ci95_high"] = mean_interval(d.mean(), sem, n)
            row.update(p_value=sign_flip_test(d), verdict=VERDICT_NSD, _sem=sem, _df=n - 1)
        rows.append(row)
    return rows


def compare_problems(predictions: Mapping[tuple[str, str], Mapping[str, Sequence[Mapping]]],
                     baseline: str = BASELINE, alpha: float = ALPHA,
                     variants: Sequence[str] | None = None) -> pd.DataFrame:
    """Variants against ``baseline`` in exact match and char accuracy from ``{(dataset, variant):
    {"seed_<n>": [{"prompt", "target", "prediction"}]}}``: :func:`sign_flip_test` and t-interval
    of d_i, problem i's mean over seeds of (variant - baseline), Holm over each metric's
    variants. Columns :data:`PROBLEM_COLUMNS` (counts of problems or answer characters x seeds).
    Raises ValueError where a variant's prompt differs from the baseline's at one position."""
    rows = []
    for dataset in dict.fromkeys(d for d, _ in predictions if (d, baseline) in predictions):
        base = predictions[(dataset, baseline)]
        base_out = {k: problem_outcomes(v) for k, v in base.items() if v}  # shared by variants
        new = [row for v in (variants or [v for d, v in predictions if d == dataset])
               if (dataset, v) in predictions and v != baseline
               for row in _variant_rows(dataset, baseline, v, base, predictions[(dataset, v)],
                                        base_out)]
        for metric in ("exact_match", "char_accuracy"):
            family = [r for r in new if r["metric"] == metric]
            holm_correct(family, [i for i, r in enumerate(family) if r["verdict"] == VERDICT_NSD],
                         alpha, higher=True)
            rows += family
    return pd.DataFrame(rows, columns=PROBLEM_COLUMNS).astype(
        {"ci95_low": float, "ci95_high": float, "reject_holm": bool})
