"""The validation curves ``dvc plots show`` draws: per dataset, each variant's mean over seeds.

One table per dataset (``reports/curves/<dataset>.csv``, written by the report stage), one row
per variant x evaluation step. Beside the mean it carries what the DVC template
``.dvc/plots/variants.json`` needs to draw the same picture as the report's figure
(:func:`lmablate.report.figures.losses.plot_val_loss_curves`): the band of mean +- 1 SD over seeds,
and each variant's colour from :func:`lmablate.report.families.family_palette`, written as a
hex string so the palette stays defined once, in Python, and the template only reads it.

Units: losses in nats/char (natural-log cross-entropy per character token; every dataset of
the study is tokenized by character).
"""

from __future__ import annotations

from typing import Any, Mapping

import pandas as pd

from lmablate.report.families import hex_colours

CURVE_COLUMNS = ["variant", "step", "val_loss", "val_loss_sd", "val_loss_low", "val_loss_high",
                 "seeds", "colour", "variant_key"]


def variant_key(position: int, variant: str) -> str:
    """The variant prefixed by its 0-based position in the study, zero-padded to two digits
    (``variant_key(0, "baseline") == "00 baseline"``).

    Why: the template's colour scale takes its range from the ``colour`` column, and Vega-Lite
    sorts a range read from data by the colour field (``sort: {op: min}``), its domain
    ascending; colouring by this key makes both follow the study order, so the legend lists
    the baseline first, as the report's figures do. The legend shows the key without its
    3-character prefix. Raises ValueError for a position outside 0..99 (the prefix would no
    longer sort as a number)."""
    if not 0 <= position < 100:
        raise ValueError(f"variant_key: position {position} outside 0..99")
    return f"{position:02d} {variant}"


def mean_curves(history: pd.DataFrame, dataset: str,
                palette: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """The validation curve of each variant of ``dataset``, columns :data:`CURVE_COLUMNS`.

    ``val_loss`` is the mean over seeds (nats/char) at each evaluation step, ``val_loss_sd``
    the sample SD over seeds (empty with one seed), ``val_loss_low`` / ``val_loss_high`` the
    band mean -+ 1 SD (both the mean with one seed: no band), as in the report's validation
    loss figure; ``seeds`` the number of seeds averaged. ``colour`` is the variant's colour in
    ``palette`` (variant -> any matplotlib colour, normally
    :func:`~lmablate.report.families.family_palette`) as ``#rrggbb``, empty without a
    palette; ``variant_key`` is :func:`variant_key`. Variants in the order of ``history``
    (the study order, :func:`lmablate.report.collect.restrict_to_study`), steps ascending.

    Raises:
        ValueError: ``palette`` has no colour for a variant of ``dataset``.
    """
    if history.empty or "val_loss" not in history:
        return pd.DataFrame(columns=CURVE_COLUMNS)
    h = history[history["dataset"] == dataset].dropna(subset=["val_loss"])
    out = (h.groupby(["variant", "step"], observed=True, sort=True)["val_loss"]
           .agg(val_loss="mean", val_loss_sd="std", seeds="count").reset_index())
    out["variant"] = out["variant"].astype(str)
    spread = out["val_loss_sd"].fillna(0.0)
    out["val_loss_low"] = out["val_loss"] - spread
    out["val_loss_high"] = out["val_loss"] + spread
    order = list(dict.fromkeys(out["variant"]))
    if palette is None:
        out["colour"] = ""
    else:
        missing = [v for v in order if v not in palette]
        if missing:
            raise ValueError(f"mean_curves: palette has no colour for the variants {missing}")
        out["colour"] = out["variant"].map(hex_colours({v: palette[v] for v in order}))
    out["variant_key"] = out["variant"].map({v: variant_key(i, v) for i, v in enumerate(order)})
    return out[CURVE_COLUMNS]
