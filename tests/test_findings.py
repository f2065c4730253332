"""The report's "Findings": every sentence rests on a row of the report's tables.

A constructed study on one dataset: ``winner`` beats the baseline by 0.1 nats/char on every seed
(a clear verdict), ``noisy`` differs by a little against a large seed spread (undecided), and
the validation curves of a second dataset are flat at the end while the first's still fall.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from statsmodels.stats.power import TTestPower

from lmablate.analysis import findings as fi
from lmablate.analysis.statistics import ALPHA, POWER, compare, min_detectable_effect

SEEDS = range(5)
BASE = [2.20, 2.21, 2.19, 2.22, 2.18]
NOISE = [0.35, -0.15, 0.25, -0.10, 0.15]  # paired differences of the undecided variant


def _ablation() -> pd.DataFrame:
    rows = []
    for s in SEEDS:
        rows += [{"dataset": "text", "variant": "baseline", "seed": s, "test_loss": BASE[s]},
                 {"dataset": "text", "variant": "winner", "seed": s,
                  "test_loss": BASE[s] - 0.1 + 0.002 * s},
                 {"dataset": "text", "variant": "noisy", "seed": s,
                  "test_loss": BASE[s] + NOISE[s]}]
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def comparisons() -> pd.DataFrame:
    return compare(_ablation())


def _history(dataset: str, falling: bool) -> pd.DataFrame:
    """Validation every 100 steps to 1,000: falling to the end, or flat after step 500 with
    seed noise (so that some seeds rise at the end)."""
    rows = []
    for variant in ("baseline", "winner", "noisy"):
        for s in SEEDS:
            for step in range(100, 1001, 100):
                loss = 3.0 - step / 1000 if falling else 3.0 - min(step, 500) / 1000
                if not falling and step == 1000:
                    loss += 0.01 * (1 if s % 2 else -1)
                rows.append({"dataset": dataset, "variant": variant, "seed": s, "step": step,
                             "val_loss": loss})
    return pd.DataFrame(rows)


def test_a_clear_winner_gets_its_verdict_effect_and_intervals_from_the_comparisons_row(
        comparisons):
    lines = fi.findings_section(comparisons, datasets=["text"],
                                order=["baseline", "winner", "noisy"])
    r = comparisons[comparisons["variant"] == "winner"].iloc[0]
    assert r["verdict"] == "better"
    expected = (f"- **winner: better**, {r['mean_diff']:+.3f} nats/char ({r['variant_mean']:.3f} "
                f"against {r['baseline_mean']:.3f}; 95% CI [{r['ci95_low']:.3f}, "
                f"{r['ci95_high']:.3f}], Holm-adjusted [{r['ci_holm_low']:.3f}, "
                f"{r['ci_holm_high']:.3f}]).")
    assert expected in lines
    assert lines[0] == fi.TITLE


def test_an_effect_within_the_tuning_luck_is_flagged_as_such(comparisons):
    variation = pd.DataFrame([{"dataset": "text", "variant": "baseline", "metric": "test_loss",
                               "mean_diff": 0.05, "ci95_low": -0.02, "ci95_high": 0.15}])
    lines = fi.findings_section(comparisons, datasets=["text"], order=["baseline", "winner"],
                                variation=variation)
    winner = next(x for x in lines if x.startswith("- **winner"))
    assert winner.endswith("No larger than the change re-tuning the baseline made (0.150): it "
                           "may owe as much to the tuner as to the feature.")
    lines = fi.findings_section(comparisons, datasets=["text"], order=["baseline", "winner"],
                                variation=variation.assign(ci95_high=0.08))
    assert "tuner" not in next(x for x in lines if x.startswith("- **winner"))


def test_an_undecided_pair_names_the_seeds_that_would_decide_it(comparisons):
    lines = fi.findings_section(comparisons, datasets=["text"],
                                order=["baseline", "winner", "noisy"])
    r = comparisons[comparisons["variant"] == "noisy"].iloc[0]
    assert r["verdict"] == "no significant difference"
    undecided = next(x for x in lines if x.startswith("- **Undecided"))
    need = fi.seeds_needed(r["mean_diff"], r["sd_diff"], 2)
    assert need is not None and need > 5
    assert undecided.startswith("- **Undecided: noisy.**")
    assert (f"noisy about {need:,} (Δ {r['mean_diff']:+.3f}, SD of its per-seed differences "
            f"{r['sd_diff']:.3f}); the study has 5.") in undecided
    assert f"differences of {r['mde']:.3f} nats/char or more (MDE)" in undecided
    assert not any(x.startswith("- **Undecided") for x in fi.findings_section(
        comparisons[comparisons["variant"] != "noisy"], datasets=["text"],
        order=["baseline", "winner"]))


@pytest.mark.parametrize("diff, sd, m", [(0.05, 0.1, 1), (0.04, 0.2, 3), (1.0, 0.5, 2)])
def test_seeds_needed_is_the_smallest_count_that_reaches_the_power(diff, sd, m):
    n = fi.seeds_needed(diff, sd, m)
    power = lambda k: TTestPower().power(effect_size=diff / sd, nobs=k, alpha=ALPHA / m)
    assert power(n) >= POWER
    assert n == 2 or power(n - 1) < POWER


def test_seeds_needed_round_trips_the_minimum_detectable_effect():
    for n in (5, 8, 12, 30):  # (at 3 pairs statsmodels' noncentral t is NaN near the answer)
        mde = min_detectable_effect(0.3, n, ALPHA / 3)
        assert fi.seeds_needed(mde * 1.0001, 0.3, 3) == n


def test_seeds_needed_has_no_answer_without_a_difference_or_past_the_cap():
    assert fi.seeds_needed(0.0, 0.1, 1) is None
    assert fi.seeds_needed(0.1, 0.0, 1) is None
    assert fi.seeds_needed(0.001, 1.0, 3) is None  # effect 0.001 SD: far past 1,000 seeds


def test_a_curve_still_falling_on_every_seed_is_said_and_a_flat_one_is_not(comparisons):
    history = pd.concat([_history("text", falling=True), _history("flat", falling=False)])
    conv = fi.convergence_table(history)
    text = conv[conv["dataset"] == "text"]
    assert (text["seeds_falling"] == 5).all() and (text["from_step"] == 800).all()
    assert np.allclose(text["drop"], 0.2)
    flat = conv[conv["dataset"] == "flat"]
    assert (flat["seeds_falling"] < flat["seeds"]).all()
    lines = fi.findings_section(comparisons, datasets=["text"], order=["baseline"],
                                convergence=conv)
    assert any(x.startswith("- **Validation loss was still falling when training stopped** for "
                            "every variant: over the last 20% of training (from step 800) it "
                            "fell on every seed, by 0.200 to 0.200 nats/char.") for x in lines)
    lines = fi.findings_section(comparisons.assign(dataset="flat"), datasets=["flat"],
                                order=["baseline"], convergence=conv)
    assert "- Validation loss had levelled off: over the last 20% of training no variant fell on " \
           "every seed." in lines


def test_the_gradient_finding_names_the_group_that_splits_the_variants(comparisons):
    grad = pd.DataFrame(
        [{"dataset": "text", "variant": v, "seed": s, "group": g, "frac_near_zero": x}
         for s in SEEDS
         for v, ffn in (("baseline", 0.5), ("winner", 0.0), ("noisy", 0.56))
         for g, x in (("wte", 0.2), ("blocks.1.ffn", ffn))])
    table = fi.gradient_table(grad)
    assert list(table.columns) == fi.GRAD_COLUMNS and (table["seeds"] == 5).all()
    lines = fi.findings_section(comparisons, datasets=["text"],
                                order=["baseline", "winner", "noisy"], gradients=table)
    assert ("- **Near-zero gradients differ between variants** (after the last step, mean over "
            "seeds): in `blocks.1.ffn`, 50% to 56% of gradient entries are near zero for "
            "baseline and noisy, against 0% or less for winner: parameters that no longer "
            "receive a gradient.") in lines
    even = table.assign(frac_near_zero=0.3)  # the same everywhere: no contrast, no finding
    assert not any("Near-zero" in x for x in fi.findings_section(
        comparisons, datasets=["text"], order=["baseline"], gradients=even))


def test_extrapolation_and_length_findings_come_from_their_tables(comparisons):
    extrapolation = pd.DataFrame([
        {"dataset": "text", "variant": "baseline", "factor": 1, "mean": 2.2},
        {"dataset": "text", "variant": "baseline", "factor": 2, "mean": np.nan},
        {"dataset": "text", "variant": "winner", "factor": 1, "mean": 2.1},
        {"dataset": "text", "variant": "winner", "factor": 4, "mean": 2.05}])
    length = pd.DataFrame([
        {"dataset": "text", "variant": v, "digits": d, "split": split, "mean": x}
        for v in ("baseline", "winner")
        for d, split, x in ((2, "test", 0.5 if v == "baseline" else 0.7), (3, "length", 0.0),
                            (4, "length", 0.0))])
    lines = fi.findings_section(comparisons, datasets=["text"], order=["baseline", "winner"],
                                extrapolation=extrapolation, length=length,
                                positions={"baseline": "learned", "winner": "alibi"})
    assert ("- **Past the training context** the test loss of winner (alibi) falls from 2.100 "
            "at 1x to 2.050 at 4x; baseline cannot run past the context (a learned table of "
            "positions).") in lines
    assert ("- **Past the trained operand length** exact match goes from 0.50–0.70 at 2 digits "
            "(trained) to at most 0.00 at 3 and 4 digits, over every variant.") in lines


def test_the_figure_that_shows_the_verdicts_follows_them(comparisons):
    lines = fi.findings_section(comparisons, datasets=["text"], order=["baseline", "winner"],
                                figures={"text": "figures/forest_text.png"})
    assert lines[-2] == ("![text: test loss, difference to the baseline with 95% and "
                         "Holm-adjusted intervals](figures/forest_text.png)")


def test_the_console_verdict_lines_list_decided_variants_then_the_undecided(comparisons):
    r = comparisons[comparisons["variant"] == "winner"].iloc[0]
    assert fi.verdict_lines(comparisons, ["text"]) == [
        f"text, test loss (nats/char): winner better {r['mean_diff']:+.3f} "
        f"[{r['ci_holm_low']:.3f}, {r['ci_holm_high']:.3f}]; no significant difference: noisy"]
