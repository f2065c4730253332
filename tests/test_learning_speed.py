"""How fast each variant learns (lmablate.report.stats.learning_speed): tokens to learn from
constructed histories, the Kaplan-Meier median, and the comparison paired by seed, on data
with known answers."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from lmablate.report.stats import learning_speed as ls
from lmablate.report.text import findings
from lmablate.report.stats.statistics import VERDICT_FEW, VERDICT_NSD


def history(curves):
    """Rows of history.csv: curves maps (variant, seed) -> exact match at steps 1, 2, ...
    (1,000 tokens a step)."""
    return pd.DataFrame([{"dataset": "arithmetic", "variant": v, "seed": s, "step": i + 1,
                          "tokens": 1000.0 * (i + 1), "val_exact_match": em}
                         for (v, s), ems in curves.items() for i, em in enumerate(ems)])


def test_tokens_to_learn_take_the_first_evaluation_past_the_threshold_or_censor_at_the_end():
    h = history({("baseline", 0): [0.0, 0.1, 0.6, 0.95],   # learned at 3k, mastered at 4k
                 ("baseline", 1): [0.7, 0.8, 0.9, 0.9],    # learned at the first evaluation
                 ("baseline", 2): [0.0, 0.0, 0.1, 0.4]})   # never: censored at 4k
    h = pd.concat([h, pd.DataFrame([{"dataset": "shakespeare", "variant": "baseline",
                                     "seed": 0, "step": 1, "tokens": 1000.0,
                                     "val_exact_match": np.nan}])])  # a text run: no rows
    t = ls.tokens_to_learn(h).set_index(["seed", "threshold"])
    assert list(t.columns) == [c for c in ls.SPEED_COLUMNS if c not in ("seed", "threshold")]
    assert t.loc[(0, 0.5), ["tokens", "learned"]].tolist() == [3000.0, True]
    assert t.loc[(0, 0.9), ["tokens", "learned"]].tolist() == [4000.0, True]
    assert t.loc[(1, 0.5), ["tokens", "learned"]].tolist() == [1000.0, True]
    assert t.loc[(1, 0.9), ["tokens", "learned"]].tolist() == [3000.0, True]
    assert t.loc[(2, 0.5), ["tokens", "learned"]].tolist() == [4000.0, False]
    assert len(t) == 6 and set(t["dataset"]) == {"arithmetic"}
    assert ls.tokens_to_learn(h.drop(columns="val_exact_match")).empty
    # the study order of categorical columns, not the order of the files
    h2 = history({("rope", 0): [0.6], ("baseline", 0): [0.7]})
    h2["variant"] = pd.Categorical(h2["variant"], categories=["baseline", "rope"], ordered=True)
    assert ls.tokens_to_learn(h2)["variant"].astype(str).tolist() == ["baseline"] * 2 + [
        "rope"] * 2


def speed(rows):
    return pd.DataFrame([{"dataset": "arithmetic", "variant": v, "seed": s, "threshold": 0.5,
                          "tokens": t, "learned": ok} for v, s, t, ok in rows],
                        columns=ls.SPEED_COLUMNS)


def test_the_kaplan_meier_median_is_the_middle_seed_or_infinite_when_half_never_learn():
    all_learn = speed([("baseline", s, 1000.0 * (s + 1), True) for s in range(5)])
    few_learn = speed([("rope", 0, 1000.0, True), ("rope", 1, 2000.0, True)]
                      + [("rope", s, 5000.0, False) for s in (2, 3, 4)])
    t = ls.speed_table(pd.concat([all_learn, few_learn])).set_index("variant")
    # S(t) = 1 - k/5 after k events: first at or below 1/2 at the third, 3,000 tokens
    assert t.loc["baseline", ["n_seeds", "n_learned", "median_tokens"]].tolist() == [5, 5, 3000.0]
    assert t.loc["baseline", "median_low"] <= 3000.0 <= t.loc["baseline", "median_high"]
    assert t.loc["rope", "n_learned"] == 2 and math.isinf(t.loc["rope", "median_tokens"])
    assert t.loc["rope", "budget_tokens"] == 5000.0
    curves = ls.share_learned_curves(pd.concat([all_learn, few_learn]), "arithmetic", 0.5)
    c = curves["baseline"]
    assert c["share"].tolist() == pytest.approx([0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    assert (c["low"] <= c["share"] + 1e-12).all() and (c["share"] <= c["high"] + 1e-12).all()
    assert curves["rope"]["share"].iloc[-1] == pytest.approx(0.4)  # 2 of 5, the rest censored


def _log_rank_by_hand(base, var):
    """The log-rank chi-square of two groups of (tokens, learned), from its definition (Mantel
    1966): sum over event times of O - E for the second group, over the sum of the
    hypergeometric variances; and that O - E."""
    times = [t for t, d in base + var if d]
    o_e = v = 0.0
    for t in sorted(set(times)):
        n = sum(1 for x, _ in base + var if x >= t)
        n1 = sum(1 for x, _ in var if x >= t)
        d = sum(1 for x, e in base + var if e and x == t)
        d1 = sum(1 for x, e in var if e and x == t)
        o_e += d1 - d * n1 / n
        if n > 1:
            v += d * (n1 / n) * (1 - n1 / n) * (n - d) / (n - 1)
    return o_e ** 2 / v, o_e


def test_the_comparison_is_the_log_rank_test_and_counts_who_learned_first_per_seed():
    rows = []
    for s in range(8):
        rows.append(("baseline", s, 4000.0 + 100 * s, True))
        rows.append(("swiglu", s, 2000.0 + 100 * s, True))  # first on every seed, half the tokens
        rows.append(("rope", s, 5000.0, False) if s < 4 else ("rope", s, 4000.0 + 100 * s, True))
    c = ls.compare_speed(speed(rows)).set_index("variant")
    sw = c.loc["swiglu"]
    assert (sw["variant_first"], sw["baseline_first"], sw["ties"]) == (8, 0, 0)
    chi2, o_e = _log_rank_by_hand([(4000.0 + 100 * s, True) for s in range(8)],
                                  [(2000.0 + 100 * s, True) for s in range(8)])
    assert o_e > 0 and sw["p_value"] == pytest.approx(stats.chi2.sf(chi2, 1))
    assert sw["p_value"] < 2 / 2 ** 8  # every swiglu seed before every baseline seed
    # rope: the baseline first on 4 seeds (rope never learned), tied on 4 (same evaluation)
    rp = c.loc["rope"]
    assert (rp["variant_first"], rp["baseline_first"], rp["ties"]) == (0, 4, 4)
    chi2, o_e = _log_rank_by_hand(
        [(4000.0 + 100 * s, True) for s in range(8)],
        [(5000.0, False)] * 4 + [(4000.0 + 100 * s, True) for s in range(4, 8)])
    assert o_e < 0 and rp["p_value"] == pytest.approx(stats.chi2.sf(chi2, 1))
    assert rp["n_both"] == 4 and rp["ratio"] == pytest.approx(1.0)
    # Holm over the two: the smaller p doubled, the larger kept (or the first, if larger)
    low, high = sorted([sw["p_value"], rp["p_value"]])
    assert sorted([sw["p_holm"], rp["p_holm"]]) == pytest.approx([2 * low, max(2 * low, high)])
    # rope: 4 seeds censored past every baseline event, the other 4 as late: slower
    assert sw["verdict"] == ls.VERDICT_FASTER and rp["verdict"] == ls.VERDICT_SLOWER


def test_five_seeds_can_decide_where_the_sign_test_could_not():
    """Every variant seed learned before every baseline seed: the sign test's floor on 5 pairs
    is 0.0625; the log-rank test decides, and the direction follows who learned sooner."""
    rows = [r for s in range(5) for r in (("baseline", s, 3e6 + 1e5 * s, True),
                                           ("rope", s, 1e6 + 1e5 * s, True),
                                           ("swiglu", s, 5e6, False))]
    c = ls.compare_speed(speed(rows)).set_index("variant")
    assert c.loc["rope", "verdict"] == ls.VERDICT_FASTER and c.loc["rope", "p_holm"] < 0.05
    assert c.loc["swiglu", "verdict"] == ls.VERDICT_SLOWER and c.loc["swiglu", "p_holm"] < 0.05


def test_a_comparison_with_nothing_learned_has_p_one():
    rows = [r for s in range(5) for r in (("baseline", s, 5e6, False), ("rope", s, 5e6, False))]
    r = ls.compare_speed(speed(rows)).iloc[0]
    assert r["p_value"] == 1.0 and r["verdict"] == VERDICT_NSD


def test_a_spread_of_ratios_gives_an_interval_and_a_minimum_detectable_ratio():
    rng = np.random.default_rng(0)
    ratios = np.exp(rng.normal(np.log(0.8), 0.2, 6))
    rows = [r for s, q in enumerate(ratios) for r in (("baseline", s, 3000.0, True),
                                                       ("gelu", s, 3000.0 * q, True))]
    r = ls.compare_speed(speed(rows)).iloc[0]
    logs = np.log(ratios)
    low, high = stats.t.interval(0.95, 5, loc=logs.mean(), scale=stats.sem(logs))
    assert (r["ratio"], r["ratio_low"], r["ratio_high"]) == pytest.approx(
        (np.exp(logs.mean()), np.exp(low), np.exp(high)))
    assert r["mde_ratio"] > 1


def test_too_few_pairs_leave_no_test():
    rows = [("baseline", 0, 1000.0, True), ("rope", 0, 2000.0, True),
            ("baseline", 1, 1000.0, True), ("rope", 1, 2000.0, True)]
    r = ls.compare_speed(speed(rows)).iloc[0]
    assert r["verdict"] == VERDICT_FEW and math.isnan(r["p_value"])


def test_the_findings_bullet_gives_medians_and_comparisons():
    rows = []
    for s in range(5):
        rows += [("baseline", s, 2e6 if s < 3 else 4e6, s < 3), ("swiglu", s, 1e6, True)]
    sp = speed(rows)
    lines = findings.speed_lines((ls.speed_table(sp), ls.compare_speed(sp)), "arithmetic")
    assert len(lines) == 1
    text = lines[0]
    assert text.startswith("- **Learning speed** (training tokens until the probe's exact "
                           "match reaches 0.5; Kaplan-Meier median [95% CI]")
    assert "within the budget of 4.00M" in text
    assert "baseline 2.00M [" in text and "(3/5 seeds)" in text and "swiglu 1.00M" in text
    assert ("Against the baseline (log-rank test, Holm-corrected; per seed in "
            "`learning_speed_comparisons.csv`): swiglu faster (p_Holm = 0.0027, tokens ratio "
            "0.50 over 3 seeds).") in text
    assert findings.speed_lines((ls.speed_table(sp), ls.compare_speed(sp)), "shakespeare") == []


def test_the_power_script_rejects_at_a_large_ratio_and_rarely_at_none(capsys):
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "scripts" / "speed_power.py"
    spec = importlib.util.spec_from_file_location("speed_power", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main(["--ratios", "1", "3", "--seeds", "5", "8", "--studies", "60"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["| ratio | 5 seeds | 8 seeds |", "|---|---|---|"]
    none, large = ([float(c) for c in line.strip("|").split("|")[1:]] for line in lines[2:])
    assert all(p <= 0.05 for p in none)  # no effect: about the level (0.05 / 3)
    assert all(p >= 0.9 for p in large) and large[1] >= large[0]
