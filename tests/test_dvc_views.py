"""`dvc plots show`: the curve tables, and the page DVC renders from them with the project's
template and HTML page (offline, in family_palette's colours, titled by dataset)."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from matplotlib.colors import to_hex

from lmablate.core import fileio
from lmablate.report.curves import CURVE_COLUMNS, mean_curves, variant_key
from lmablate.report.families import family_palette, variant_family

ROOT = Path(__file__).resolve().parents[1]
OVERRIDES = {"baseline": {}, "swiglu": {"ffn": "swiglu"}, "rmsnorm": {"norm": "rmsnorm"},
             "rope": {"position": "rope"}}
PALETTE = family_palette({v: variant_family(o) for v, o in OVERRIDES.items()})


def history() -> pd.DataFrame:
    """Two steps x three seeds per variant (seed 2 misses step 200 of rope), variants in the
    study order as a categorical, the way analysis.collect reads them."""
    rows = []
    for i, variant in enumerate(OVERRIDES):
        for seed in range(3):
            for step in (100, 200):
                if variant == "rope" and step == 200 and seed > 0:
                    continue
                rows.append({"dataset": "shakespeare", "variant": variant, "seed": seed,
                             "step": step, "val_loss": 3.0 - step / 100 + i + seed})
    h = pd.DataFrame(rows)
    h["variant"] = pd.Categorical(h["variant"], categories=list(OVERRIDES))
    return h


def test_mean_curves_carry_the_seed_band_and_the_family_colours(tmp_path):
    curve = mean_curves(history(), "shakespeare", PALETTE)
    assert list(curve.columns) == CURVE_COLUMNS
    assert list(curve["variant"]) == ["baseline", "baseline", "swiglu", "swiglu",
                                      "rmsnorm", "rmsnorm", "rope", "rope"]
    swiglu = curve[(curve["variant"] == "swiglu") & (curve["step"] == 200)].iloc[0]
    # seeds 0, 1, 2 give 2.0, 3.0, 4.0: mean 3, sample SD 1
    assert (swiglu["val_loss"], swiglu["val_loss_sd"], swiglu["seeds"]) == (3.0, 1.0, 3)
    assert (swiglu["val_loss_low"], swiglu["val_loss_high"]) == (2.0, 4.0)
    lone = curve[(curve["variant"] == "rope") & (curve["step"] == 200)].iloc[0]
    # one seed: no SD, and a band of no width
    assert lone["seeds"] == 1 and math.isnan(lone["val_loss_sd"])
    assert lone["val_loss_low"] == lone["val_loss"] == lone["val_loss_high"] == 4.0
    assert dict(zip(curve["variant"], curve["colour"])) == {
        v: to_hex(c) for v, c in PALETTE.items()}
    assert dict(zip(curve["variant"], curve["colour"]))["baseline"] == "#1a1a1a"
    assert list(dict.fromkeys(curve["variant_key"])) == [
        "00 baseline", "01 swiglu", "02 rmsnorm", "03 rope"]
    # the CSV the report writes reads back the same
    back = pd.read_csv(fileio.write_csv(tmp_path / "c.csv", curve, CURVE_COLUMNS))
    pd.testing.assert_frame_equal(back, curve.reset_index(drop=True), check_dtype=False)


def test_mean_curves_refuse_a_palette_without_a_variant():
    with pytest.raises(ValueError, match=r"no colour for the variants \['rope'\]"):
        mean_curves(history(), "shakespeare", {v: PALETTE[v] for v in list(OVERRIDES)[:3]})


def test_variant_key_sorts_as_the_study_order_up_to_99_variants():
    keys = [variant_key(i, v) for i, v in enumerate(["z", "b", "a"] * 4)]
    assert sorted(keys) == keys and keys[10] == "10 b"
    with pytest.raises(ValueError, match="position 100 outside 0..99"):
        variant_key(100, "x")


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> tuple[str, list[dict]]:
    """`dvc plots show` run in a bare DVC project holding the project's .dvc/config, templates
    and plots: section, and one dataset's curves. Returns the page and its Vega-Lite specs."""
    repo = tmp_path_factory.mktemp("views")
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=repo, check=True)
    shutil.copy(ROOT / ".dvc" / "config", repo / ".dvc" / "config")
    shutil.copytree(ROOT / ".dvc" / "plots", repo / ".dvc" / "plots")
    plots = yaml.safe_load((ROOT / "dvc.yaml").read_text())["plots"]
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"plots": plots}))
    fileio.write_csv(repo / "reports" / "curves" / "shakespeare.csv",
                     mean_curves(history(), "shakespeare", PALETTE), CURVE_COLUMNS)
    subprocess.run([sys.executable, "-m", "dvc", "plots", "show"], cwd=repo, check=True,
                   capture_output=True)
    page = (repo / "dvc_plots" / "index.html").read_text(encoding="utf-8")
    specs = [json.loads(s) for s in re.findall(r"var spec = (\{.*\});\n", page)]
    return page, specs


def test_dvc_plots_page_loads_nothing_from_the_network(rendered):
    page, specs = rendered
    assert len(specs) == 1
    # every script is inline: no src= at all, so nothing is fetched, remote or local
    assert re.findall(r"<script[^>]*\bsrc\s*=", page, flags=re.I) == []
    assert "cdn.jsdelivr" not in page
    # the libraries vegaEmbed needs are there, inlined
    for library in ("vega 5.33.1", "vega-lite 5.23.0", "vega-embed 6.29.0"):
        assert f"/* {library}, BSD-3-Clause" in page
    assert "vegaEmbed('#" in page


def test_dvc_plots_draw_the_family_colours_with_a_band_and_a_dataset_title(rendered):
    _, (spec,) = rendered
    colour = spec["encoding"]["color"]
    assert colour["field"] == "variant_key" and colour["scale"] == {"range": {"field": "colour"}}
    shown = {d["variant"]: d["colour"] for d in spec["data"]["values"]}
    assert shown == {v: to_hex(c) for v, c in PALETTE.items()}
    band, line = spec["layer"]
    assert band["mark"]["type"] == "area"
    assert (band["encoding"]["y"]["field"], band["encoding"]["y2"]["field"]) == (
        "val_loss_low", "val_loss_high")
    assert line["encoding"]["y"]["field"] == "val_loss"
    assert line["encoding"]["y"]["title"] == "validation loss (nats/char)"
    # the title is an expression over the file's path: "shakespeare: validation loss by step"
    expr = spec["title"]["text"]["expr"]
    assert "'reports/curves/shakespeare.csv'" in expr
    assert expr.endswith("+ ': validation loss by step'")
