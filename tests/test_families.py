"""lmablate.report.families: the study's variant colours, one palette for the figures and
MLflow."""

from __future__ import annotations

from lmablate.report import families
from lmablate.report.families import family_palette, variant_family

from synthetic_study import make_cfg


def test_mlflow_run_colours_are_the_figures_family_colours():
    cfg = make_cfg()
    colours = families.variant_colours(cfg)
    assert list(colours)[0] == "baseline" and colours["baseline"] == "#1a1a1a"
    palette = family_palette({v: variant_family(cfg.variants.get(v) or {}) for v in colours})
    for variant, rgb in palette.items():
        assert colours[variant] == "#" + "".join(f"{round(c * 255):02x}" for c in rgb)
