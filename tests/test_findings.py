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
from test_render import _content

from lmablate.report.stats.statistics import ALPHA, POWER, compare, min_detectable_effect
from lmablate.report.stats.convergence import convergence_table
from lmablate.report.text import findings as fi
from lmablate.report.text.content import DatasetFindings
from lmablate.report.text.render import render_report

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


def _row(lines: list[str], variant: str) -> list[str]:
    """The cells of ``variant``'s row of a verdict table."""
    return next(x for x in lines if f"| {variant} |" in x).strip("|").split(" | ")


def test_a_clear_winner_gets_its_verdict_effect_and_intervals_from_the_comparisons_row(
        comparisons):
    lines = fi.verdict_table(comparisons, ["text"])
    r = comparisons[comparisons["variant"] == "winner"].iloc[0]
    assert r["verdict"] == "better"
    share = r["mean_diff"] / r["baseline_mean"]  # Δ as a share of the baseline, its sign kept
    assert lines[0].startswith("| dataset: headline metric | variant | verdict | Δ (% of ")
    assert len(lines) == 2 + 2 + 1  # header, rule, winner and noisy, the closing blank line
    cells = [c.strip() for c in _row(lines, "winner")]
    assert cells[1:] == ["winner", "**▲ better**", f"{r['mean_diff']:+.3f} ({share:+.1%})",
                         f"[{r['ci_holm_low']:.3f}, {r['ci_holm_high']:.3f}]",
                         f"{r['mde']:.3f}", "not checked (another unit)", "–"]
    assert fi.verdict_table(comparisons.iloc[:0], ["text"]) == []
    lines = fi.findings_section(comparisons, datasets=["text"])
    assert not any("winner" in x for x in lines)  # the verdict is the table's, said once
    # the heading "## Findings" is the template's (test_render.py); the lines open with the
    # dataset's own sentence
    assert lines[0].startswith("**text**: test loss (nats/char, lower is better) of every variant")


def test_a_variant_compared_at_another_tuned_width_is_named_with_both_widths_and_steps(
        comparisons):
    ablation = _ablation().assign(d_model=24, steps=2085)
    assert not [x for x in fi.findings_section(comparisons, datasets=["text"],
                                               ablation=ablation) if "another width" in x]
    ablation.loc[ablation["variant"] == "noisy", ["d_model", "steps"]] = (32, 1239)
    lines = fi.findings_section(comparisons, datasets=["text"], ablation=ablation)
    assert ("- **Compared at another width**: noisy at d_model 32 (1,239 steps), against the "
            "baseline's d_model 24 (2,085 steps). Each variant runs at its tuned width on the "
            "same budget, so such a difference is the variant's at its best width, not the "
            "feature's at one width.") in lines


def test_an_undecided_pair_names_the_seeds_that_would_decide_it(comparisons):
    lines = fi.findings_section(comparisons, datasets=["text"])
    r = comparisons[comparisons["variant"] == "noisy"].iloc[0]
    assert r["verdict"] == "no significant difference"
    undecided = next(x for x in lines if x.startswith("- **Too few seeds"))
    need = fi.seeds_needed(r["mean_diff"], r["sd_diff"], 2)
    assert need is not None and need > 5
    assert undecided.startswith("- **Too few seeds to decide: noisy.**")
    assert undecided.endswith(f"noisy about {need:,} (SD {r['sd_diff']:.3f}); the study has 5.")
    assert not any(x.startswith("- **Too few seeds") for x in fi.findings_section(
        comparisons[comparisons["variant"] != "noisy"], datasets=["text"]))


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
    conv = convergence_table(history)
    text = conv[conv["dataset"] == "text"]
    assert (text["seeds_falling"] == 5).all() and (text["from_step"] == 800).all()
    assert np.allclose(text["drop"], 0.2)
    flat = conv[conv["dataset"] == "flat"]
    assert (flat["seeds_falling"] < flat["seeds"]).all()
    lines = fi.findings_section(comparisons, datasets=["text"], convergence=conv)
    assert any(x.startswith("- **Validation loss was still falling when training stopped** for "
                            "every variant: over the last 20% of training (from step 800) it "
                            "fell on every seed, by 0.200 to 0.200 nats/char.") for x in lines)
    lines = fi.findings_section(comparisons.assign(dataset="flat"), datasets=["flat"],
                                convergence=conv)
    assert "- Validation loss had levelled off: over the last 20% of training no variant fell on " \
           "every seed." in lines


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
    lines = fi.findings_section(comparisons, datasets=["text"],
                                extrapolation=extrapolation, length=length,
                                positions={"baseline": "learned", "winner": "alibi"})
    assert ("- **Past the training context** the test loss of winner (alibi) falls from 2.100 "
            "at 1x to 2.050 at 4x; baseline cannot run past the context (a learned table of "
            "positions).") in lines
    assert ("- **Past the trained operand length** exact match goes from 0.50–0.70 at 2 digits "
            "(trained) to at most 0.00 at 3 and 4 digits, over every variant.") in lines


def test_the_figure_that_shows_the_verdicts_follows_them(comparisons):
    lines = fi.findings_section(comparisons, datasets=["text"])
    assert lines[-1] == "" and not any(x.startswith("![") for x in lines)
    # the template places the forest plot right after the dataset's lines
    findings = DatasetFindings("text", lines, "test loss", "figures/forest_text.png")
    md = render_report(_content(findings=[findings]))
    assert md.split("## Findings\n\n", 1)[1].split("### How to read", 1)[0] == (
        "\n".join(lines) + "\n![text: test loss, difference to the baseline with 95% and "
        "Holm-adjusted intervals](figures/forest_text.png)\n\n")


def test_the_console_verdict_lines_list_decided_variants_then_the_undecided(comparisons):
    r = comparisons[comparisons["variant"] == "winner"].iloc[0]
    assert fi.verdict_lines(comparisons, ["text"]) == [
        f"text, test loss (nats/char): winner better {r['mean_diff']:+.3f} "
        f"[{r['ci_holm_low']:.3f}, {r['ci_holm_high']:.3f}]; no significant difference: noisy"]


def _references(trigram: float) -> pd.DataFrame:
    """references.csv of dataset ``text``: the n-gram losses, the trigram at ``trigram``."""
    return pd.DataFrame([{"dataset": "text", "reference": name, "metric": "test_loss",
                          "value": value, "detail": "KN"}
                         for name, value in (("unigram", 3.3), ("bigram", 2.5),
                                             ("trigram", trigram))])


def test_a_verdict_between_models_above_the_trigram_says_so_in_its_own_sentence(comparisons):
    # every mean is 2.1 to 2.3: a trigram at 2.5 is beaten by all, at 2.0 by none
    assert comparisons[["variant_mean", "baseline_mean"]].stack().between(2.0, 2.5).all()
    lines = fi.verdict_table(comparisons, ["text"], references=_references(2.0))
    assert _row(lines, "winner")[-1].strip() == "neither past the trigram 2.000"
    assert _row(lines, "noisy")[-1].strip() == "neither past the trigram 2.000"
    lines = fi.verdict_table(comparisons, ["text"], references=_references(2.5))
    assert not any("trigram" in x for x in lines)
    assert not any("trigram" in x for x in fi.verdict_table(comparisons, ["text"]))


def test_the_caveat_names_the_one_side_that_is_not_past_the_trigram(comparisons):
    r = comparisons[comparisons["variant"] == "winner"].iloc[0]
    between = (r["variant_mean"] + r["baseline_mean"]) / 2  # winner below it, baseline not
    lines = fi.verdict_table(comparisons, ["text"], references=_references(between))
    assert _row(lines, "winner")[-1].strip() == f"baseline not past the trigram {between:.3f}"
    assert fi.reference_caveat("v", 2.2, 2.1, 2.15, "nats/char") == (
        "v is not past the trigram reference, 2.150 nats/char, baseline is: one side of the "
        "comparison has learned little more than trigram counts")
    assert fi.reference_caveat("v", 2.1, 2.1, 2.15, "nats/char") == ""
    assert fi.reference_caveat("v", 2.15, 2.2, 2.15, "nats/char", short=True) == \
        "neither past the trigram 2.150"  # at the reference is not past it


def test_arithmetic_answer_loss_verdicts_get_no_trigram_caveat(comparisons):
    """The trigram is a test-loss reference: it does not speak to the answer loss."""
    answer = comparisons.assign(metric="answer_loss")
    refs = _references(9.0)
    lines = fi.verdict_table(answer, ["text"], references=refs)
    assert _row(lines, "winner")[2] == "**▲ better**"
    assert not any("trigram" in x for x in lines)
    assert "trigram" not in fi.verdict_lines(answer, ["text"], refs)[0]


def test_an_unknown_verdict_is_stated_as_written_never_as_better_or_worse(comparisons):
    c = comparisons.copy()
    c.loc[c["variant"] == "winner", "verdict"] = "not judged"
    lines = fi.verdict_table(c, ["text"])
    assert _row(lines, "winner")[2] == "not judged"
    assert not any("▲" in x or "▼" in x for x in lines)
    assert fi.verdict_lines(c, ["text"]) == [
        "text, test loss (nats/char): not judged: winner; "
        "no significant difference: noisy"]
    c.loc[c["variant"] == "winner", "verdict"] = "undecided (tuning)"
    c["tuning_uncertainty"] = 0.2
    cells = _row(fi.verdict_table(c, ["text"]), "winner")
    assert cells[2] == "undecided (tuning)" and cells[6] == "0.200"


def test_the_console_lines_carry_the_trigram_caveat_per_comparison(comparisons):
    r = comparisons[comparisons["variant"] == "winner"].iloc[0]
    assert fi.verdict_lines(comparisons, ["text"], _references(2.0)) == [
        f"text, test loss (nats/char): winner better {r['mean_diff']:+.3f} "
        f"[{r['ci_holm_low']:.3f}, {r['ci_holm_high']:.3f}] (neither past the trigram 2.000); "
        "no significant difference: noisy (neither past the trigram 2.000)"]


def test_a_side_that_did_not_learn_on_every_seed_limits_its_verdicts(comparisons):
    success = pd.DataFrame([{"dataset": "text", "variant": v, "n_learned": k, "n_seeds": 5}
                            for v, k in (("baseline", 4), ("winner", 5), ("noisy", 2))])
    lines = fi.verdict_table(comparisons, ["text"], success=success)
    assert _row(lines, "winner")[-1].strip() == "baseline learned on 4/5 seeds"
    assert _row(lines, "noisy")[-1].strip() == \
        "baseline learned on 4/5 seeds; noisy learned on 2/5 seeds"
    assert _row(fi.verdict_table(comparisons, ["text"]), "noisy")[-1].strip() == "–"
