"""lmablate.report.curves: the mean validation curves of `dvc plots show`."""

from __future__ import annotations

import pandas as pd
import pytest

from lmablate.report import collect, curves

from synthetic_study import VARIANTS


def test_mean_curves_average_the_seeds_at_each_step_in_study_order(built):
    cfg, out_dir, out = built
    curve = pd.read_csv(out["curves"] / "arithmetic.csv")
    assert list(curve.columns) == curves.CURVE_COLUMNS
    assert list(dict.fromkeys(curve["variant"])) == list(VARIANTS)
    history = collect.collect(out_dir.parent / "runs").history
    h = history[(history["dataset"] == "arithmetic") & (history["variant"] == "gelu")]
    row = curve[(curve["variant"] == "gelu") & (curve["step"] == 50)].iloc[0]
    assert row["val_loss"] == pytest.approx(h.loc[h["step"] == 50, "val_loss"].mean())
    assert row["seeds"] == 3
    for _, c in curve.groupby("variant"):
        assert c["step"].is_monotonic_increasing
