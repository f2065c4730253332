"""What every figure module of the study shares: the figure itself, variant colours, units and
reference lines.

The figures live in :mod:`lmablate.report.figures.losses` (losses, comparisons, gradients),
:mod:`lmablate.report.figures.model_figures` (attention, embeddings), :mod:`lmablate.report.figures.
tuning_figure` (the learning-rate response) and :mod:`lmablate.report.figures.arithmetic_figures`
(by operation, by operand length); each draws with :func:`figure` and colours variants with
:func:`variant_palette`.

Units: losses on the study's character data are natural-log cross-entropy per character
(:data:`LOSS_UNIT`, "nats/char": one token is one character); accuracies are fractions.
"""

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

# (colour, dash pattern) of the 1st, 2nd, ... reference line: grey tones so that they read as
# background, distinct dashes so that they can be told apart without colour
REFERENCE_STYLES = [("0.35", (0, (7, 3))), ("0.5", (0, (2, 2))), ("0.25", (0, (7, 2, 1.5, 2))),
                    ("0.6", (0, (1, 1))), ("0.4", (0, (12, 3)))]


# a tuning objective (best.json's ``objective``) -> what its value is, and its unit
OBJECTIVES = {
    "val_loss": ("validation loss", LOSS_UNIT),
    "val_answer_loss": ("validation answer loss", "nats/answer char"),
    "val_answer_loss_mean": ("validation answer loss, mean over the run", "nats/answer char"),
}


def objective_label(objective: str, where: str) -> str:
    """An axis label for tuning trials' values of ``objective`` (``val_loss``,
    ``val_answer_loss``, ``val_answer_loss_mean``; another is read as ``val_loss``), e.g.
    ``"validation answer loss, mean over the run, at the full budget\n(nats/answer char)"``
    for ``where`` = ``"at the full budget"``."""
    name, unit = OBJECTIVES.get(objective, OBJECTIVES["val_loss"])
    return f"{name} {where}\n({unit})"


@contextmanager
def figure(path: Path, figsize: tuple[float, float] = (7.5, 4.5), nrows: int = 1,
           ncols: int = 1, **subplot_kw: Any) -> Iterator[tuple[Figure, np.ndarray]]:
    """A seaborn-styled figure saved (atomically, PNG, :data:`DPI`) to ``path`` on exit.

    Yields ``(fig, axes)``, ``axes`` always 2-D (``nrows`` x ``ncols``). Uses
    ``matplotlib.figure.Figure`` directly, not pyplot: no global figure registry to leak, no GUI
    backend needed (the PNG is drawn by Agg), and the caller's pyplot state is untouched. Style
    contexts are local for the same reason (``sns.set_theme`` would change global rc). Nothing
    is written when the body raises.
    """
    with sns.axes_style("whitegrid"), sns.plotting_context("notebook", font_scale=0.85):
        fig = Figure(figsize=figsize, dpi=DPI, layout="constrained")
        axes = fig.subplots(nrows, ncols, squeeze=False, **subplot_kw)
        yield fig, axes
        with fileio.atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", dpi=DPI)


@contextmanager
def panels(path: Path, n: int, max_cols: int, panel: tuple[float, float],
           margin: tuple[float, float]) -> Iterator[tuple[Figure, np.ndarray]]:
    """:func:`figure` with ``n`` panels (n >= 1), at most ``max_cols`` a row, each ``panel``
    (width, height) inches plus ``margin`` inches for the figure's titles and colour bars;
    the grid's cells past the n-th are hidden. Yields ``(fig, axes)`` as :func:`figure`
    (2-D, ``ceil(n / cols)`` x ``cols``)."""
    ncols = min(n, max_cols)
    nrows = math.ceil(n / ncols)
    with figure(path, figsize=(panel[0] * ncols + margin[0], panel[1] * nrows + margin[1]),
                nrows=nrows, ncols=ncols) as (fig, axes):
        for ax in axes.ravel()[n:]:
            ax.set_visible(False)
        yield fig, axes


def variant_palette(order: Sequence[str], palette: Mapping[str, Any]) -> dict[str, Any]:
    """The colour of each variant of ``order`` (a figure's variants in study order), taken from
    ``palette`` (variant -> colour: :func:`lmablate.report.families.family_palette`, the one
    source of variant colours, so that every figure colours a variant alike).

    Raises:
        ValueError: ``palette`` has no colour for a variant of ``order``.
    """
    missing = [v for v in order if v not in palette]
    if missing:
        raise ValueError(f"palette has no colour for the variants {missing}")
    return {v: palette[v] for v in order}


def metric_unit(metric: str) -> str:
    """The unit of ``metric`` on a figure's axis: :data:`LOSS_UNIT` for the losses per
    character (``test_loss``, ``val_loss``), else the unit of
    :data:`lmablate.report.stats.statistics.METRICS` (``"nats/answer char"``, ``"fraction"``, ...).

    Raises:
        KeyError: ``metric`` is not in ``METRICS``.
    """
    unit = METRICS[metric][1]
    return LOSS_UNIT if unit == "nats/char" else unit


def draw_references(ax: Any, references: Mapping[str, float] | None,
                    window: tuple[float, float] | None = None) -> list[Line2D]:
    """Draw each reference (label -> value in the y axis's unit, e.g. a loss in nats/char) as a
    grey dashed horizontal line; return the legend handles, labelled ``"<label>: <value>"``
    (3 decimals).

    A reference outside ``window`` (y-axis units) is not drawn but gets a handle reading
    ``"<label>: <value> (off the axis, above|below)"`` with an up/down marker. Non-finite
    values are left out.
    """
    handles = []
    finite = [(k, float(v)) for k, v in (references or {}).items() if np.isfinite(v)]
    for i, (name, value) in enumerate(finite):
        colour, dash = REFERENCE_STYLES[i % len(REFERENCE_STYLES)]
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
    """Slant the x tick labels of ``ax`` when it has more than 4 categories (``n``): longer
    variant names would run into each other."""
    if n > 4:
        ax.tick_params(axis="x", labelrotation=30)
        for label in ax.get_xticklabels():
            label.set_horizontalalignment("right")
