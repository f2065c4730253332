"""The validation curves ``dvc plots show`` draws (``reports/curves/<dataset>.csv``): each
variant's mean over seeds with a +-1 SD band and its colour as hex, so that the DVC template
``.dvc/plots/variants.json`` draws the report's figure with the palette defined once, here.
Losses in nats/char."""

from __future__ import annotations

from typing import Any, Mapping

import pandas as pd

from lmablate.report.families import hex_colours

CURVE_COLUMNS = ["variant", "step", "val_loss", "val_loss_sd", "val_loss_low", "val_loss_high",
                 "seeds", "colour", "variant_key"]


def variant_key(position: int, variant: str) -> str:
    """``"00 baseline"``: the variant after its 2-digit position in the study. Vega-Lite sorts
    the colour domain and its data-read range by this key, so the legend follows the study
    order (it hides the prefix).

    Raises:
        ValueError: a position outside 0..99."""
    if not 0 <= position < 100:
        raise ValueError(f"variant_key: position {position} outside 0..99")
    return f"{position:02d} {variant}"


def mean_curves(history: pd.DataFrame, dataset: str,
                palette: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """Each variant's validation curve of ``dataset``, :data:`CURVE_COLUMNS`: the mean over
    seeds (nats/char) per step, the sample SD and the band mean -+ 1 SD (no band with one seed),
    ``colour`` as ``#rrggbb`` from ``palette`` ("" without one); variants in ``history``'s order.

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
