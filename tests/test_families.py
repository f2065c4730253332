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


def test_a_user_s_component_is_coloured_as_its_family():
    """A variant naming components.<module>:<Class> for a part of the model is in that part's
    family, a shade of its hue beside the built-ins (components/ examples: Primer, DyT)."""
    variants = {"swiglu": {"ffn": "swiglu"}, "squared_relu":
                {"ffn": "components.squared_relu:SquaredReLU"}, "rmsnorm": {"norm": "rmsnorm"},
                "dyt": {"norm": "components.dyt:DyT"},
                "mine": {"position": "components.mine:Mine"},
                "both": {"ffn": "components.squared_relu:SquaredReLU",
                         "norm": "components.dyt:DyT"}}
    assert {v: variant_family(o) for v, o in variants.items()} == {
        "swiglu": "FFN", "squared_relu": "FFN", "rmsnorm": "norm", "dyt": "norm",
        "mine": "position", "both": "combined"}
    palette = families.study_palette(variants, ["baseline", *variants])
    blues = family_palette({"swiglu": "FFN", "squared_relu": "FFN"})
    assert (palette["swiglu"], palette["squared_relu"]) == (blues["swiglu"], blues["squared_relu"])
