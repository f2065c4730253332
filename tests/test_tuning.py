"""The tuning protocol on its own (lmablate.tune.tuning): rungs, proposals, promotion, edges and
widths, driven by constructed objectives instead of training."""

import dataclasses
import re
import math
from pathlib import Path

import optuna
import pytest

from lmablate.config import params
from lmablate.config.study import ConfigError
from lmablate.train import budget
from lmablate.tune import bracket, rungs, search_space, tuning

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = params.load(ROOT / "params.yaml")


def with_tune(cfg=DEFAULT, **changes):
    return dataclasses.replace(cfg, tune=dataclasses.replace(cfg.tune, **changes))


def trial(cfg, slot, batch, p, value):
    """A finished trial of ``slot``: COMPLETE with ``value``, or diverged when it is None."""
    attrs = {rungs.SLOT: slot, rungs.RUNG: batch.rung, rungs.FRACTION: batch.fraction}
    if value is None:
        attrs[rungs.OUTCOME] = rungs.DIVERGED
    return optuna.trial.create_trial(
        params=p, distributions=search_space.trial_distributions(cfg.tune), user_attrs=attrs,
        state=optuna.trial.TrialState.FAIL if value is None else optuna.trial.TrialState.COMPLETE,
        value=value)


def simulate(cfg, objective, dataset="arithmetic", variant="baseline", sampler_seed=0):
    """Run the protocol to its end with ``objective(params, budget_fraction)`` in place of
    training; returns (results by slot, the batches in the order they were proposed)."""
    results, order = {}, []
    while (found := tuning.next_batch(cfg, dataset, variant, results, sampler_seed)) is not None:
        batch, proposals = found
        order.append(batch)
        for slot, p in proposals.items():
            results[slot] = trial(cfg, slot, batch, p, objective(p, batch.fraction))
    return results, order


def bowl(lr_opt, d_opt=None):
    """A loss with its minimum at ``lr_opt`` (and ``d_opt``), lower with more compute."""
    def objective(p, fraction):
        width = 0.0 if d_opt is None else 0.5 * math.log(p["d_model"] / d_opt) ** 2
        return 1.0 + math.log(p["lr"] / lr_opt) ** 2 / 10 + width + 0.2 / fraction
    return objective


def test_rungs_end_at_the_full_budget_with_the_first_rung_in_batches():
    tune = DEFAULT.tune
    assert tune.rungs == ((8, 0.125), (3, 1.0))
    assert (tune.bracket_seeds, tune.bracket_points) == (1, 5)
    batches = rungs.plan(tune)
    # the bracket, each learning rate on 1 seed: the middle one at two widths, the two others,
    # then up to 2 more learning rates
    assert [(b.rung, b.fraction, list(b.slots)) for b in batches] == [
        (0, 0.125, [0, 1, 2, 3]), (0, 0.125, [4, 5, 6, 7]),
        (1, 1.0, [8, 9]), (1, 1.0, [10, 11]), (1, 1.0, [12]), (1, 1.0, [13])]
    assert rungs.n_slots(tune) == 14
    assert rungs.batch_of(tune, 13).index == 5
    assert {rungs.slot_seed(tune, s) for s in range(14)} == {1000}
    two = dataclasses.replace(tune, bracket_seeds=2)  # a second seed per learning rate
    assert [list(b.slots) for b in rungs.plan(two)][2:4] == [[8, 9, 10, 11], [12, 13, 14, 15]]
    assert [rungs.slot_seed(two, s) for s in (8, 9, 10, 11)] == [1000, 1001, 1000, 1001]
    with pytest.raises(ValueError, match="slot 14 is not one of the study's 14 slots"):
        rungs.batch_of(tune, 14)



@pytest.mark.parametrize("rungs", [[[8, 0.5]], [[8, 0.25], [2, 0.5]], [[2, 0.5], [4, 1.0]],
                                   [[8, 0.5], [2, 0.25], [1, 1.0]], [[0, 1.0]], [],
                                   [[8, 0.0], [1, 1.0]], [[8, "0.5"], [1, 1.0]], [8, 1.0]])
def test_rungs_that_do_not_end_at_the_full_budget_or_grow_are_refused(rungs):
    with pytest.raises(ConfigError, match=r"^params: tune.rungs=.* is not allowed; expected a "
                       r"list of \[trials, share of the budget\] pairs"):
        dataclasses.replace(DEFAULT.tune, rungs=rungs)


def test_every_trial_warms_up_before_the_loss_it_is_judged_on():
    """Warm-up is a share of a run's steps, so a trial of 1/8 of the budget warms up over 1/8 of
    the steps; the lowest rung gives every width the study may search at least tune.min_steps
    steps, and the loss a rung judges (at its last step) comes after the warm-up."""
    for dataset in DEFAULT.datasets:
        for d_model in search_space.width_ladder(DEFAULT, dataset):
            # the dataset's own window: the default arithmetic's 16 x 64
            model = DEFAULT.for_dataset(dataset).model_config("llama", 70, d_model=d_model)
            for _, fraction in DEFAULT.tune.rungs:
                steps = budget.trial_steps(DEFAULT, dataset, model, fraction)
                warmup = DEFAULT.train.warmup_steps(steps)
                assert steps >= DEFAULT.tune.min_steps
                assert 1 <= warmup <= math.ceil(DEFAULT.train.warmup_fraction * steps)
                assert warmup < steps // 2, (dataset, d_model, fraction, steps, warmup)


def test_a_lowest_rung_too_short_to_leave_its_warm_up_is_refused_before_any_work():
    cfg = with_tune(rungs=((8, 0.01), (2, 1.0)))
    model = cfg.model_config("baseline", 70, d_model=56)
    written = re.escape(f"{cfg.train.budget_flops['shakespeare']:.3g}")
    with pytest.raises(ConfigError, match=(
            rf"^params: train.budget_flops.shakespeare={written} x tune.rungs\[0\] share 0.01 buys "
            r"\d+ steps of a tuning trial at d_model=56; allowed: at least tune.min_steps=30 "
            r"steps")):
        budget.trial_steps(cfg, "shakespeare", model)


def test_widths_follow_the_budget_within_the_range_of_tokens_per_parameter():
    """The derived widths are every multiple of 2 n_heads (up to n_widths) whose tokens per
    parameter lie in the range, narrowest first; sixteen times the compute gives wider ones."""
    low, high = DEFAULT.tune.tokens_per_parameter
    step = 2 * DEFAULT.model.n_heads
    for dataset in DEFAULT.datasets:
        widths = search_space.initial_space(DEFAULT, dataset).d_model_choices
        ratios = [search_space.tokens_per_parameter(DEFAULT, dataset, d) for d in widths]
        assert widths and all(d % step == 0 for d in widths)
        assert all(low <= r <= high for r in ratios), (dataset, widths, ratios)
        assert list(widths) == sorted(widths) and len(widths) <= DEFAULT.tune.n_widths
        # the neighbours outside the ladder fall outside the range
        assert search_space.tokens_per_parameter(DEFAULT, dataset, widths[0] - step) > high
        assert search_space.tokens_per_parameter(DEFAULT, dataset, widths[-1] + step) < low
    # the default keeps Shakespeare at d_model 24 and arithmetic at 24 or 32
    assert search_space.initial_space(DEFAULT, "shakespeare").d_model_choices == (24,)
    assert search_space.initial_space(DEFAULT, "arithmetic").d_model_choices == (24, 32)
    # sixteen times the compute: wider models, not the same ones
    bigger = dataclasses.replace(DEFAULT, train=dataclasses.replace(
        DEFAULT.train, budget_flops={k: 16 * v for k, v in DEFAULT.train.budget_flops.items()}))
    for dataset in DEFAULT.datasets:
        before = search_space.initial_space(DEFAULT, dataset).d_model_choices
        after = search_space.initial_space(bigger, dataset).d_model_choices
        assert min(after) > max(before) / 2 and max(after) > max(before)


def test_the_shared_design_is_the_same_for_every_variant_and_later_batches_are_not():
    cfg = DEFAULT
    first = {v: tuning.propose(cfg, "shakespeare", v, {}, rungs.plan(cfg.tune)[0], 0)
             for v in ("baseline", "rope")}
    assert first["baseline"] == first["rope"]
    lrs = [p["lr"] for p in first["baseline"].values()]
    assert len({p["d_model"] for p in first["baseline"].values()}) == 1
    steps = [math.log(b / a) for a, b in zip(lrs, lrs[1:])]
    assert all(math.isclose(s, math.log(100) / 4) for s in steps)  # evenly spaced in log
    assert cfg.tune.lr_low <= min(lrs) and max(lrs) <= cfg.tune.lr_high
    # a re-tuning replicate (another sampler seed) tries other points
    other = tuning.propose(cfg, "shakespeare", "baseline", {}, rungs.plan(cfg.tune)[0], 1)
    assert other != first["baseline"]
    # the same results, two variants: TPE's next proposals differ (each study its own seed)
    batch0 = rungs.plan(cfg.tune)[0]
    results = {s: trial(cfg, s, batch0, p, 2.0 + 0.1 * s)
               for s, p in first["baseline"].items()}
    second = {v: tuning.propose(cfg, "shakespeare", v, results, rungs.plan(cfg.tune)[1], 0)
              for v in ("baseline", "rope")}
    assert second["baseline"] != second["rope"]
    assert second["baseline"] == tuning.propose(cfg, "shakespeare", "baseline", results,
                                                rungs.plan(cfg.tune)[1], 0)


def test_a_batch_is_not_proposed_before_the_batches_before_it_finish():
    batches = rungs.plan(DEFAULT.tune)
    with pytest.raises(RuntimeError, match=r"batch 1 proposed before slots \[0, 1, 2, 3\]"):
        tuning.propose(DEFAULT, "arithmetic", "baseline", {}, batches[1], 0)


def test_promotion_takes_the_best_completed_trials_by_value_then_slot():
    cfg = with_tune(rungs=((8, 0.125), (2, 0.5), (2, 1.0)))
    batches = rungs.plan(cfg.tune)
    values = [3.0, None, 1.5, 2.0, 1.5, 4.0, None, 2.5]  # two diverged, a tie at 1.5
    results = {}
    for s, v in enumerate(values):
        b = batches[0] if s < 4 else batches[1]
        results[s] = trial(cfg, s, b, {"lr": 1e-3 * (s + 1), "d_model": 32}, v)
    promoted = rungs.promote(cfg.tune, results, 1)
    assert [t.user_attrs[rungs.SLOT] for t in promoted] == [2, 4]
    proposals = tuning.propose(cfg, "arithmetic", "baseline", results, batches[2], 0)
    assert proposals == {8: results[2].params, 9: results[4].params}


def test_the_answer_is_the_fitted_minimum_of_the_full_budget_points():
    cfg = DEFAULT
    results, order = simulate(cfg, bowl(0.01))
    best = tuning.chosen(cfg.tune, results)
    assert best.user_attrs[rungs.FRACTION] == 1.0 and best.user_attrs[rungs.RUNG] == 1
    assert [b.index for b in order][:3] == [0, 1, 2]
    full = [t for t in results.values() if t.user_attrs[rungs.FRACTION] == 1.0]
    assert best.value == min(t.value for t in full) and len(full) >= 3 * cfg.tune.bracket_seeds
    out = bracket.bracket_outcome(cfg, "arithmetic", results)
    assert out.fit.used == "vertex" and out.fit.lr == pytest.approx(0.01, rel=1e-6)


def test_when_every_full_budget_trial_diverges_the_answer_says_it_was_not_trained_there():
    cfg = DEFAULT

    def objective(p, fraction):
        return None if fraction == 1.0 else bowl(0.01)(p, fraction)

    results, _ = simulate(cfg, objective)
    best = tuning.chosen(cfg.tune, results)
    assert best.user_attrs[rungs.FRACTION] == 0.125
    assert tuning.chosen(cfg.tune, {}) is None


def test_an_optimum_above_the_range_extends_it_within_the_hard_limit():
    """The constructed loss is lowest at lr 0.5, outside [1e-3, 1e-1]: the design's best point
    sits on the upper edge, so the next batch searches up to 1 (tune.lr_limits), and the
    answer lies above the configured range."""
    cfg = DEFAULT
    results, order = simulate(cfg, bowl(0.5))
    space = search_space.space_for_batch(cfg, "arithmetic", results, order[-1])
    assert "lr up to 1" in space.extended
    assert (space.lr_low, space.lr_high) == (1e-3, 1.0)
    first = [t for t in results.values() if t.user_attrs[rungs.SLOT] in range(4, 8)]
    assert max(t.params["lr"] for t in first) > cfg.tune.lr_high  # TPE searched the new part
    best = tuning.chosen(cfg.tune, results)
    assert best.params["lr"] > cfg.tune.lr_high


def test_an_extension_stops_at_the_hard_limit_and_the_answer_is_flagged_there():
    cfg = with_tune(lr_limits=(1e-5, 0.1))
    results, order = simulate(cfg, bowl(5.0))
    space = search_space.space_for_batch(cfg, "arithmetic", results, order[-1])
    assert not [e for e in space.extended if e.startswith("lr")] and space.lr_high == 0.1
    best = tuning.chosen(cfg.tune, results)
    assert search_space.on_edge(space, best.params, cfg.tune)[0] == (
        "lr at upper bound 0.1 (the limit tune.lr_limits)")
    out = bracket.bracket_outcome(cfg, "arithmetic", results)
    assert out.state == "at the limit tune.lr_limits" and max(p.lr for p in out.points) == 0.1


def test_a_width_optimum_below_the_range_adds_a_narrower_width():
    """Three batches at the first rung: after the second, the best width is the smallest
    choice, and the third batch may try one step narrower."""
    # a range whose ladder reaches below the first widths searched
    cfg = with_tune(tokens_per_parameter=(2.5, 40.0), tokens_per_parameter_limits=(1.0, 100.0),
                    rungs=((12, 0.125), (3, 1.0)))
    narrow = search_space.width_ladder(cfg, "shakespeare")[0]
    assert narrow < search_space.initial_space(cfg, "shakespeare").d_model_choices[0]
    results, order = simulate(cfg, bowl(0.01, d_opt=narrow / 2), dataset="shakespeare")
    space = search_space.space_for_batch(cfg, "shakespeare", results, order[-1])
    assert f"d_model {narrow} added" in space.extended
    assert space.d_model_choices[0] == narrow
    assert search_space.tokens_per_parameter(cfg, "shakespeare", narrow) <= 100
    # an answer at the narrowest width the ladder allows is flagged at the limit, one at the
    # narrowest width searched but not the ladder's end is flagged without it
    ladder = search_space.width_ladder(cfg, "shakespeare")
    assert search_space.on_edge(space, {"lr": 0.01, "d_model": narrow}, cfg.tune, ladder) == [
        "d_model the smallest choice (the limit tune.tokens_per_parameter_limits)"]
    first = search_space.initial_space(cfg, "shakespeare")
    assert search_space.on_edge(first, {"lr": 0.01, "d_model": first.d_model_choices[0]}, cfg.tune,
                          ladder) == ["d_model the smallest choice"]


def test_explicit_widths_are_searched_as_given_and_never_extended():
    cfg = with_tune(d_model_choices=(32, 48))
    results, order = simulate(cfg, bowl(0.01, d_opt=8))
    space = search_space.space_for_batch(cfg, "arithmetic", results, order[-1])
    assert space.d_model_choices == (32, 48)
    assert "d_model the smallest choice" in search_space.on_edge(
        space, {"lr": 0.01, "d_model": 32}, cfg.tune)
    # 32 on 1/8 of the budget scales to 48 at all of it; the full budget prefers 32 here
    out = bracket.bracket_outcome(cfg, "arithmetic", results)
    assert bracket.bracket_widths(cfg, "arithmetic", results, 1) == (48, 32)
    assert out.width == 32 and out.widths[32] < out.widths[48]


def test_the_protocol_is_a_pure_function_of_the_results():
    a, _ = simulate(DEFAULT, bowl(0.02, d_opt=40), dataset="shakespeare", variant="rope")
    b, _ = simulate(DEFAULT, bowl(0.02, d_opt=40), dataset="shakespeare", variant="rope")
    assert {s: t.params for s, t in a.items()} == {s: t.params for s, t in b.items()}
    c, _ = simulate(DEFAULT, bowl(0.02, d_opt=40), dataset="shakespeare", variant="llama")
    assert {s: t.params for s, t in a.items()} != {s: t.params for s, t in c.items()}


def test_a_tuning_stage_says_after_each_batch_how_far_it_is_and_its_best_so_far():
    from lmablate.tune.trials import progress_line
    first = rungs.plan(DEFAULT.tune)[0]
    results = {0: trial(DEFAULT, 0, first, {"lr": 0.004, "d_model": 24}, 0.61),
               1: trial(DEFAULT, 1, first, {"lr": 0.02, "d_model": 32}, 0.58),
               2: trial(DEFAULT, 2, first, {"lr": 0.3, "d_model": 32}, None)}
    # the first rung's 8 and the bracket's 3 learning rates + 1 on 2 seeds; up to 5 of them
    assert progress_line(DEFAULT, "arithmetic", "rope", results) == (
        "tune arithmetic/rope: 3 of 12 (up to 14) trials done, 1 diverged; best so far "
        "val_answer_loss_mean 0.5800 (lr 0.02, d_model 32, rung 0, 0.125 of the budget)")
    assert progress_line(DEFAULT, "shakespeare", "rope", {2: results[2]}) == (
        "tune shakespeare/rope: 1 of 12 (up to 14) trials done, 1 diverged")
    more = {slot: trial(DEFAULT, slot, first, {"lr": 0.01, "d_model": 24}, 1.0 + slot)
            for slot in range(18)}
    assert progress_line(DEFAULT, "shakespeare", "rope", more).startswith(
        "tune shakespeare/rope: 18 trials done (12 planned, extended up to 14); best so far "
        "val_loss 1.0000")


def test_an_arithmetic_trial_is_worth_its_mean_answer_loss_over_the_run_or_its_last():
    """``tune.arithmetic_objective`` names the objective; with ``mean`` a trial's value is the
    mean of its reports in index order (the area under its curve per unit of compute), which
    lies between their lowest and highest; otherwise, and on text, the last evaluation's."""
    final = with_tune(arithmetic_objective="final")
    assert tuning.study_objective(DEFAULT, "arithmetic") == "val_answer_loss_mean"
    assert tuning.study_objective(final, "arithmetic") == "val_answer_loss"
    assert {tuning.study_objective(c, "shakespeare") for c in (DEFAULT, final)} == {"val_loss"}
    reports = {3: 0.25, 1: 1.0, 2: 0.75, 4: 0.0}
    assert tuning.trial_value("val_answer_loss_mean", reports, 0.01) == 0.5
    assert tuning.trial_value("val_answer_loss", reports, 0.01) == 0.01
    assert tuning.trial_value("val_loss", reports, 2.1) == 2.1
    assert tuning.trial_value("val_answer_loss_mean", {}, 0.3) == 0.3  # nothing reported
    # one learning rate, two seeds: one learned late (final ~0), one not (final ~1); the means
    # differ by how far each curve fell, not by a jump of 1
    late, never = {1: 1.0, 2: 0.9, 3: 0.8, 4: 0.02}, {1: 1.0, 2: 0.95, 3: 0.9, 4: 0.9}
    assert (tuning.trial_value("val_answer_loss_mean", never, 0.9)
            - tuning.trial_value("val_answer_loss_mean", late, 0.02)) < 0.3
    with pytest.raises(ConfigError, match=r"tune.arithmetic_objective=.*choose one of final, mean"):
        with_tune(arithmetic_objective="last")


@pytest.mark.parametrize("choices", [(16,), (16, 32)])
def test_the_brackets_second_batch_runs_alongside_its_first_only_at_one_width(choices):
    """runs_alongside proposes what next_batch proposes once the first batch is done, and only
    for the bracket's first batch when its two widths are one."""
    cfg = with_tune(DEFAULT, d_model_choices=choices)
    results, order = simulate(cfg, bowl(0.01, 24))
    first, second = [b for b in order if rungs.is_bracket(cfg.tune, b.rung)][:2]
    before = {s: t for s, t in results.items() if s < first.slots.start}
    beside = tuning.runs_alongside(cfg, "arithmetic", before, first)
    scaled, below = bracket.bracket_widths(cfg, "arithmetic", before, first.rung)
    if scaled != below:
        assert beside is None
        return
    assert beside is not None and beside[0] == second
    after = {s: t for s, t in results.items() if s < second.slots.start}
    assert beside[1] == tuning.next_batch(cfg, "arithmetic", "baseline", after, 0)[1]
    # no other batch runs alongside another
    for batch in order:
        if batch != first:
            done = {s: t for s, t in results.items() if s < batch.slots.start}
            assert tuning.runs_alongside(cfg, "arithmetic", done, batch) is None
