"""What every figure shares: the figure itself, variant colours, units and reference lines."""

from __future__ import annotations

import math
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from lmablate.core import fileio
from lmablate.report.stats.statistics import METRICS

DPI = 110
LOSS_UNIT = "nats/char"  # every loss axis of the figures: the tokens are characters
# (colour, dash) of the 1st, 2nd, ... reference line: grey (background), told apart by dashes
REFERENCE_STYLES = [("0.35", (0, (7, 3))), ("0.5", (0, (2, 2))), ("0.25", (0, (7, 2, 1.5, 2))),
                    ("0.6", (0, (1, 1))), ("0.4", (0, (12, 3)))]
# a tuning objective (best.json's ``objective``) -> what its value is, and its unit
OBJECTIVES = {
    "val_loss": ("validation loss", LOSS_UNIT),
    "val_answer_loss": ("validation answer loss", "nats/answer char"),
    "val_answer_loss_mean": ("validation answer loss, mean over the run", "nats/answer char"),
}


def objective_label(objective: str, where: str) -> str:
    """An axis label for tuning trials' values of ``objective`` (a key of :data:`OBJECTIVES`;
    another is read as ``val_loss``), e.g. ``"validation loss at the full budget\\n(nats/char)"``
    for ``where`` = ``"at the full budget"``."""
    name, unit = OBJECTIVES.get(objective, OBJECTIVES["val_loss"])
    return f"{name} {where}\n({unit})"


@contextmanager
def figure(path: Path, figsize: tuple[float, float] = (7.5, 4.5), nrows: int = 1,
           ncols: int = 1, **subplot_kw: Any) -> Iterator[tuple[Figure, np.ndarray]]:
    """Yields ``(fig, axes)`` (``axes`` 2-D, ``nrows`` x ``ncols``) of a seaborn-styled figure,
    saved atomically as PNG at :data:`DPI` to ``path`` on exit; nothing is written when the
    body raises. A plain ``Figure`` (Agg), not pyplot, and local style contexts: no global
    state is touched."""
    with sns.axes_style("whitegrid"), sns.plotting_context("notebook", font_scale=0.85):
        fig = Figure(figsize=figsize, dpi=DPI, layout="constrained")
        yield fig, fig.subplots(nrows, ncols, squeeze=False, **subplot_kw)
        with fileio.atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", dpi=DPI)


@contextmanager
def panels(path: Path, n: int, max_cols: int, panel: tuple[float, float],
           margin: tuple[float, float]) -> Iterator[tuple[Figure, np.ndarray]]:
    """:func:`figure` with ``n`` >= 1 panels, at most ``max_cols`` a row, each ``panel``
    (width, height) inches, plus ``margin`` inches; the cells past the n-th hidden. Yields
    ``(fig, axes)``, ``axes`` ``ceil(n / cols)`` x ``cols``."""
    ncols = min(n, max_cols)
    nrows = math.ceil(n / ncols)
    with figure(path, figsize=(panel[0] * ncols + margin[0], panel[1] * nrows + margin[1]),
                nrows=nrows, ncols=ncols) as (fig, axes):
        for ax in axes.ravel()[n:]:
            ax.set_visible(False)
        yield fig, axes


def variant_palette(order: Sequence[str], palette: Mapping[str, Any]) -> dict[str, Any]:
    """Variant -> colour of ``order`` from ``palette``
    (:func:`lmablate.report.families.family_palette`). Raises ValueError if one is missing."""
    missing = [v for v in order if v not in palette]
    if missing:
        raise ValueError(f"palette has no colour for the variants {missing}")
    return {v: palette[v] for v in order}


def metric_unit(metric: str) -> str:
    """``metric``'s unit (:data:`lmablate.report.stats.statistics.METRICS`); KeyError if none."""
    unit = METRICS[metric][1]
    return LOSS_UNIT if unit == "nats/char" else unit


def draw_references(ax: Any, references: Mapping[str, float] | None,
                    window: tuple[float, float] | None = None) -> list[Line2D]:
    """Draw each reference (label -> value in the y axis's unit) as a grey dashed horizontal
    line; return legend handles labelled ``"<label>: <value>"`` (3 decimals). One outside
    ``window`` is not drawn; its handle (an up/down marker) adds ``" (off the axis,
    above|below)"``. Non-finite values are left out."""
    handles = []
    finite = [(k, float(v)) for k, v in (references or {}).items() if np.isfinite(v)]
    for (name, value), (colour, dash) in zip(finite, REFERENCE_STYLES * len(finite)):
        label = f"{name}: {value:.3f}"
        if window is not None and not window[0] <= value <= window[1]:
            above = value > window[1]
            handles.append(Line2D([], [], color=colour, marker="^" if above else "v",
                                  linestyle="none",
                                  label=f"{label} (off the axis, {'above' if above else 'below'})"))
            continue
        ax.axhline(value, color=colour, linestyle=dash, linewidth=1.3, zorder=1.5)
        handles.append(Line2D([], [], color=colour, linestyle=dash, linewidth=1.3, label=label))
    return handles


def rotate_if_crowded(ax: Any, n: int) -> None:
    """Slant the x tick labels of ``ax`` when it has more than 4 categories (``n``)."""
    if n > 4:
        ax.tick_params(axis="x", labelrotation=30)
        for label in ax.get_xticklabels():
            label.set_horizontalalignment("right")
