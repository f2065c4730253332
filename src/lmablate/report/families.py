"""Variant families and their colours: which part of the model a variant changes.

A variant's family is that of the config keys it overrides (:data:`KEY_FAMILY`), whatever their
values, so a user's own component is coloured as the built-ins of its part of the model.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import seaborn as sns
from matplotlib.colors import to_hex

from lmablate.config.study import StudyConfig
from lmablate.report.collect import variant_order

FAMILIES = ("baseline", "FFN", "norm", "position", "attention", "combined", "other")

# model-config key -> the family of a variant overriding it
KEY_FAMILY: dict[str, str] = {
    "ffn": "FFN",
    "ffn_hidden": "FFN",
    "norm": "norm",
    "norm_placement": "norm",
    "position": "position",
    "rope_base": "position",
    "n_kv_heads": "attention",
    "n_heads": "attention",
}

# one hue per family, far apart; "combined" is magenta, not red (too near Oranges)
FAMILY_CMAPS: dict[str, str] = {
    "FFN": "Blues",
    "norm": "Greens",
    "position": "Oranges",
    "attention": "Purples",
    "combined": "RdPu",
    "other": "Greys",
}
# the part of each map the shades come from (0 palest, 1 darkest): below ~0.4 too pale on
# white; Purples' pale end looks blue; the darkest greys would look like the baseline
SHADE_RANGE: dict[str, tuple[float, float]] = {f: (0.45, 0.95) for f in FAMILY_CMAPS}
SHADE_RANGE["attention"] = (0.6, 1.0)
SHADE_RANGE["other"] = (0.35, 0.75)
BASELINE_COLOR = (0.1, 0.1, 0.1)  # near black: the reference every variant is compared with


def variant_family(overrides: Mapping[str, Any]) -> str:
    """The family (:data:`FAMILIES`) of a variant's config overrides: ``"baseline"`` for none,
    ``"combined"`` when its keys span several families (a key of none counts as ``"other"``)."""
    if not overrides:
        return "baseline"
    families = {KEY_FAMILY.get(key, "other") for key in overrides}
    return families.pop() if len(families) == 1 else "combined"


def family_palette(families: Mapping[str, str]) -> dict[str, tuple[float, float, float]]:
    """One RGB colour (floats in [0, 1]) per variant of ``families`` (variant -> family): each
    family its hue (:data:`FAMILY_CMAPS`), its variants evenly spaced shades of it in order
    (a lone variant the middle one); the baseline near black. A categorical palette gave
    unrelated variants look-alike colours and related ones nothing in common.

    Raises:
        ValueError: a family is not one of :data:`FAMILIES`.
    """
    unknown = sorted({f for f in families.values() if f not in FAMILIES})
    if unknown:
        raise ValueError(f"family_palette: unknown families {unknown}; known: {FAMILIES}")
    colours: dict[str, tuple[float, float, float]] = {}
    for family in FAMILIES:
        members = [v for v, f in families.items() if f == family]
        if not members:
            continue
        if family == "baseline":
            colours.update({v: BASELINE_COLOR for v in members})
            continue
        cmap = sns.color_palette(FAMILY_CMAPS[family], as_cmap=True)
        low, high = SHADE_RANGE[family]
        shades = np.linspace(low, high, len(members)) if len(members) > 1 else [(low + high) / 2]
        colours.update({v: tuple(float(c) for c in cmap(x)[:3]) for v, x in zip(members, shades)})
    return {v: colours[v] for v in families}  # in the order given


def study_palette(variants: Mapping[str, Mapping[str, Any] | None],
                  order: Sequence[str]) -> dict[str, tuple[float, float, float]]:
    """:func:`family_palette` of the variants in ``order``, each family read from its
    overrides in ``variants`` (``params.yaml``'s ``variants:``; no entry: the baseline's)."""
    return family_palette({v: variant_family(variants.get(v) or {}) for v in order})


def hex_colours(palette: Mapping[str, Any]) -> dict[str, str]:
    """``{variant: "#rrggbb"}`` of a palette (variant -> any matplotlib colour)."""
    return {v: to_hex(c) for v, c in palette.items()}


def variant_palette(cfg: StudyConfig) -> dict[str, tuple[float, float, float]]:
    """The study's one palette (:func:`study_palette`) over its configured variants, in the
    report's order: figures, ``dvc plots show`` and MLflow all take it."""
    return study_palette(cfg.variants, variant_order(cfg.study_variants, cfg.study_variants))


def variant_colours(cfg: StudyConfig) -> dict[str, str]:
    """:func:`variant_palette` as ``"#rrggbb"`` (MLflow's run colours)."""
    return hex_colours(variant_palette(cfg))
