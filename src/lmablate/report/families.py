"""Variant families and the colours that show them: which part of the model a variant changes.

A variant is a dict of overrides of the baseline model config (``params.yaml``, ``variants:``,
e.g. ``swiglu: {ffn: swiglu}``). Its family is the part of the model those keys belong to
(:data:`KEY_FAMILY`): the FFN, the normalisation, the position encoding, or the attention
heads; ``"combined"`` when it changes more than one part (``llama``), ``"baseline"`` when it
changes nothing, ``"other"`` for keys outside every family. The family is the key's, whatever its
value: a user's own component (``ffn: components.squared_relu:SquaredReLU``, ``norm:
components.dyt:DyT``) is coloured as the built-ins of its part of the model.

:func:`family_palette` gives every variant a shade of its family's hue, so figures (through
their ``palette`` argument) group the variants of a family by colour. :func:`variant_palette`
is a study's palette over its configured variants: the report's figures and the curves of
``dvc plots show`` take it, and MLflow's run colours as hex (:func:`variant_colours`). Pure
Python and seaborn colour maps: nothing here needs torch or a model.
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

# family -> seaborn sequential palette: one hue per family, far apart on the colour wheel.
# "combined" is magenta (RdPu), not red: Reds sits next to Oranges, and llama's red looked like
# alibi's dark orange.
FAMILY_CMAPS: dict[str, str] = {
    "FFN": "Blues",
    "norm": "Greens",
    "position": "Oranges",
    "attention": "Purples",
    "combined": "RdPu",
    "other": "Greys",
}
# Part of each colour map the shades are sampled from (0 = palest, 1 = darkest). Below ~0.4
# the sequential maps are too pale to see on a white background. Purples starts darker: its
# pale end is a greyish lavender hard to tell from pale blue. "other" stops short of the
# darkest greys, which would look like the baseline.
SHADE_RANGE: dict[str, tuple[float, float]] = {f: (0.45, 0.95) for f in FAMILY_CMAPS}
SHADE_RANGE["attention"] = (0.6, 1.0)
SHADE_RANGE["other"] = (0.35, 0.75)
BASELINE_COLOR = (0.1, 0.1, 0.1)  # near black: the reference every variant is compared with


def variant_family(overrides: Mapping[str, Any]) -> str:
    """The family (one of :data:`FAMILIES`) of a variant given its config overrides.

    ``"baseline"`` for no overrides; the family of its keys when they all belong to one
    (:data:`KEY_FAMILY`); ``"combined"`` when they span more than one family (a key outside
    every family counts as the family ``"other"``, so ``{ffn: swiglu, dropout: 0.2}`` is
    combined); ``"other"`` when no key belongs to a family.
    """
    if not overrides:
        return "baseline"
    families = {KEY_FAMILY.get(key, "other") for key in overrides}
    return families.pop() if len(families) == 1 else "combined"


def family_palette(families: Mapping[str, str]) -> dict[str, tuple[float, float, float]]:
    """One RGB colour (floats in [0, 1]) per variant: ``families`` maps variant -> family.

    Why: a reader should see at a glance which family a variant belongs to, and tell the
    variants of a family apart. A categorical palette does neither: with 13 variants tab10 /
    husl gave look-alike colours to unrelated variants (rope, sinusoidal and alibi all teal)
    and put nothing in common between, say, gelu and swiglu. Here each family has its own hue
    (:data:`FAMILY_CMAPS`: FFN blue, norm green, position orange, attention purple, combined
    magenta, other grey), its variants evenly spaced shades of it, lighter to darker in the order
    of ``families``, sampled from the visible part of the map (:data:`SHADE_RANGE`); a family
    of one variant gets the middle shade. The baseline is near black (:data:`BASELINE_COLOR`).

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
    """The colour of each variant of ``order`` (names, in the report's order: baseline first),
    its family read from its overrides in ``variants`` (``params.yaml``'s ``variants:``; a
    name without an entry is the baseline's family): :func:`family_palette`.

    The one palette of a study: the report's figures, the curves of ``dvc plots show`` and the
    MLflow run colours all take it, over the configured variants, so a variant has one colour
    in every view even where some of its runs are missing.
    """
    return family_palette({v: variant_family(variants.get(v) or {}) for v in order})


def hex_colours(palette: Mapping[str, Any]) -> dict[str, str]:
    """``{variant: "#rrggbb"}`` of a palette (variant -> any matplotlib colour), for the views
    that take colours as text (DVC's Vega-Lite charts, MLflow's run colours)."""
    return {v: to_hex(c) for v, c in palette.items()}



def variant_palette(cfg: StudyConfig) -> dict[str, tuple[float, float, float]]:
    """The study's palette (:func:`study_palette`): every configured variant, in the report's
    order (baseline first, then ``study.variants``), as RGB in [0, 1]."""
    return study_palette(cfg.variants, variant_order(cfg.study_variants, cfg.study_variants))


def variant_colours(cfg: StudyConfig) -> dict[str, str]:
    """Each studied variant's colour in the figures (:func:`variant_palette`, variants in the
    report's order: baseline first), as ``"#rrggbb"`` for MLflow's run colours."""
    return hex_colours(variant_palette(cfg))
