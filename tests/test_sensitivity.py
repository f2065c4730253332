"""lmablate.report.stats.sensitivity: the learning-rate sensitivity of Wortsman et al. 2023 over the
tuning's shared design, and the isoFLOP profile of the widths, on hand-made trial frames whose
answers are worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from lmablate.report import collect
from lmablate.report.stats import sensitivity
from lmablate.report.stats.reference_models import uniform_cross_entropy

DESIGN_LRS = [1e-3, 10 ** -2.5, 1e-2, 10 ** -1.5]  # evenly spaced in log, as tuning.design
L0 = 3.0  # the loss at initialisation the tests pass (nats/char)


def trial(variant, slot, lr, d_model, value, *, rung=0, batch=0, state="COMPLETE",
          dataset="d"):
    """One row of a stacked trials.csv (lmablate.tune.trials.TRIALS_COLUMNS)."""
    return {"dataset": dataset, "variant": variant, "number": slot, "rung": rung,
            "batch": batch, "budget_fraction": 0.125 if rung == 0 else 1.0, "state": state,
            "value": value if state == "COMPLETE" else np.nan, "params_lr": lr,
            "params_d_model": d_model, "tokens_per_parameter": {32: 40.0, 48: 20.0}[d_model],
            "steps": 100, "last_step": 100, "flops": 1e9, "fail_reason": ""}


def study(variant, design_losses, *, others=()):
    """A study's rows: the design (rung 0, batch 0, d_model 48; None = diverged), then
    ``others`` as (lr, d_model, value, rung, batch)."""
    rows = [trial(variant, i, lr, 48, loss, state="COMPLETE" if loss is not None else "FAIL")
            for i, (lr, loss) in enumerate(zip(DESIGN_LRS, design_losses))]
    rows += [trial(variant, len(rows) + i, lr, d, v, rung=r, batch=b)
             for i, (lr, d, v, r, b) in enumerate(others)]
    return rows


def frame(*studies):
    return collect.with_order(pd.DataFrame([r for s in studies for r in s]))


def test_the_sensitivity_is_the_mean_excess_over_the_best_design_loss_capped_at_l0():
    # losses 2.5, 2.2, 2.3, 3.4: L* = 2.2, the last is capped at L0 = 3.0
    # S = (0.3 + 0 + 0.1 + 0.8) / 4 = 0.3
    trials = frame(study("baseline", [2.5, 2.2, 2.3, 3.4]))
    row = sensitivity.lr_sensitivity(trials, {"d": L0}).iloc[0]
    assert row["lr_sensitivity"] == pytest.approx(0.3, abs=1e-12)
    assert row["best_design_loss"] == 2.2 and row["best_design_lr"] == DESIGN_LRS[1]
    assert (row["n_design"], row["n_design_diverged"], row["design_d_model"]) == (4, 0, 48)
    assert row["design_tokens_per_parameter"] == 20.0 and row["budget_fraction"] == 0.125
    assert (row["design_lr_low"], row["design_lr_high"]) == (DESIGN_LRS[0], DESIGN_LRS[-1])
    assert row["uniform_loss"] == L0 and row["note"] == ""


def test_a_diverged_design_point_counts_at_the_loss_at_initialisation():
    # 2.4, 2.1, diverged, 2.6: S = (0.3 + 0 + (3.0 - 2.1) + 0.5) / 4 = 0.425
    trials = frame(study("x", [2.4, 2.1, None, 2.6]))
    row = sensitivity.lr_sensitivity(trials, {"d": L0}).iloc[0]
    assert row["lr_sensitivity"] == pytest.approx(0.425, abs=1e-12)
    assert row["n_design"] == 4 and row["n_design_diverged"] == 1
    # a COMPLETE trial whose loss is not finite diverged too
    trials = frame(study("x", [2.4, 2.1, math.inf, 2.6]))
    assert sensitivity.lr_sensitivity(trials, {"d": L0}).iloc[0]["lr_sensitivity"] == \
        pytest.approx(0.425, abs=1e-12)


def test_only_the_design_counts_not_later_batches_or_rungs():
    # a TPE trial (batch 1) and a full-budget trial (rung 1) both lower than the design's best
    others = [(2e-2, 32, 1.9, 0, 1), (10 ** -2.5, 48, 1.5, 1, 2)]
    trials = frame(study("baseline", [2.5, 2.2, 2.3, 3.4], others=others))
    row = sensitivity.lr_sensitivity(trials, {"d": L0}).iloc[0]
    assert row["lr_sensitivity"] == pytest.approx(0.3, abs=1e-12)
    assert row["best_design_loss"] == 2.2 and row["n_design"] == 4


def test_a_variant_without_design_points_keeps_its_row_with_nan_and_says_why():
    only_tpe = [trial("y", 4, 2e-2, 32, 2.0, batch=1)]
    trials = frame(study("baseline", [2.5, 2.2, 2.3, 3.4]), only_tpe)
    out = sensitivity.lr_sensitivity(trials, {"d": L0}).set_index("variant")
    assert list(out.index) == ["baseline", "y"]  # a variant with no trial at all is absent
    y = out.loc["y"]
    assert y["n_design"] == 0 and math.isnan(y["lr_sensitivity"])
    assert math.isnan(y["best_design_loss"]) and pd.isna(y["design_d_model"])
    assert y["note"] == sensitivity.NO_DESIGN


def test_without_the_loss_at_initialisation_the_sensitivity_is_nan_and_the_rest_is_kept():
    trials = frame(study("baseline", [2.5, 2.2, 2.3, 3.4]))
    row = sensitivity.lr_sensitivity(trials, {}).iloc[0]
    assert math.isnan(row["lr_sensitivity"]) and row["note"] == sensitivity.NO_UNIFORM
    assert row["best_design_loss"] == 2.2


def test_a_study_whose_every_design_point_diverged_has_no_sensitivity():
    row = sensitivity.lr_sensitivity(frame(study("x", [None] * 4)), {"d": L0}).iloc[0]
    assert math.isnan(row["lr_sensitivity"]) and row["note"] == sensitivity.ALL_DIVERGED
    assert row["n_design_diverged"] == 4


def test_a_first_batch_at_several_widths_is_not_a_learning_rate_sweep():
    rows = study("x", [2.5, 2.2, 2.3, 3.4])
    rows[0]["params_d_model"], rows[0]["tokens_per_parameter"] = 32, 40.0
    row = sensitivity.lr_sensitivity(frame(rows), {"d": L0}).iloc[0]
    assert math.isnan(row["lr_sensitivity"]) and row["note"] == sensitivity.SEVERAL_WIDTHS


def test_rows_follow_the_study_order_and_an_old_trials_frame_gives_no_rows():
    trials = collect.with_order(frame(study("x", [2.4, 2.1, 2.2, 2.6]),
                                      study("baseline", [2.5, 2.2, 2.3, 3.4])),
                                variants=["baseline", "x"])
    out = sensitivity.lr_sensitivity(trials, {"d": L0})
    assert list(out["variant"]) == ["baseline", "x"]
    assert list(out.columns) == sensitivity.SENSITIVITY_COLUMNS
    old = trials.drop(columns=["rung", "batch"])  # trials.csv of the protocol before rungs
    assert sensitivity.lr_sensitivity(old, {"d": L0}).empty
    assert sensitivity.width_summary(old).empty
    assert sensitivity.lr_sensitivity(pd.DataFrame(), {}).empty


def test_the_loss_at_initialisation_is_ln_of_the_vocabulary_size():
    assert uniform_cross_entropy(65) == pytest.approx(math.log(65), rel=1e-15)
    assert uniform_cross_entropy(1) == 0.0
    with pytest.raises(ValueError):
        uniform_cross_entropy(0)


def test_the_isoflop_summary_picks_the_lowest_first_rung_loss_of_each_width():
    others = [(2e-2, 32, 2.05, 0, 1), (5e-3, 32, 2.0, 0, 1), (3e-3, 48, 1.95, 0, 1),
              (3e-3, 48, 1.5, 1, 2)]  # the last is the full budget: not on the first rung
    trials = frame(study("baseline", [2.5, 2.2, None, 3.4], others=others))
    w = sensitivity.width_summary(trials)
    assert list(w.columns) == sensitivity.WIDTH_COLUMNS
    got = w.set_index("d_model")[["n_trials", "n_diverged", "best_loss", "best_lr",
                                  "tokens_per_parameter"]].to_dict("index")
    assert got == {32: {"n_trials": 2, "n_diverged": 0, "best_loss": 2.0, "best_lr": 5e-3,
                        "tokens_per_parameter": 40.0},
                   48: {"n_trials": 5, "n_diverged": 1, "best_loss": 1.95, "best_lr": 3e-3,
                        "tokens_per_parameter": 20.0}}
    assert set(w["budget_fraction"]) == {0.125}


def test_a_width_whose_trials_all_diverged_has_no_best_loss():
    trials = frame(study("x", [2.5, 2.2, 2.3, 3.4], others=[(9e-2, 32, None, 0, 1)]))
    trials.loc[trials["params_d_model"] == 32, "state"] = "FAIL"
    w = sensitivity.width_summary(trials).set_index("d_model")
    assert w.loc[32, "n_diverged"] == 1 and math.isnan(w.loc[32, "best_loss"])


def test_the_design_is_shared_when_every_variant_has_the_same_points():
    same = frame(study("baseline", [2.5, 2.2, 2.3, 3.4]), study("x", [2.4, 2.1, None, 2.6]))
    assert sensitivity.design_is_shared(same, "d")
    moved = same.copy()
    moved.loc[(moved["variant"] == "x") & (moved["number"] == 0), "params_lr"] = 2e-3
    assert not sensitivity.design_is_shared(moved, "d")
    assert not sensitivity.design_is_shared(same, "other dataset")
