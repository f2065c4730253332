"""lmablate.report.stats.extrapolation: length extrapolation, its comparison with rope, and how the
report shows it."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from lmablate.report import collect
from lmablate.report.stats import extrapolation as ex
from lmablate.stages import report

from synthetic_study import DATASETS, VARIANTS, make_cfg, write_runs


def _extrapolation(seed_index: int, shift: float, learned: bool) -> dict:
    """A seed's ``extrapolation`` result as the evaluate stage writes it (context 48)."""
    out = {}
    for f in (1, 2, 4):
        if learned and f > 1:
            out[f"x{f}"] = "n/a (learned table of 48 positions)"
            continue
        loss = 1.5 + shift * (f - 1) + 0.01 * seed_index
        out[f"x{f}"] = {"test_loss": loss, "length": 48 * f, "bucket": 16, "windows": 10,
                        "position_loss": [loss] * (3 * f)}
    return out


def test_extrapolation_statistics_compare_each_scheme_with_rope_at_each_length():
    rows = []
    for var, shift in (("baseline", None), ("rope", 0.5), ("alibi", 0.0), ("none", 0.6)):
        for i, seed in enumerate((0, 1, 2, 3)):
            for f, r in _extrapolation(i, shift or 0.0, shift is None).items():
                noise = 0.003 * ((i * {"baseline": 3, "rope": 1, "alibi": 2, "none": 5}[var])
                                 % 3)  # differences that vary from seed to seed
                rows.append({"dataset": "d", "variant": var, "seed": seed,
                             "factor": int(f[1:]), "length": None if isinstance(r, str)
                             else r["length"], "test_loss": None if isinstance(r, str)
                             else r["test_loss"] + noise,
                             "note": r if isinstance(r, str) else ""})
    df = collect.with_order(pd.DataFrame(rows), ["d"], ["baseline", "rope", "alibi", "none"])
    table = ex.extrapolation_table(df)
    b = table[table["variant"] == "baseline"].set_index("factor")
    assert b.loc[1, "n"] == 4 and b.loc[4, "note"] == "n/a (learned table of 48 positions)"
    assert pd.isna(b.loc[4, "mean"]) and pd.isna(b.loc[4, "length"])
    r4 = table[(table["variant"] == "rope") & (table["factor"] == 4)].iloc[0]
    assert r4["length"] == 192 and r4["ci95_low"] < r4["mean"] < r4["ci95_high"]
    c = ex.extrapolation_comparisons(df)
    assert set(c["reference"]) == {"rope"}
    at4 = c[c["metric"] == "test_loss_x4"].set_index("variant")
    assert sorted(at4.index) == ["alibi", "none"]  # the learned table is not compared past 1x
    assert at4.loc["alibi", "verdict"] == "better" and at4.loc["none", "verdict"] == "worse"
    assert at4.loc["alibi", "mean_diff"] == pytest.approx(-1.5, abs=0.01)
    at1 = c[c["metric"] == "test_loss_x1"]
    assert sorted(at1["variant"]) == ["alibi", "baseline", "none"]


def test_the_report_shows_length_extrapolation_with_na_for_learned_tables(tmp_path):
    write_runs(tmp_path / "runs")
    for path in (tmp_path / "runs").glob("*/*/metrics.json"):
        doc = json.loads(path.read_text())
        for i, run in enumerate(doc["runs"].values()):
            run["extrapolation"] = _extrapolation(i, 0.0, learned=True)
        path.write_text(json.dumps(doc))
    out = report.build_report(make_cfg(), tmp_path / "runs", tmp_path / "reports")
    table = pd.read_csv(out["extrapolation"])
    assert len(table) == len(DATASETS) * len(VARIANTS) * 3
    assert set(table.loc[table["factor"] > 1, "note"]) == {"n/a (learned table of 48 positions)"}
    # the table is the CSV's; the report gives a scheme that runs past the context one Findings
    # line, and learned tables none
    md = out["report"].read_text()
    assert "### Length extrapolation" not in md and "Past the training context" not in md
    doc = json.loads((out["metrics"] / "arithmetic" / "gelu.json").read_text())
    assert doc["test_loss_x4"] == "n/a"
    assert (tmp_path / "reports" / "figures" / "extrapolation_shakespeare.png").is_file()
    positions = pd.read_csv(out["extrapolation_positions"])
    # learned tables: factor 1 only, 48 positions in buckets of 16, the mean of 3 seeds
    assert len(positions) == len(DATASETS) * len(VARIANTS) * 3
    assert set(positions["factor"]) == {1} and set(positions["position"]) == {0, 16, 32}
    assert set(positions["seeds"]) == {3}
    assert positions["loss"].tolist() == pytest.approx(
        [1.5 + 0.01 * (0 + 1 + 2) / 3] * len(positions))
