"""The learning rate at the full budget (lmablate.tune.lr_minimum and the bracket of
lmablate.tune.tuning): bracketing, the fitted minimum, the tuning uncertainty, and the verdicts it
turns undecided; driven by constructed curves instead of training."""

import math

import numpy as np
import pandas as pd
import pytest

from lmablate.report.stats.statistics import (VERDICT_BETTER, VERDICT_NSD, VERDICT_UNDECIDED_TUNING,
                                          VERDICT_WORSE, tuning_check)
from lmablate.tune import lr_minimum as lb
from lmablate.tune import bracket, rungs, search_space, tuning
from lmablate.tune.trials import summarise_study
from test_tuning import simulate, trial, with_tune


def curve(lr_opt, curvature=0.05, floor=2.0):
    """A loss quadratic in ln lr with its minimum ``floor`` at ``lr_opt``."""
    return lambda lr: floor + curvature * math.log(lr / lr_opt) ** 2


def points(f, lrs, noise=(0.0, 0.0)):
    return [lb.Point(lr, tuple(f(lr) + e for e in noise)) for lr in lrs]


def test_the_fitted_minimum_of_a_quadratic_in_log_lr_is_its_vertex():
    f = curve(0.013)
    fit = lb.fit_minimum(points(f, [0.005, 0.01, 0.02, 0.04]))
    assert fit.used == "vertex"
    assert fit.lr == pytest.approx(0.013, rel=1e-6)
    assert fit.loss == pytest.approx(2.0, abs=1e-9)
    assert fit.curve(0.026) == pytest.approx(f(0.026), abs=1e-9)


def test_the_exact_fit_recovers_a_parabola_with_rational_coefficients_to_the_bit():
    from fractions import Fraction
    x = [Fraction(k) for k in (-2, -1, 0, 1, 3)]
    y = [3 * xi ** 2 - 2 * xi + Fraction(1, 7) for xi in x]
    assert lb.quadratic_fit(x, y) == (3, -2, Fraction(1, 7))


def test_the_exact_fit_is_numpy_s_least_squares_to_rounding():
    from fractions import Fraction
    rng = np.random.default_rng(0)
    for n in (3, 4, 5):
        for _ in range(50):
            x = np.sort(rng.uniform(-6, -1, n))
            y = rng.uniform(1.5, 3.0, n)
            exact = lb.quadratic_fit([Fraction(v) for v in x], [Fraction(v) for v in y])
            assert [float(c) for c in exact] == pytest.approx(np.polyfit(x, y, 2),
                                                              rel=1e-7, abs=1e-9)


def test_the_fit_runs_no_blas_kernel_so_every_cpu_chooses_the_same_learning_rate(
        monkeypatch):
    """numpy's least squares (OpenBLAS) rounds by the CPU's kernel: the fit must not call it."""
    points = [lb.Point(lr, (loss,)) for lr, loss in
              ((0.004, 2.31), (0.008, 2.22), (0.016, 2.19), (0.032, 2.24))]
    before = lb.fit_minimum(points)

    def refuse(*args, **kwargs):
        raise AssertionError("a BLAS-backed numpy call")

    for name in ("polyfit", "polyval", "log", "mean", "var"):
        monkeypatch.setattr(np, name, refuse)
    monkeypatch.setattr(np.linalg, "lstsq", refuse)
    after = lb.fit_minimum(points)
    assert after == before and after.used == "vertex"


def test_the_exact_fit_needs_three_distinct_learning_rates():
    from fractions import Fraction
    with pytest.raises(ValueError, match="three distinct x, got 2"):
        lb.quadratic_fit([Fraction(1), Fraction(1), Fraction(2)], [Fraction(0)] * 3)


def test_the_fit_uses_the_best_point_and_two_neighbours_on_each_side():
    f = curve(0.01)
    lrs = [0.01 * 2 ** k for k in range(-4, 4)]
    far = {lrs[0]: 5.0, lrs[-1]: 7.0}  # far points off the curve must not move the vertex
    pts = [lb.Point(lr, (far.get(lr, f(lr)),)) for lr in lrs]
    fit = lb.fit_minimum(pts)
    assert fit.lrs == tuple(lrs[2:7])
    assert fit.lr == pytest.approx(0.01, rel=1e-6)


def test_a_concave_fit_or_too_few_points_takes_the_best_point_and_says_why():
    concave = [lb.Point(0.01, (2.0,)), lb.Point(0.02, (2.1,)), lb.Point(0.04, (2.05,))]
    assert lb.fit_minimum(concave).used == "best point"
    assert "not convex" in lb.fit_minimum(concave).note
    two = [lb.Point(0.01, (2.1,)), lb.Point(0.02, (2.0,))]
    fit = lb.fit_minimum(two)
    assert (fit.used, fit.lr, fit.loss) == ("best point", 0.02, 2.0)
    assert "too few" in fit.note


def test_a_fitted_minimum_below_zero_takes_the_best_point():
    """An arithmetic bracket of a default study: learned at one lr, not at the next lower; the
    parabola through them dips to -0.032 nats, which no cross-entropy reaches."""
    learned = [lb.Point(0.001645965971177556, (0.6064501966660645,)),
               lb.Point(0.003291931942355112, (0.016947569529431883,)),
               lb.Point(0.006583863884710224, (0.09596084169459207,))]
    fit = lb.fit_minimum(learned)
    assert (fit.used, fit.lr, fit.loss) == ("best point", learned[1].lr, learned[1].loss)
    assert fit.note == "the fitted minimum lies below 0"
    assert np.polyval(fit.coefficients, -fit.coefficients[1] / (2 * fit.coefficients[0])) < 0


def test_a_diverged_seed_makes_its_point_the_worst():
    p = lb.Point(0.1, (2.0, math.inf))
    assert p.loss == math.inf
    pts = [lb.Point(0.025, (2.2, 2.2)), lb.Point(0.05, (2.1, 2.1)), p]
    assert lb.next_lr(pts, 2.0, (1e-5, 1.0)) == (lb.BRACKETED, None)


@pytest.mark.parametrize("lrs, expected", [
    ([0.01, 0.02, 0.04], 0.005),   # the best is the lowest: one factor further down
    ([0.0001, 0.0002, 0.0004], 0.0008),  # the best is the highest: one factor up
])
def test_an_end_point_best_asks_for_one_more_learning_rate_that_way(lrs, expected):
    state, lr = lb.next_lr(points(curve(0.002 if lrs[0] > 0.005 else 0.01), lrs), 2.0,
                           (1e-5, 1.0))
    assert state == "extend"
    assert lr == pytest.approx(expected)


def test_an_extension_goes_to_the_hard_limit_and_no_further():
    assert lb.next_lr(points(curve(10.0), [0.15, 0.3, 0.6]), 2.0, (1e-5, 1.0)) == (
        "extend", 1.0)
    assert lb.next_lr(points(curve(10.0), [0.25, 0.5, 1.0]), 2.0, (1e-5, 1.0)) == (
        lb.AT_LIMIT, None)
    assert lb.next_lr(points(curve(1e-9), [1.5e-5, 3e-5]), 2.0, (1e-5, 1.0)) == (
        "extend", 1e-5)


def test_the_protocol_brackets_an_optimum_that_lies_past_the_first_full_budget_points():
    """The first rung favours a high lr (as short runs do), the full budget a 16x lower one:
    the bracket extends downwards until a worse point lies on each side of the best, each
    within the factor, and the answer is the fitted minimum, within 2% of the true one."""
    cfg = with_tune(rungs=((8, 0.125), (3, 1.0)), bracket_seeds=2, bracket_points=9)
    def objective(p, fraction):
        lr_opt = 0.04 if fraction < 1 else 0.0025
        return curve(lr_opt)(p["lr"]) + 0.3 * math.log(p["d_model"] / 32) ** 2 / 10

    results, order = simulate(cfg, objective)
    out = bracket.bracket_outcome(cfg, "arithmetic", results)
    assert out.state == lb.BRACKETED
    lrs = [p.lr for p in out.points]
    assert len(lrs) > 3  # it had to extend
    i = lb.best_index(out.points)
    assert 0 < i < len(lrs) - 1
    assert all(b / a == pytest.approx(2.0) for a, b in zip(lrs, lrs[1:]))
    assert out.fit.lr == pytest.approx(0.0025, rel=0.02)
    # every point trained on both tuning seeds, which are not the final seeds
    seeds = {rungs.slot_seed(cfg.tune, s) for s, t in results.items()
             if t.user_attrs[rungs.FRACTION] == 1.0}
    assert seeds == {cfg.tune.seed, cfg.tune.seed + 1}
    assert not seeds & set(cfg.seeds)
    # the width comparison, the middle lr's neighbours, then one batch per extension; those
    # after the bracket closed stayed empty
    assert sum(b.rung == 1 for b in order) == 2 + len(lrs) - 3


def test_the_bracket_stops_at_its_most_points_and_says_so():
    cfg = with_tune(rungs=((8, 0.125), (3, 1.0)), bracket_seeds=1, bracket_points=4)
    results, _ = simulate(cfg, lambda p, f: curve(1e-4)(p["lr"]))
    out = bracket.bracket_outcome(cfg, "arithmetic", results)
    assert len(out.points) == 4
    assert out.state == lb.OUT_OF_POINTS
    best, _ = summarise_study(cfg, "arithmetic", "baseline", "s", results, 20, 0,
                              search_space.width_ladder(cfg, "arithmetic"))
    assert any(flag.startswith("lr not bracketed") for flag in best["on_edge"])


def test_the_bracket_width_scales_the_first_rung_width_to_the_full_budget():
    cfg = with_tune(rungs=((8, 0.125), (3, 1.0)), d_model_choices=(16, 24, 32, 40, 48, 64))
    first = rungs.plan(cfg.tune)[0]
    # the first rung's best width is 16 at 1/8 of the budget: 16 * 8 ** 0.25 = 26.9 -> 24
    results = {0: trial(cfg, 0, first, {"lr": 0.01, "d_model": 16}, 2.0),
               1: trial(cfg, 1, first, {"lr": 0.01, "d_model": 32}, 2.1)}
    assert bracket.bracket_widths(cfg, "arithmetic", results, 1) == (24, 16)
    # 32 * 1.68 = 53.8 -> 48
    results[2] = trial(cfg, 2, first, {"lr": 0.01, "d_model": 32}, 1.9)
    assert bracket.bracket_widths(cfg, "arithmetic", results, 1) == (48, 32)


@pytest.mark.parametrize("full_budget_width", [24, 16])
def test_the_full_budget_decides_between_the_scaled_width_and_the_first_rungs(
        full_budget_width):
    """Short runs favour width 16 (scaled: 24); at the full budget the constructed loss is
    lowest at ``full_budget_width``. The bracket's first batch trains its middle lr at both,
    takes the better, and brackets the lr there."""
    cfg = with_tune(rungs=((8, 0.125), (3, 1.0)), d_model_choices=(16, 24, 32, 48),
                    bracket_points=7)

    def objective(p, fraction):
        best = 16 if fraction < 1 else full_budget_width
        return curve(0.01)(p["lr"]) + 0.2 * math.log(p["d_model"] / best) ** 2

    results = {}  # the first rung: 16 is best there
    for slot in range(8):
        p = {"lr": 0.02, "d_model": (16, 24, 32, 48)[slot % 4]}
        results[slot] = trial(cfg, slot, rungs.batch_of(cfg.tune, slot), p,
                              objective(p, 0.125))
    while (found := tuning.next_batch(cfg, "arithmetic", "baseline", results, 0)) is not None:
        batch, proposals = found
        assert batch.rung == 1
        for slot, p in proposals.items():
            results[slot] = trial(cfg, slot, batch, p, objective(p, 1.0))
    out = bracket.bracket_outcome(cfg, "arithmetic", results)
    assert bracket.bracket_widths(cfg, "arithmetic", results, 1) == (24, 16)
    assert out.width == full_budget_width and set(out.widths) == {16, 24}
    assert out.state == lb.BRACKETED and len(out.points) >= 3
    assert out.fit.lr == pytest.approx(0.01, rel=1e-6)
    trained = {t.params["d_model"] for t in results.values()
               if t.user_attrs[rungs.FRACTION] == 1.0}
    assert trained == {16, 24}


def test_the_tuning_uncertainty_grows_with_the_seed_spread_and_is_reproducible():
    f = curve(0.01, curvature=0.01)
    lrs = [0.0025, 0.005, 0.01, 0.02, 0.04]
    quiet = lb.tuning_uncertainty(points(f, lrs, (-0.001, 0.001)), 0.01)
    loud = lb.tuning_uncertainty(points(f, lrs, (-0.02, 0.02)), 0.01)
    assert quiet.spread == pytest.approx(math.sqrt(2) * 0.001)
    assert 0 <= quiet.median <= quiet.bound < loud.bound
    assert lb.tuning_uncertainty(points(f, lrs, (-0.02, 0.02)), 0.01) == loud
    assert lb.tuning_uncertainty(points(f, lrs), 0.01) is not None  # zero spread: no regret
    assert lb.tuning_uncertainty(points(f, lrs, (0.0,)), 0.01) is None  # one seed


def test_a_regret_is_the_rise_of_the_curve_above_its_minimum():
    f = curve(0.01, curvature=0.05)
    pts = points(f, [0.005, 0.01, 0.02], (-1e-9, 1e-9))
    u = lb.tuning_uncertainty(pts, 0.02)  # chosen a factor 2 off: regret 0.05 ln(2)^2
    assert u.median == pytest.approx(0.05 * math.log(2) ** 2, rel=1e-3)
    assert lb.sensitivity(lb.fit_minimum(pts)) == pytest.approx(0.05 * math.log(2) ** 2)


def _comparison(variant, low, high, verdict, metric="test_loss"):
    return {"dataset": "shakespeare", "metric": metric, "baseline": "baseline",
            "variant": variant, "ci_holm_low": low, "ci_holm_high": high,
            "mean_diff": (low + high) / 2, "verdict": verdict}


def _tuned(**uncertainties):
    return pd.DataFrame([{"dataset": "shakespeare", "variant": v, "bracket_state": "bracketed",
                          "tuning_uncertainty": u} for v, u in uncertainties.items()])


def test_a_verdict_inside_the_larger_tuning_uncertainty_reads_undecided():
    c = pd.DataFrame([
        _comparison("rmsnorm", 0.035, 0.089, VERDICT_WORSE),   # clears 0 by 0.035 < 0.04
        _comparison("rope", -0.15, -0.10, VERDICT_BETTER),     # clears 0 by 0.10 > 0.04
        _comparison("swiglu", -0.06, -0.01, VERDICT_BETTER),   # 0.01 < 0.03
        _comparison("gelu", -0.01, 0.02, VERDICT_NSD),
        _comparison("rmsnorm", 0.05, 0.09, VERDICT_WORSE, metric="exact_match"),
    ])
    out = tuning_check(c, _tuned(baseline=0.03, rmsnorm=0.04, rope=0.01, swiglu=0.02,
                                 gelu=0.01))
    assert list(out["verdict"]) == [VERDICT_UNDECIDED_TUNING, VERDICT_BETTER,
                                    VERDICT_UNDECIDED_TUNING, VERDICT_NSD, VERDICT_WORSE]
    assert out["tuning_uncertainty"].iloc[:4].tolist() == [0.04, 0.03, 0.03, 0.03]
    assert np.isnan(out["tuning_uncertainty"].iloc[4])  # not the tuning objective's metric


def test_an_unmeasured_tuning_uncertainty_leaves_no_verdict_and_no_bracket_leaves_it_be():
    c = pd.DataFrame([_comparison("rope", -0.15, -0.10, VERDICT_BETTER)])
    assert tuning_check(c, _tuned(baseline=None, rope=0.01))["verdict"].iloc[0] == \
        VERDICT_UNDECIDED_TUNING
    plain = pd.DataFrame([{"dataset": "shakespeare", "variant": v, "bracket_state": None,
                           "tuning_uncertainty": None} for v in ("baseline", "rope")])
    assert tuning_check(c, plain)["verdict"].iloc[0] == VERDICT_BETTER


def test_the_verdict_table_gives_an_undecided_verdict_its_tuning_uncertainty():
    from lmablate.report.text.findings import verdict_table

    row = {**_comparison("rmsnorm", 0.035, 0.089, VERDICT_UNDECIDED_TUNING),
           "variant_mean": 2.26, "baseline_mean": 2.20, "ci95_low": 0.04, "ci95_high": 0.085,
           "tuning_uncertainty": 0.041, "metric": "test_loss", "mde": 0.05}
    line = verdict_table(pd.DataFrame([row]), ["shakespeare"])[2]
    assert "| rmsnorm | undecided (tuning) | +0.062 (+2.8%) |" in line
    assert "| 0.041 |" in line and "**" not in line


def test_the_pooled_spread_weights_each_point_by_its_degrees_of_freedom():
    f = curve(0.01)
    quiet = points(f, [0.005, 0.01, 0.02], (-0.001, 0.001))  # sd sqrt(2) * 0.001 each
    loud = points(f, [0.005, 0.01, 0.02], (-0.004, 0.004))
    three = [lb.Point(0.01, (2.0, 2.01, 2.02))]  # sd 0.01, two degrees of freedom
    assert lb.pooled_spread([quiet]) == pytest.approx(lb.seed_spread(quiet))
    assert lb.pooled_spread([quiet, loud]) == pytest.approx(
        math.sqrt((2e-6 + 32e-6) / 2))
    assert lb.pooled_spread([quiet, three]) == pytest.approx(
        math.sqrt((3 * 2e-6 + 2 * 1e-4) / 5))
    assert lb.pooled_spread([[lb.Point(0.01, (2.0,))]]) is None  # one seed: no spread
    assert lb.pooled_spread([[lb.Point(0.01, (2.0, math.inf))], quiet]) == pytest.approx(
        lb.seed_spread(quiet))  # a diverged point has no spread to give


def _full_budget_trials(dataset, variant, d_model, pts):
    return [{"dataset": dataset, "variant": variant, "budget_fraction": 1.0,
             "params_lr": p.lr, "params_d_model": d_model, "seed": 1000 + k,
             "value": loss if math.isfinite(loss) else np.nan}
            for p in pts for k, loss in enumerate(p.losses)]


def test_the_report_draws_each_uncertainty_again_with_the_datasets_pooled_spread():
    from lmablate.report.stats.pooled_uncertainty import bracket_points, with_pooled_uncertainty
    from lmablate.report.run_files import TUNED_COLUMNS

    lrs = [0.005, 0.01, 0.02, 0.04]
    lucky = points(curve(0.01), lrs, (-0.0005, 0.0005))  # a study whose seeds agreed by chance
    noisy = points(curve(0.02, curvature=0.02), lrs, (-0.02, 0.02))
    rows = (_full_budget_trials("shakespeare", "rmsnorm", 24, lucky)
            + _full_budget_trials("shakespeare", "baseline", 24, noisy)
            + _full_budget_trials("shakespeare", "baseline", 16, noisy[:1])  # set-aside width
            + [{"dataset": "shakespeare", "variant": "rmsnorm", "budget_fraction": 0.125,
                "params_lr": 0.3, "params_d_model": 24, "seed": 1000, "value": 2.5}])
    trials = pd.DataFrame(rows)
    assert bracket_points(trials, "shakespeare", "rmsnorm", 24) == lucky  # a round trip

    def row(variant, pts, **more):
        fit = lb.fit_minimum(pts)
        own = lb.tuning_uncertainty(pts, fit.lr)
        return {**dict.fromkeys(TUNED_COLUMNS), "dataset": "shakespeare", "variant": variant,
                "lr": fit.lr, "d_model": 24, "bracket_state": lb.BRACKETED,
                "seed_spread": lb.seed_spread(pts), "regret": own.median,
                "tuning_uncertainty": own.bound, **more}

    tuned = pd.DataFrame([row("baseline", noisy), row("rmsnorm", lucky),
                          {**row("rope", lucky), "bracket_state": None}], columns=TUNED_COLUMNS)
    out = with_pooled_uncertainty(tuned, trials)
    spread = lb.pooled_spread([noisy, lucky])
    assert out["seed_spread_pooled"].iloc[:2].tolist() == pytest.approx([spread, spread])
    for i, pts in ((0, noisy), (1, lucky)):
        again = lb.tuning_uncertainty(pts, tuned.at[i, "lr"], spread=spread)
        assert (out.at[i, "regret"], out.at[i, "tuning_uncertainty"]) == (
            again.median, again.bound)
    assert out.at[1, "tuning_uncertainty"] > 5 * tuned.at[1, "tuning_uncertainty"]
    assert out.iloc[2].equals(tuned.iloc[2])  # no bracket: left as it was
    assert with_pooled_uncertainty(tuned, trials).equals(out)
    assert with_pooled_uncertainty(tuned, trials.iloc[0:0]).equals(tuned)


def test_with_one_tuning_seed_the_final_seeds_give_the_spread_and_join_the_pool():
    """A bracket of single-seed points measures no spread; the final seeds' last objective
    (here the probe's answer loss, as best.json's objective says) does, pooled by degrees of
    freedom with any point of two seeds or more."""
    from lmablate.report.run_files import TUNED_COLUMNS
    from lmablate.report.stats.pooled_uncertainty import final_points, with_pooled_uncertainty

    lrs = [0.002, 0.004, 0.008]
    single = points(curve(0.004), lrs, (0.0,))
    trials = pd.DataFrame(_full_budget_trials("arithmetic", "baseline", 24, single))
    fit = lb.fit_minimum(single)
    assert lb.tuning_uncertainty(single, fit.lr) is None  # one seed: not measurable alone
    tuned = pd.DataFrame([{**dict.fromkeys(TUNED_COLUMNS), "dataset": "arithmetic",
                           "variant": "baseline", "lr": fit.lr, "d_model": 24,
                           "objective": "val_answer_loss", "bracket_state": lb.BRACKETED}],
                         columns=TUNED_COLUMNS)
    finals = [0.02, 0.05, 0.03, 0.09, 0.01]
    history = pd.DataFrame(
        [{"dataset": "arithmetic", "variant": "baseline", "seed": s, "step": step,
          "val_loss": 0.6, "val_answer_loss": 9.0 if step == 100 else finals[s]}
         for s in range(5) for step in (100, 2399)])
    assert final_points(history, tuned, "arithmetic") == [lb.Point(fit.lr, tuple(finals))]
    out = with_pooled_uncertainty(tuned, trials, history)
    assert out.at[0, "seed_spread_pooled"] == pytest.approx(np.std(finals, ddof=1))
    again = lb.tuning_uncertainty(single, fit.lr, spread=np.std(finals, ddof=1))
    assert out.at[0, "tuning_uncertainty"] == pytest.approx(again.bound)
    assert with_pooled_uncertainty(tuned, trials).equals(tuned.assign(
        seed_spread_pooled=tuned["seed_spread_pooled"].astype(float)))  # nothing to pool
    two = points(curve(0.004), lrs, (-0.01, 0.01))  # a two-seed bracket joins the pool
    both = with_pooled_uncertainty(
        tuned, pd.DataFrame(_full_budget_trials("arithmetic", "baseline", 24, two)), history)
    assert both.at[0, "seed_spread_pooled"] == pytest.approx(
        lb.pooled_spread([two, [lb.Point(fit.lr, tuple(finals))]]))


def test_a_run_mean_objective_pools_each_final_seeds_mean_and_checks_no_verdict():
    """Tuned on the mean answer loss over a run (``tune.arithmetic_objective: mean``), a final
    seed's point is its mean over its evaluations (a NaN one leaves the variant out), and the
    tuning uncertainty, in that unit, turns no verdict undecided."""
    from lmablate.report.run_files import TUNED_COLUMNS
    from lmablate.report.stats.pooled_uncertainty import final_points

    tuned = pd.DataFrame([{**dict.fromkeys(TUNED_COLUMNS), "dataset": "arithmetic",
                           "variant": v, "lr": 0.004, "d_model": 24,
                           "objective": "val_answer_loss_mean", "bracket_state": lb.BRACKETED,
                           "tuning_uncertainty": 0.5} for v in ("baseline", "rope")],
                         columns=TUNED_COLUMNS)
    curves = {0: [0.9, 0.3, 0.0], 1: [1.0, 1.0, 0.7], 2: [0.8, 0.1, 0.3]}
    history = pd.DataFrame(
        [{"dataset": "arithmetic", "variant": "baseline", "seed": s, "step": 100 * (k + 1),
          "val_answer_loss": v} for s, c in curves.items() for k, v in enumerate(c)]
        + [{"dataset": "arithmetic", "variant": "rope", "seed": 0, "step": 100 * (k + 1),
            "val_answer_loss": v} for k, v in enumerate([0.9, float("nan"), 0.2])])
    (point,) = final_points(history, tuned, "arithmetic")
    assert point.lr == 0.004
    assert point.losses == pytest.approx([0.4, 0.9, 0.4])
    c = pd.DataFrame([{**_comparison("rope", -0.9, -0.6, VERDICT_BETTER, "answer_loss"),
                       "dataset": "arithmetic"},
                      {**_comparison("rope", -0.9, -0.6, VERDICT_BETTER), "dataset": "arithmetic"}])
    out = tuning_check(c, tuned.assign(tuning_uncertainty=[0.5, 0.7]))
    assert list(out["verdict"]) == [VERDICT_BETTER, VERDICT_BETTER]
    assert out["tuning_uncertainty"].isna().all()
