"""A scaling study: several budgets per dataset, each variant's loss against compute fitted, the
trend of every effect, the isoFLOP view, and a tiny multi-budget study end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lmablate.config import params
from lmablate.config.study import ConfigError, TrainConfig, budget_label
from lmablate.report.stats import isoflop as iso
from lmablate.report.stats import scaling as sc
from lmablate.report.text.scaling_section import SEED_SCALE_FLOPS
from lmablate.train.budget import stage_budgets

from conftest import budget_for, profile_config

ROOT = Path(__file__).resolve().parents[1]
BUDGETS = np.array([1e9, 3e9, 1e10, 3e10, 1e11, 3e11])
E, A, ALPHA = 1.5, 400.0, 0.27  # a law of the size the default study's Shakespeare curves have


def study(effects: dict[str, np.ndarray], n_seeds: int = 5, noise: float = 0.004,
          budgets: np.ndarray = BUDGETS, seed: int = 0) -> pd.DataFrame:
    """Runs of a scaling study drawn from the law above: every variant's loss is the law plus
    its effect at each budget, a per-seed offset shared by all budgets, and noise."""
    rng = np.random.default_rng(seed)
    rows = []
    for variant, effect in effects.items():
        for s in range(n_seeds):
            offset = rng.normal(0, noise)
            for c, d in zip(budgets, effect):
                rows.append({"dataset": "shakespeare", "variant": variant, "seed": s,
                             "budget_flops": c, "test_loss": sc.power_law(c, E, A, ALPHA) + d
                             + offset + rng.normal(0, noise / 2)})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------ fitting

def test_the_saturating_fit_recovers_e_a_and_alpha_from_noisy_points():
    df = study({"baseline": np.zeros(len(BUDGETS))})
    means = df.groupby("budget_flops")["test_loss"].mean()
    e, a, alpha = sc.fit_power_law(means.index, means.to_numpy())
    assert e == pytest.approx(E, abs=0.05)
    assert alpha == pytest.approx(ALPHA, rel=0.1)
    # A and alpha trade off; the curve they draw is what must come back
    assert np.allclose(sc.power_law(BUDGETS, e, a, alpha), sc.power_law(BUDGETS, E, A, ALPHA),
                       atol=0.01)


def test_the_bootstrap_interval_over_seeds_covers_the_true_law():
    fits, boot = sc.fit_curves(study({"baseline": np.zeros(len(BUDGETS))}),
                               {"shakespeare": "test_loss"})
    row = fits.iloc[0]
    assert row["form"] == sc.SATURATING and row["n_bootstrap"] > 900
    assert row["E_low"] <= E <= row["E_high"]
    assert row["alpha_low"] <= ALPHA <= row["alpha_high"]
    assert boot[("shakespeare", "baseline")].shape == (sc.N_BOOTSTRAP, 3)


def test_a_fit_is_the_same_numbers_on_every_run():
    df = study({"baseline": np.zeros(len(BUDGETS)), "rope": np.full(len(BUDGETS), -0.05)})
    first, _ = sc.fit_curves(df, {"shakespeare": "test_loss"})
    second, _ = sc.fit_curves(df.sample(frac=1, random_state=3), {"shakespeare": "test_loss"})
    pd.testing.assert_frame_equal(first, second)


def test_three_budgets_fit_only_a_log_log_line_and_say_so():
    df = study({"baseline": np.zeros(3)}, budgets=BUDGETS[:3])
    fits, _ = sc.fit_curves(df, {"shakespeare": "test_loss"})
    row = fits.iloc[0]
    assert row["form"] == sc.LOG_LINEAR and row["E"] == 0
    assert "a log-log line only" in row["note"] and "needs 4" in row["note"]
    with pytest.raises(ValueError, match="at least 4 budgets"):
        sc.fit_power_law(BUDGETS[:3], [3.0, 2.5, 2.2])


def test_one_budget_fits_nothing():
    fits, boot = sc.fit_curves(study({"baseline": np.zeros(1)}, budgets=BUDGETS[:1]),
                               {"shakespeare": "test_loss"})
    assert fits.iloc[0]["form"] == "" and "nothing to fit" in fits.iloc[0]["note"]
    assert boot == {}


def test_a_log_log_line_through_a_pure_power_law_is_exact():
    a, alpha = sc.fit_log_linear(BUDGETS, 50 * BUDGETS ** -0.1)
    assert a == pytest.approx(50) and alpha == pytest.approx(0.1)


# ------------------------------------------------------------------------------------- trends

def test_growing_shrinking_and_flat_effects_get_their_trend():
    n = len(BUDGETS)
    df = study({"baseline": np.zeros(n),
                "grows": -0.01 - 0.02 * np.arange(n),    # better and better
                "shrinks": -0.12 + 0.02 * np.arange(n),  # better, less so with compute
                "flat": np.full(n, -0.03)})
    trends = sc.effect_trends(df, {"shakespeare": "test_loss"}).set_index("variant")
    assert trends.loc["grows", "trend"] == sc.TREND_GROWS
    assert trends.loc["shrinks", "trend"] == sc.TREND_SHRINKS
    assert trends.loc["flat", "trend"] == sc.TREND_NONE
    # per decade of compute: 0.02 per budget, budgets about half a decade apart
    per_decade = 0.02 / np.mean(np.diff(np.log10(BUDGETS)))
    assert trends.loc["grows", "slope"] == pytest.approx(-per_decade, rel=0.1)
    assert trends.loc["shrinks", "slope_holm_low"] > 0
    assert trends.loc["flat", "slope_holm_low"] < 0 < trends.loc["flat", "slope_holm_high"]
    # shrinks: -0.12 + 0.02 i is 0 at i = 6, past the last budget: no crossing
    assert all(np.isnan(trends["crossing_flops"]))


def test_curves_that_cross_within_the_budgets_say_where():
    deltas = np.array([-0.04, -0.02, 0.02, 0.04])
    at = sc.crossing(BUDGETS[:4], deltas)
    assert at == pytest.approx(10 ** ((np.log10(3e9) + np.log10(1e10)) / 2))
    assert math.isnan(sc.crossing(BUDGETS[:4], np.abs(deltas)))
    # back and forth across 0 is noise, not a crossing
    assert math.isnan(sc.crossing(BUDGETS[:4], np.array([0.01, -0.01, 0.01, -0.01])))


def test_a_crossing_is_stated_only_where_the_effect_has_a_trend():
    n = len(BUDGETS)
    df = study({"baseline": np.zeros(n),
                "crosses": 0.05 - 0.02 * np.arange(n),  # worse, then better: 0 at i = 2.5
                "wobbles": 0.004 * np.array([1, -1, 1, 1, -1, 1])})  # slope 0
    trends = sc.effect_trends(df, {"shakespeare": "test_loss"}).set_index("variant")
    expected = 10 ** np.interp(2.5, np.arange(n), np.log10(BUDGETS))
    assert trends.loc["crosses", "crossing_flops"] == pytest.approx(expected, rel=0.3)
    assert trends.loc["wobbles", "trend"] == sc.TREND_NONE
    assert math.isnan(trends.loc["wobbles", "crossing_flops"])


def test_a_fit_without_a_floor_says_so():
    df = study({"baseline": np.zeros(len(BUDGETS))})
    noise = np.random.default_rng(1).normal(0, 1e-4, len(df))
    df["test_loss"] = 30 * df["budget_flops"] ** -0.1 * (1 + noise)  # no floor at all
    fits, _ = sc.fit_curves(df, {"shakespeare": "test_loss"})
    assert fits.iloc[0]["note"].startswith("E at its lower bound 0")


def test_an_effect_at_each_budget_is_the_one_budget_comparison():
    n = len(BUDGETS)
    df = study({"baseline": np.zeros(n), "rope": np.full(n, -0.05)})
    effects = sc.effects_by_budget(df, {"shakespeare": "test_loss"})
    assert sorted(effects["budget_flops"]) == sorted(BUDGETS)
    assert (effects["verdict"] == "better").all()
    assert np.allclose(effects["mean_diff"], -0.05, atol=0.01)


def test_an_extrapolation_carries_paired_intervals_for_the_difference():
    n = len(BUDGETS)
    df = study({"baseline": np.zeros(n), "rope": np.full(n, -0.05)})
    fits, boot = sc.fit_curves(df, {"shakespeare": "test_loss"})
    ex = sc.extrapolate(fits, boot, {"shakespeare": 1e13}).set_index("variant")
    assert ex.loc["baseline", "predicted"] == pytest.approx(
        sc.power_law(1e13, *fits.iloc[0][["E", "A", "alpha"]]))
    assert math.isnan(ex.loc["baseline", "delta"])
    assert ex.loc["rope", "delta_low"] <= ex.loc["rope", "delta"] <= ex.loc["rope", "delta_high"]


# ------------------------------------------------------------------------------------ isoFLOP

def test_the_compute_optimal_width_is_the_parabola_s_vertex():
    widths = np.array([16, 24, 32, 48, 64])
    loss = 2.0 + 0.3 * (np.log(widths) - np.log(30)) ** 2
    width, method = iso.optimal_width(widths, loss)
    assert width == pytest.approx(30) and method == iso.PARABOLA
    # still falling at the widest: no vertex among the widths, the best one measured
    assert iso.optimal_width(widths, -np.log(widths)) == (64.0, iso.BEST)
    assert iso.optimal_width(widths[:2], [2.1, 2.0]) == (24.0, iso.BEST)


def test_isoflop_points_take_each_width_s_best_trial_of_the_lowest_rung():
    trials = pd.DataFrame({
        "dataset": "shakespeare", "variant": "baseline", "budget_flops": 1e10,
        "rung": [0, 0, 0, 1], "budget_fraction": [0.25, 0.25, 0.25, 1.0],
        "state": "COMPLETE", "value": [2.5, 2.3, 2.4, 2.0], "params_d_model": [16, 16, 24, 16],
        "params_lr": [0.01, 0.02, 0.01, 0.02]})
    points = iso.isoflop_points(trials)
    assert points[["d_model", "val_loss", "lr", "n_trials"]].values.tolist() == [
        [16, 2.3, 0.02, 2], [24, 2.4, 0.01, 1]]
    assert (points["trial_flops"] == 2.5e9).all()


def test_widths_tried_at_one_lr_are_left_out_of_the_vertex_where_three_others_exist():
    widths = [12, 16, 20, 24, 32]
    loss = list(2.0 + 0.3 * (np.log(widths) - np.log(18)) ** 2)
    loss[-1] = 1.9  # one lucky-looking, once-tried width pulls a fit of all five
    points = pd.DataFrame({"dataset": "shakespeare", "variant": "baseline",
                           "budget_flops": 1e10, "trial_flops": 2.5e9, "d_model": widths,
                           "val_loss": loss, "lr": 0.01, "n_trials": [2, 2, 2, 2, 1]})
    optimal = iso.optimal_widths(points, pd.DataFrame(columns=["dataset", "variant",
                                                                "budget_flops", "d_model"]))
    assert optimal.iloc[0]["optimal_d_model"] == pytest.approx(18, rel=0.02)
    assert optimal.iloc[0]["method"] == iso.PARABOLA


# ------------------------------------------------------------------------------------- config

def test_a_budget_list_must_increase_and_be_distinct_in_its_labels():
    for bad in ([3e10, 1e10], [1e10, 1.01e10]):
        with pytest.raises(ConfigError, match=r"train\.budget_flops\.shakespeare=.*increasing"):
            TrainConfig(budget_flops={"shakespeare": bad})
    with pytest.raises(ConfigError, match=r"budget_flops\.shakespeare\[1\]='x'"):
        TrainConfig(budget_flops={"shakespeare": [1e10, "x"]})


def test_one_budget_in_a_list_is_the_one_budget_study():
    one = TrainConfig(budget_flops={"shakespeare": 1e11})
    listed = TrainConfig(budget_flops={"shakespeare": [1e11]})
    assert one == listed and one.at_budget("shakespeare", 1e11) == one


def test_a_run_sees_one_budget_of_a_scaling_study():
    train = TrainConfig(budget_flops={"shakespeare": [1.1e10, 3.3e10], "arithmetic": 3e11})
    assert train.budgets("shakespeare") == (1.1e10, 3.3e10)
    assert train.at_budget("shakespeare", 3.3e10).for_dataset("shakespeare").budget_flops == {
        "shakespeare": 3.3e10}
    with pytest.raises(ConfigError, match="one budget is needed here"):
        train.for_dataset("shakespeare")
    with pytest.raises(ConfigError, match="has no budget 1e\\+10"):
        train.at_budget("shakespeare", 1e10)


def test_budget_labels_name_folders_without_a_plus():
    assert [budget_label(b) for b in (1.1e10, 3e9, 1e11, 6.1023e13)] == [
        "1.1e10", "3e9", "1e11", "6.1e13"]


def test_the_scaling_profile_spaces_four_budgets_3x_apart_up_to_the_default_s():
    """The profile stops at 1e11 FLOPs, the default's Shakespeare budget, so its largest
    budget is the default study's."""
    scaling = profile_config("scaling")
    default = params.load(ROOT / "params.yaml")
    budgets = scaling.budgets("shakespeare")
    assert len(budgets) == 4 and budgets[-1] == default.headline_budget("shakespeare") == 1e11
    assert np.allclose(np.diff(np.log10(budgets)), np.log10(3), atol=0.02)
    assert len(scaling.study_variants) == 6
    assert [label for _, label in stage_budgets(default, "shakespeare")] == [None]


def test_the_extrapolation_target_is_the_seed_scale_profile_s_budget():
    seed_scale = profile_config("seed-scale")
    assert SEED_SCALE_FLOPS == seed_scale.headline_budget("shakespeare")


# ---------------------------------------------------------------------------- end to end

@pytest.fixture(scope="module")
def scaling_study(tmp_path_factory, make_project):
    """A tiny study at four budgets: tuned, trained and evaluated by the stages, reported."""
    from lmablate.stages import evaluate, report, train, tune
    from lmablate.tracking.trackers import make_tracker
    root = tmp_path_factory.mktemp("scaling")
    budgets = [budget_for(4), budget_for(12), budget_for(36), budget_for(108)]
    project = make_project(root, {"study": {"seeds": [0, 1, 2]},
                                  "train": {"budget_flops": {"arithmetic": budgets}}})
    cfg, tokens = project.cfg, root / "tokens"
    tracker = make_tracker(cfg.tracking)
    for variant in cfg.study_variants:
        run = root / "runs" / "arithmetic" / variant
        tune.run(cfg, "arithmetic", variant, tokens, run / "best.json", run / "trials.csv",
                 tracker)
        train.run(cfg, "arithmetic", variant, tokens, run / "best.json", run / "checkpoints",
                  run / "history.csv", run / "grad_stats.csv")
        evaluate.run(cfg, "arithmetic", variant, tokens, root / "raw", run / "checkpoints",
                     run / "metrics.json", run / "examples.json", tracker)
    paths = report.build_report(cfg, root / "runs", root / "reports")
    return cfg, root, budgets, paths


def test_a_scaling_study_tunes_trains_and_evaluates_every_variant_at_every_budget(
        scaling_study):
    cfg, root, budgets, _ = scaling_study
    labels = [budget_label(b) for b in budgets]
    for variant in cfg.study_variants:
        run = root / "runs" / "arithmetic" / variant
        best = json.loads((run / "best.json").read_text())
        assert [e["budget_flops"] for e in best["budgets"]] == budgets
        trials = pd.read_csv(run / "trials.csv")
        assert sorted(trials["budget_flops"].unique()) == budgets
        metrics = json.loads((run / "metrics.json").read_text())["runs"]
        assert sorted(metrics) == sorted(f"{label}/seed_{s}" for label in labels
                                         for s in cfg.seeds)
        for label, budget in zip(labels, budgets):
            seed_dir = run / "checkpoints" / label / "seed_0"
            summary = json.loads((seed_dir / "result.json").read_text())["summary"]
            assert summary["budget_flops"] == budget
            assert abs(summary["train_flops"] / budget - 1) < 0.01  # each budget spent
        history = pd.read_csv(run / "history.csv")
        assert sorted(history["budget_flops"].unique()) == budgets


def test_a_scaling_study_s_report_draws_its_verdicts_at_the_largest_budget(scaling_study):
    cfg, root, budgets, paths = scaling_study
    ablation = pd.read_csv(paths["ablation"])
    assert (ablation["budget_flops"] == budgets[-1]).all()
    assert len(ablation) == len(cfg.study_variants) * len(cfg.seeds)
    text = paths["report"].read_text()
    assert "## How the effects change with compute" in text
    assert "The verdicts are drawn at the largest of 4 budgets" in text
    findings = text.split("## What this study")[0]
    assert "**Across 4 budgets**" in findings  # the trend is part of the answer, up top
    assert "### An extrapolation, not a measurement" in text
    for name in ("scaling_curves", "scaling_effects", "scaling_isoflop"):
        assert f"figures/{name}.png" in text and (root / "reports/figures" / f"{name}.png")\
            .stat().st_size > 10_000
    fits = pd.read_csv(paths["scaling_fits"])
    assert set(fits["form"]) == {sc.SATURATING} and (fits["n_budgets"] == 4).all()
    trends = pd.read_csv(paths["scaling_trends"])
    assert list(trends["variant"]) == ["rope"] and trends["n_budgets"].iloc[0] == 4
    effects = pd.read_csv(paths["scaling_effects"])
    assert sorted(effects["budget_flops"]) == budgets


def test_a_scaling_study_s_dvc_metrics_carry_the_budget(scaling_study):
    _, root, budgets, _ = scaling_study
    metrics = root / "reports" / "metrics" / "arithmetic"
    assert json.loads((metrics / "rope.json").read_text())["budget_flops"] == budgets[-1]
    smaller = json.loads((metrics / f"rope@{budget_label(budgets[0])}.json").read_text())
    assert smaller["budget_flops"] == budgets[0] and "delta_answer_loss" in smaller
    assert len(list(metrics.glob("*@*.json"))) == 2 * 3


def test_a_one_budget_report_has_no_scaling_section_and_names_the_scaling_profile(built):
    _, reports, paths = built
    text = paths["report"].read_text()
    assert "## How the effects change with compute" not in text
    assert "`dvc exp run --temp -S profile=scaling` (four budgets 3x apart)" in text
    assert pd.read_csv(paths["scaling_fits"]).empty
    assert not list((reports / "metrics").glob("*/*@*.json"))



def test_the_mlflow_views_of_a_scaling_study_group_and_show_its_runs_by_budget_too():
    from lmablate.tracking import mlflow_views as views

    def table(budgets=None) -> dict:
        return json.loads(views.study_views(["shakespeare"], ["baseline", "rope"], {},
                                            budgets)[views.view_tag(views.RUNS_VIEW_KEY)])

    scaling = table({"shakespeare": ["11000000000.0", "33000000000.0"]})
    assert [k["groupByData"] for k in scaling["groupBy"]["groupByKeys"]] == [
        "dataset", "variant", "budget_flops"]
    assert "tags.`budget_flops`" in scaling["columnOrder"]
    assert len(scaling["groupsExpanded"]) == 2 * 2
    assert table({"shakespeare": ["100000000000.0"]}) == table()  # one budget: as before


def test_a_scaling_study_s_stages_summarise_every_budget_and_keep_finished_work(
        scaling_study):
    import argparse
    from lmablate.stages import train, tune
    cfg, root, budgets, _ = scaling_study
    run = root / "runs" / "arithmetic" / "rope"
    before = (run / "best.json").read_bytes(), (run / "history.csv").read_bytes()
    args = argparse.Namespace(dataset="arithmetic", variant="rope", tokens=root / "tokens",
                              best=run / "best.json", trials=run / "trials.csv",
                              checkpoints=run / "checkpoints", history=run / "history.csv",
                              grad_stats=run / "grad_stats.csv", replicate=0)
    line = tune.main(cfg, args)  # the finished studies, read back
    assert [part.split(":")[0] for part in line.split("; at ")] == [
        f"{'at ' if i == 0 else ''}{budget_label(b)} FLOPs" for i, b in enumerate(budgets)]
    assert train.main(cfg, args).startswith(
        f"budgets {', '.join(budget_label(b) for b in budgets)} FLOPs; at "
        f"{budget_label(budgets[-1])}: 3 seeds x ")
    assert ((run / "best.json").read_bytes(), (run / "history.csv").read_bytes()) == before
