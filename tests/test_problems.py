"""lmablate.report.stats.problems: arithmetic variants against the baseline problem by problem
(counts solved, the sign-flip test)."""

from __future__ import annotations

import itertools
import math
from typing import Sequence

import numpy as np
import pytest
from scipy import stats

from lmablate.report.stats import problems, statistics


def _decoded(solved: Sequence[bool], width: int = 3) -> list[dict]:
    """Decoded problems: problem i is right when solved[i], else wrong in every character."""
    return [{"prompt": f"q{i}", "target": "12$"[:width],
             "prediction": "12$"[:width] if ok else "xy#"[:width]}
            for i, ok in enumerate(solved)]


def test_problem_by_problem_comparison_on_a_constructed_example_with_a_known_answer():
    # 100 problems, 2 seeds. The baseline solves problems 0-9 on both seeds; the variant solves
    # problems 0-29 on both seeds: 20 problems differ, all in the variant's favour.
    n = 100
    base = [i < 10 for i in range(n)]
    var = [i < 30 for i in range(n)]
    few = [i < 20 for i in range(n)]  # 10 problems differ: few enough to enumerate the flips
    predictions = {("arith", "baseline"): {"seed_0": _decoded(base), "seed_1": _decoded(base)},
                   ("arith", "v"): {"seed_0": _decoded(var), "seed_1": _decoded(var)}}
    c = problems.compare_problems(predictions).set_index("metric")
    em = c.loc["exact_match"]
    assert (em["baseline_count"], em["variant_count"], em["total"]) == (20, 60, 200)
    assert em["n_differing"] == 20 and em["mean_diff"] == pytest.approx(0.2)
    assert em["verdict"] == statistics.VERDICT_BETTER
    # 2**20 sign flips are too many to enumerate: drawn; no draw is as extreme, and scipy's
    # two-sided p is twice the one-sided (hits + 1) / (resamples + 1)
    assert em["p_value"] == pytest.approx(2 / (problems.PERMUTATION_RESAMPLES + 1))
    # with 10 differences, all positive, the flips are enumerated: p = 2 * 2**-10 exactly, the
    # exact McNemar (binomial) test on 10 discordant problems, none against the variant
    exact = problems.compare_problems(
        {**predictions, ("arith", "v"): {"seed_0": _decoded(few), "seed_1": _decoded(few)}})
    assert exact["p_value"].iloc[0] == pytest.approx(2 * 0.5 ** 10, rel=1e-9)
    assert exact["p_value"].iloc[0] == pytest.approx(stats.binomtest(10, 10).pvalue, rel=1e-9)
    d = np.array([1.0] * 20 + [0.0] * 80)  # per-problem differences, averaged over seeds
    want = stats.t.interval(0.95, n - 1, loc=d.mean(), scale=d.std(ddof=1) / math.sqrt(n))
    assert (em["ci95_low"], em["ci95_high"]) == pytest.approx(want, rel=1e-12)
    ca = c.loc["char_accuracy"]  # a wrong answer here is wrong in all 3 characters
    assert (ca["baseline_count"], ca["variant_count"], ca["total"]) == (60, 180, 600)


def test_problem_by_problem_counts_a_split_decision_on_two_seeds_as_half_a_problem():
    # problem 0: the variant solves it on seed 0 only; problem 1: the baseline on seed 1 only
    base = {"seed_0": _decoded([False, False, False]), "seed_1": _decoded([False, True, False])}
    var = {"seed_0": _decoded([True, False, False]), "seed_1": _decoded([False, False, False])}
    c = problems.compare_problems({("a", "baseline"): base, ("a", "v"): var})
    em = c[c["metric"] == "exact_match"].iloc[0]
    assert em["n_differing"] == 2 and em["mean_diff"] == 0.0
    # two differences of +0.5 and -0.5: of the 4 sign flips, all have |sum| >= 0, p = 1
    assert em["p_value"] == 1.0 and em["verdict"] == statistics.VERDICT_NSD


def test_problem_by_problem_with_one_differing_problem_has_p_1():
    # one discordant problem (the default study met it: exact match 0.0004 against 0.0002):
    # its two sign flips are equally extreme, the exact McNemar p is binomtest(1, 1) = 1
    base = {"seed_0": _decoded([False, False, False])}
    var = {"seed_0": _decoded([True, False, False])}
    c = problems.compare_problems({("a", "baseline"): base, ("a", "v"): var})
    em = c[c["metric"] == "exact_match"].iloc[0]
    assert em["n_differing"] == 1 and em["p_value"] == stats.binomtest(1, 1).pvalue == 1.0
    assert em["verdict"] == statistics.VERDICT_NSD


@pytest.mark.parametrize("d", [[0.5, 1.0], [1.0, -0.5, 2.0], [0.25, 0.5, -1.0, 2.0, 3.0]])
def test_the_sign_flip_test_equals_enumerating_every_flip(d):
    d = np.array(d)
    flips = [np.array(signs) for signs in itertools.product((1, -1), repeat=d.size)]
    want = np.mean([abs((d * f).sum()) >= abs(d.sum()) - 1e-12 for f in flips])
    assert problems.sign_flip_test(d) == pytest.approx(want)


def test_problem_by_problem_identical_outcomes_get_no_test():
    same = {"seed_0": _decoded([True, False, False])}
    c = problems.compare_problems({("a", "baseline"): same, ("a", "v"): same})
    assert set(c["verdict"]) == {"identical on every problem"}
    assert c["p_value"].isna().all() and c["mean_diff"].eq(0).all()


def test_problem_by_problem_refuses_variants_decoded_on_different_problems():
    base = {"seed_0": _decoded([True, False])}
    other = {"seed_0": [dict(p, prompt="other") for p in _decoded([True, False])]}
    with pytest.raises(ValueError, match="problem 0 of v .*same test problems"):
        problems.compare_problems({("a", "baseline"): base, ("a", "v"): other})
