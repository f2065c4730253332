"""The study's figures of losses and comparisons: one seaborn figure per ``plot_*`` function,
written as a PNG.

Every function takes the frames of :mod:`lmablate.report.collect` and a path, draws with
:func:`lmablate.report.figures.plotting.figure` (matplotlib's Agg, no pyplot state) and writes the
PNG atomically; it returns the path, or None when there is nothing to draw (or, for
:func:`plot_params_vs_loss`, nothing worth drawing). Variants appear in the study order carried
by the frames' categorical ``variant`` column (baseline first), never re-sorted here.

The other figures: the model's insides in :mod:`lmablate.report.figures.model_figures`, the tuning
in :mod:`lmablate.report.figures.tuning_figure`, the arithmetic ones in
:mod:`lmablate.report.figures.arithmetic_figures`.

Units: losses are natural-log cross-entropy per character (nats/char,
:data:`~lmablate.report.figures.plotting.LOSS_UNIT`); accuracies are fractions in [0, 1]; parameter
counts are counts.

Colours: the figures that colour by variant take ``palette`` (variant -> colour), from
:func:`lmablate.report.families.family_palette`, the one source of variant colours. Reference
losses (e.g. n-gram models' test losses, label -> nats/char) are drawn by
:func:`plot_val_loss_curves` and :func:`plot_test_loss` as labelled grey horizontal lines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.legend_handler import HandlerLine2D
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import StrMethodFormatter

from lmablate.report.collect import BASELINE, present
from lmablate.report.figures import plotting
from lmablate.report.figures.plotting import LOSS_UNIT
from lmablate.report.stats.statistics import (ALPHA, METRICS, VERDICT_BETTER, VERDICT_FEW,
                                          VERDICT_IDENTICAL, VERDICT_NSD,
                                          VERDICT_UNDECIDED_TUNING, VERDICT_WORSE, t_interval)

VERDICT_COLORS = {
    VERDICT_BETTER: "#1a9850",
    VERDICT_WORSE: "#d73027",
    VERDICT_NSD: "#4d4d4d",
    VERDICT_FEW: "#b0b0b0",
    VERDICT_IDENTICAL: "#5b7a99",  # blue-grey: a result, but not a tested one
    VERDICT_UNDECIDED_TUNING: "#e08214",  # orange: significant, but inside the tuning's reach
}

JITTER_SEED = 0  # the strip plot's horizontal jitter (see plot_test_loss)

# plot_test_loss draws a reference only within this many data ranges beyond the data (the
# seeds and the means' intervals): a far reference (a unigram model ~1.3 nats above the
# variants) would squash the differences between variants into a few pixels
REFERENCE_WINDOW = 1.5
# plot_params_vs_loss draws nothing when the largest parameter count is less than this many
# times the smallest: variants trained at one width differ by a few percent (a SwiGLU FFN, a
# norm without bias), and an axis spanning 1.5% of the counts makes seed noise read as a trend
# in size. Neighbouring widths the tuner picks from (24, 32, 40) differ by 1.5x or more in
# parameters, so 1.2 keeps every figure where the variants really differ in size.
MIN_PARAMS_RATIO = 1.2
# plot_val_loss_curves draws a reference only within this share of the curves' range beyond
# it: an n-gram line 1 nat above a curve's start set the axis, and the curves shared its
# bottom tenth
CURVE_REFERENCE_WINDOW = 0.1
# plot_val_loss_curves puts the loss on a log axis when the means span more than this factor:
# an answer loss falls from ~1 to ~0.02, and a linear axis hides where it ends
LOG_SPAN = 10.0


def plot_val_loss_curves(history: pd.DataFrame, dataset: str, path: Path, *,
                         palette: Mapping[str, Any],
                         references: Mapping[str, float] | None = None,
                         metric: str = "val_loss",
                         flops_per_token: Mapping[str, float] | None = None) -> Path | None:
    """A validation loss during training, one line per variant: the mean over seeds with a
    band of +-1 SD over seeds (SD, not a bootstrap CI: 3 seeds make a poor bootstrap).

    Args:
        palette: variant -> colour (:func:`~lmablate.report.families.family_palette`).
        references: label -> loss in ``metric``'s unit, e.g. n-gram baselines. One within
            :data:`CURVE_REFERENCE_WINDOW` of the curves' range is a grey dashed line named with
            its value in the legend; a farther one is only named, ``"(off the axis, above)"``
            (or below), so that it does not squash the curves.
        metric: the column of ``history`` drawn, ``val_loss`` (nats/char) or
            ``val_answer_loss`` (nats/answer char), the headline loss's validation twin.
        flops_per_token: variant -> training FLOPs per token
            (:func:`lmablate.model.gpt.flops_per_token`): the x axis is then training compute,
            ``tokens`` x FLOPs per token, on which every variant ends at the same budget;
            without it, training tokens.

    The y axis is logarithmic when the means span more than :data:`LOG_SPAN` (an answer loss
    falling towards 0), so the end of training, where the verdicts are, stays readable.

    Returns ``path``, or None if there is no history of ``metric`` for ``dataset``."""
    h = history[history["dataset"] == dataset] if len(history) else history
    if h.empty or metric not in h:
        return None
    h = h.dropna(subset=[metric])
    if h.empty:
        return None
    order = present(h["variant"])
    n_seeds = h.groupby("variant", observed=True)["seed"].nunique().max()
    x, x_label = "tokens", "training tokens"
    if flops_per_token is not None and all(v in flops_per_token for v in order):
        h = h.assign(flops=h["tokens"] * h["variant"].astype(str).map(flops_per_token))
        x, x_label = "flops", "training compute (FLOPs)"
    name, unit = curve_label(metric)
    low, high, log = _curve_range(h, x, metric)
    with plotting.figure(path, figsize=(8.5, 4.8)) as (fig, axes):
        ax = axes[0, 0]
        sns.lineplot(data=h, x=x, y=metric, hue="variant", hue_order=order,
                     palette=plotting.variant_palette(order, palette), errorbar="sd", marker="o",
                     markersize=4, ax=ax)
        handles, labels = ax.get_legend_handles_labels()
        refs = plotting.draw_references(ax, references, _curve_window(low, high, log))
        ax.set_title(f"{dataset}: {name} during training\n"
                     f"(mean over {n_seeds} seed(s), band = ±1 SD)")
        ax.set_xlabel(x_label)
        ax.set_ylabel(f"{name} ({unit})" if unit else name)
        if log:
            ax.set_yscale("log")
        # outside the axes: with a dozen variants an inner legend hides the curves
        ax.legend(handles + refs, labels + [r.get_label() for r in refs],
                  title="variant" + (" / reference" if refs else ""),
                  loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9)
    return Path(path)


def curve_label(metric: str) -> tuple[str, str]:
    """``(name, unit)`` of a validation curve of ``history.csv``: ``val_loss`` is the
    validation loss (nats/char), ``val_<m>`` the validation twin of metric ``m`` of
    :data:`~lmablate.report.stats.statistics.METRICS` (``val_answer_loss``: validation answer
    loss, nats/answer char)."""
    if metric in METRICS:
        return METRICS[metric][0], METRICS[metric][1]
    name, unit, _ = METRICS.get(metric.removeprefix("val_"), (metric, "", None))
    return f"validation {name}", unit


def _curve_range(h: pd.DataFrame, x: str, metric: str) -> tuple[float, float, bool]:
    """``(low, high, log)``: the range of the curves of ``metric`` against ``x`` (the means
    over seeds +- 1 SD), and whether their means span more than :data:`LOG_SPAN`."""
    means = h.groupby(["variant", x], observed=True)[metric].agg(["mean", "std"]).fillna(0.0)
    low = float((means["mean"] - means["std"]).min())
    high = float((means["mean"] + means["std"]).max())
    log = bool(means["mean"].min() > 0 and means["mean"].max() > LOG_SPAN * means["mean"].min())
    return low, high, log


def _curve_window(low: float, high: float, log: bool) -> tuple[float, float]:
    """The losses within which :func:`plot_val_loss_curves` draws references: the curves'
    range (means +- 1 SD) widened on each side by :data:`CURVE_REFERENCE_WINDOW` of its span
    (in log on a log axis)."""
    if log:
        low = max(low, high * 1e-6)
        span = np.log(high / low) if high > low else np.log(2.0)
        pad = np.exp(CURVE_REFERENCE_WINDOW * span)
        return low / pad, high * pad
    span = high - low if high > low else 0.05 * max(abs(high), 1.0)
    return low - CURVE_REFERENCE_WINDOW * span, high + CURVE_REFERENCE_WINDOW * span


def plot_test_loss(ablation: pd.DataFrame, dataset: str, path: Path, *,
                   references: Mapping[str, float] | None = None,
                   metric: str = "test_loss") -> Path | None:
    """A test loss per variant: each seed as a grey dot, the mean as a diamond with its 95%
    Student-t interval (the same interval as summary.csv); a dotted line marks the baseline
    mean.

    Args:
        references: label -> loss in ``metric``'s unit, e.g. n-gram baselines. A reference within
            :data:`REFERENCE_WINDOW` data ranges of the data (seeds and intervals) is a grey
            dashed line named with its value in the legend; a farther one is not drawn, so as
            not to squash the variants' differences, and the legend names it as
            ``"<label>: <value> (off the axis, above)"`` (or below).
        metric: the column of ``ablation`` drawn: ``test_loss`` (nats/char) or, for the
            arithmetic headline, ``answer_loss`` (nats/answer char).

    Returns ``path``, or None without values of ``metric`` for ``dataset``."""
    if metric not in ablation:
        return None
    d = ablation[(ablation["dataset"] == dataset)].dropna(subset=[metric])
    if d.empty:
        return None
    order = present(d["variant"])
    with plotting.figure(path, figsize=(max(6.0, 1.1 * len(order) + 2.5), 4.5)) as (fig, axes):
        ax = axes[0, 0]
        # seaborn draws the jitter from numpy's global generator: seed it for this call only,
        # so that the same runs always give the same figure (and the caller's state is kept)
        state = np.random.get_state()
        np.random.seed(JITTER_SEED)
        try:
            sns.stripplot(data=d, x="variant", y=metric, order=order, color="0.5", size=5,
                          alpha=0.75, jitter=0.12, ax=ax)
        finally:
            np.random.set_state(state)
        sns.pointplot(data=d, x="variant", y=metric, order=order, errorbar=t_interval,
                      color="C3", markers="D", linestyle="none", capsize=0.15, ax=ax)
        base = d.loc[d["variant"] == BASELINE, metric]
        handles = [
            Line2D([], [], color="0.5", marker="o", linestyle="none", label="one seed"),
            Line2D([], [], color="C3", marker="D", label="mean ± 95% t-interval"),
        ]
        if len(base):
            ax.axhline(base.mean(), color="0.3", linestyle=":", linewidth=1)
            handles.append(Line2D([], [], color="0.3", linestyle=":", label="baseline mean"))
        handles += plotting.draw_references(ax, references, _reference_window(d, metric))
        name, unit, _ = METRICS.get(metric, (metric, "", None))
        ax.set_title(f"{dataset}: {name} per variant")
        ax.set_xlabel("variant")
        ax.set_ylabel(f"{name} ({unit})" if unit else name)
        ax.legend(handles=handles, loc="best", fontsize=9)
        plotting.rotate_if_crowded(ax, len(order))
    return Path(path)


def _reference_window(d: pd.DataFrame, metric: str = "test_loss") -> tuple[float, float]:
    """The losses of ``metric`` within which :func:`plot_test_loss` draws references: the
    range of the seeds' losses and of the means' t-intervals, widened on each side by
    :data:`REFERENCE_WINDOW` times its width (times 5% of the loss when all are equal)."""
    values = list(d[metric].astype(float))
    for _, losses in d.groupby("variant", observed=True)[metric]:
        values += [float(v) for v in t_interval(losses)]
    finite = [v for v in values if np.isfinite(v)]
    low, high = min(finite), max(finite)
    span = high - low if high > low else 0.05 * max(abs(high), 1.0)
    return low - REFERENCE_WINDOW * span, high + REFERENCE_WINDOW * span


def plot_forest(comparisons: pd.DataFrame, dataset: str, path: Path,
                metric: str = "test_loss") -> Path | None:
    """Forest plot of ``variant - baseline`` in ``metric`` (the metric's unit) per variant,
    paired by seed: the mean difference as a diamond coloured by the Holm-corrected verdict,
    its raw 95% t-interval as a thin line with caps, its Holm-adjusted interval
    (``ci_holm_low``..``ci_holm_high``, when given) as a thick translucent bar, and that
    interval widened on each side by the row's ``tuning_uncertainty`` (when given,
    :func:`~lmablate.report.stats.statistics.tuning_check`) as a dotted box; a vertical line
    at 0 (no difference). A text column right of the axes gives each variant's Holm p-value
    (``*`` = significant), ``"identical on every seed"`` or ``"n=2: no test"``: outside the
    data area, no label can hide a marker or an interval. The legend (verdicts, interval kinds)
    is below the figure. The x axis spans every interval and 0, with a margin.

    Returns ``path``, or None when ``dataset`` has no comparison for ``metric``."""
    c = _forest_rows(comparisons, dataset, metric)
    if c.empty:
        return None
    with plotting.figure(path, figsize=(8.0, 2.4 + 0.45 * len(c))) as (fig, axes):
        _draw_forest(fig, axes[0, 0], c, dataset, metric)
    return Path(path)


def forest_limits(c: pd.DataFrame, margin: float = 0.06) -> tuple[float, float]:
    """The x range of a forest plot of the rows ``c`` (:func:`_forest_rows`): every mean, the
    ends of every raw and Holm interval (and of the Holm interval widened by the tuning
    uncertainty) and 0, widened by
    ``margin`` of that span on each side (a Holm bar clipped at the edge hides how far it
    reaches)."""
    cols = [x for x in ("mean_diff", "ci95_low", "ci95_high", "ci_holm_low", "ci_holm_high",
                        "tuned_low", "tuned_high") if x in c]
    values = np.concatenate([c[cols].to_numpy(float).ravel(), [0.0]])
    values = values[np.isfinite(values)]
    low, high = float(values.min()), float(values.max())
    span = high - low if high > low else max(abs(high), 1e-3)
    return low - margin * span, high + margin * span


def _forest_rows(comparisons: pd.DataFrame, dataset: str, metric: str) -> pd.DataFrame:
    """The rows of the forest plot, in variant order, with ``y`` = 0, 1, ...; the Holm interval
    columns are NaN when ``comparisons`` has none."""
    c = comparisons[(comparisons["dataset"] == dataset) & (comparisons["metric"] == metric)]
    c = c.dropna(subset=["mean_diff"])
    c = c[c["variant"] != BASELINE].reset_index(drop=True)  # rows already in variant order
    for col in ("ci95_low", "ci95_high", "ci_holm_low", "ci_holm_high", "p_holm",
                "tuning_uncertainty"):
        c[col] = c[col].astype(float) if col in c else np.nan
    # the Holm interval widened by the larger tuning uncertainty of the pair: a verdict stands
    # only when this still excludes 0 (statistics.tuning_check)
    c["tuned_low"] = c["ci_holm_low"] - c["tuning_uncertainty"]
    c["tuned_high"] = c["ci_holm_high"] + c["tuning_uncertainty"]
    c["y"] = np.arange(len(c))
    return c


def _forest_note(r: pd.Series) -> str:
    """The text beside a forest-plot row: its Holm p-value, or why it has none."""
    if r["verdict"] == VERDICT_FEW:
        return f"n={int(r['n_pairs'])}: no test" if pd.notna(r["n_pairs"]) else "no test"
    if r["verdict"] == VERDICT_IDENTICAL:
        return VERDICT_IDENTICAL
    if not np.isfinite(r["p_holm"]):
        return "p n/a"
    star = " *" if pd.notna(r.get("reject_holm")) and bool(r["reject_holm"]) else ""
    return f"p_Holm={r['p_holm']:.2g}{star}"


def _draw_forest(fig: Figure, ax: Any, c: pd.DataFrame, dataset: str, metric: str) -> None:
    """Draw :func:`plot_forest`'s rows ``c`` (from :func:`_forest_rows`) on ``ax`` of ``fig``."""
    label, _, higher = METRICS[metric]
    unit = plotting.metric_unit(metric)
    ax.axvline(0, color="black", linewidth=1, linestyle="--")
    for _, r in c.iterrows():
        colour = VERDICT_COLORS[r["verdict"]]
        if np.isfinite(r["ci_holm_low"]) and np.isfinite(r["ci_holm_high"]):
            ax.barh(r["y"], r["ci_holm_high"] - r["ci_holm_low"], left=r["ci_holm_low"],
                    height=0.5, color=colour, alpha=0.3, linewidth=0, zorder=1)
        if np.isfinite(r["tuned_low"]) and np.isfinite(r["tuned_high"]):
            ax.barh(r["y"], r["tuned_high"] - r["tuned_low"], left=r["tuned_low"],
                    height=0.66, fill=False, edgecolor=colour, linestyle=":", linewidth=1.1,
                    zorder=1)
        if np.isfinite(r["ci95_low"]) and np.isfinite(r["ci95_high"]):
            # caps keep a narrow interval visible behind its marker
            ax.errorbar(r["mean_diff"], r["y"], fmt="none", ecolor=colour, elinewidth=1.3,
                        capsize=5, capthick=1.3, zorder=2,
                        xerr=[[r["mean_diff"] - r["ci95_low"]],
                              [r["ci95_high"] - r["mean_diff"]]])
    verdicts = [v for v in VERDICT_COLORS if v in set(c["verdict"])]
    sns.scatterplot(data=c, x="mean_diff", y="y", hue="verdict", hue_order=verdicts,
                    palette=VERDICT_COLORS, s=70, marker="D", edgecolor="white", zorder=3,
                    legend=False, ax=ax)
    for _, r in c.iterrows():
        # x in axes fraction, y in data: a column right of the axes, whatever the data
        ax.annotate(_forest_note(r), xy=(1.02, r["y"]), xycoords=("axes fraction", "data"),
                    va="center", ha="left", fontsize=8, annotation_clip=False)
    ax.set_yticks(c["y"], c["variant"])
    ax.set_ylim(len(c) - 0.5, -0.5)  # first variant on top, as in the tables
    ax.set_xlim(*forest_limits(c))
    better = "> 0" if higher else "< 0"
    ax.set_xlabel(f"Δ {label} (variant − baseline){', ' + unit if unit else ''}; "
                  f"{better} = better")
    ax.set_ylabel("variant")
    tuned = bool(np.isfinite(c["tuned_low"]).any())
    ax.set_title(f"{dataset}: difference to baseline in {label}, paired by seed\n"
                 "thin line with caps: 95% t-interval; thick bar: Holm-adjusted interval"
                 + ("; dotted: ± tuning uncertainty" if tuned else "") + "\n"
                 f"p_Holm: Holm-corrected p-value, * = significant (α={ALPHA})")
    _forest_legend(fig, verdicts, tuned)


def _forest_legend(fig: Figure, verdicts: Sequence[str], tuned: bool = False) -> None:
    """The forest plot's legend, below the figure: outside the axes and away from the p-value
    column at their right, it can cover neither. ``tuned``: an entry for the Holm interval
    widened by the tuning uncertainty."""
    raw = Line2D([], [], color="0.3", linewidth=1.3, marker="|", markersize=9,
                 markeredgewidth=1.3)
    handles = [Line2D([], [], color=VERDICT_COLORS[v], marker="D", markeredgecolor="white",
                      markersize=8, linestyle="none") for v in verdicts]
    handles += [raw, Patch(facecolor="0.3", alpha=0.3, linewidth=0)]
    labels = [*verdicts, "95% t-interval (raw)", "Holm-adjusted interval"]
    if tuned:
        handles.append(Patch(fill=False, edgecolor="0.3", linestyle=":", linewidth=1.1))
        labels.append("Holm interval ± tuning uncertainty")
    # two markers on the raw interval's sample: the caps at its ends
    fig.legend(handles, labels, loc="outside lower center", ncol=3, fontsize=8,
               title="verdict (colour) and intervals", title_fontsize=8,
               handler_map={raw: HandlerLine2D(numpoints=2)})


def params_range(ablation: pd.DataFrame, dataset: str) -> tuple[float, float] | None:
    """The smallest and largest non-embedding parameter count (counts) of ``dataset``'s runs
    with a test loss; None without any."""
    d = ablation[ablation["dataset"] == dataset].dropna(
        subset=["test_loss", "n_params_non_embedding"])
    if d.empty:
        return None
    n = d["n_params_non_embedding"].astype(float)
    return float(n.min()), float(n.max())


def params_too_narrow(ablation: pd.DataFrame, dataset: str) -> str | None:
    """Why :func:`plot_params_vs_loss` draws no figure of ``dataset`` although it has parameter
    counts: a sentence naming their range when the largest is less than
    :data:`MIN_PARAMS_RATIO` times the smallest; None otherwise (a figure, or no counts)."""
    span = params_range(ablation, dataset)
    if span is None or span[1] >= MIN_PARAMS_RATIO * span[0]:
        return None
    low, high = span
    return (f"{dataset}: non-embedding parameters vs test loss not drawn: the parameter counts "
            f"span {low:,.0f} to {high:,.0f} ({high / low - 1:.1%} apart), too narrow a range "
            "to show a trend in size (the figure needs the largest at least "
            f"{MIN_PARAMS_RATIO:g} times the smallest).")


def plot_params_vs_loss(ablation: pd.DataFrame, dataset: str, path: Path, *,
                        palette: Mapping[str, Any]) -> Path | None:
    """Non-embedding parameter count against test loss (nats/char), one point per seed,
    colour and marker = variant (``palette``: variant -> colour). Shows whether a variant's gain
    is just extra capacity.

    Returns ``path``, or None without parameter counts for ``dataset`` or when they span too
    narrow a range to show a trend (:func:`params_too_narrow` says so in a sentence).

    Raises:
        ValueError: ``palette`` has no colour for a variant.
    """
    span = params_range(ablation, dataset)
    if span is None or span[1] < MIN_PARAMS_RATIO * span[0]:
        return None
    d = ablation[ablation["dataset"] == dataset].dropna(
        subset=["test_loss", "n_params_non_embedding"]).copy()
    d["n_params_non_embedding"] = d["n_params_non_embedding"].astype(float)
    order = present(d["variant"])
    with plotting.figure(path, figsize=(7.5, 4.5)) as (fig, axes):
        ax = axes[0, 0]
        sns.scatterplot(data=d, x="n_params_non_embedding", y="test_loss", hue="variant",
                        hue_order=order, palette=plotting.variant_palette(order, palette),
                        style="variant",
                        style_order=order, s=70, alpha=0.85, ax=ax)
        ax.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))  # exact counts
        ax.margins(x=0.1)
        ax.set_title(f"{dataset}: size vs test loss (one point per seed)")
        ax.set_xlabel("non-embedding parameters (count)")
        ax.set_ylabel(f"test loss ({LOSS_UNIT})")
        ax.legend(title="variant", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return Path(path)


def plot_position_loss(curves: pd.DataFrame, dataset: str, context_length: int, path: Path, *,
                       palette: Mapping[str, Any],
                       positions: Mapping[str, str] | None = None) -> Path | None:
    """Test loss (nats/char) against token position, one line per variant, in the style of
    Press et al. 2022, fig. 1: each variant at the longest length it can run (a learned position
    table stops at ``context_length``), the mean over seeds of each position bucket, and a
    dashed vertical line where the training context ends.

    Args:
        curves: :func:`lmablate.report.stats.extrapolation.position_curves` of ``dataset``.
        positions: variant -> its position scheme, named in the legend.

    Returns ``path``, or None if ``curves`` is empty."""
    if curves.empty:
        return None
    order = present(curves["variant"])
    colours = plotting.variant_palette(order, palette)
    with plotting.figure(path, figsize=(8.5, 4.8)) as (fig, axes):
        ax = axes[0, 0]
        for v in order:
            c = curves[curves["variant"] == v]
            label = v + (f" ({positions[v]})" if positions and v in positions else "")
            ax.plot(c["position"] + 1, c["loss"], marker="o", markersize=3, color=colours[v],
                    label=label)
        ax.axvline(context_length, color="0.4", linestyle="--", linewidth=1.2)
        ax.text(context_length, 1.0, " training context", transform=ax.get_xaxis_transform(),
                va="top", ha="left", fontsize=8, color="0.3")
        n_seeds = int(curves["seeds"].max())
        ax.set_title(f"{dataset}: test loss by token position, up to "
                     f"{int(curves['factor'].max())}x the training context\n"
                     f"(mean over {n_seeds} seed(s); a point is a bucket of positions, "
                     "drawn at its first)")
        ax.set_xlabel("token position in the window (1-based)")
        ax.set_ylabel(f"test loss ({LOSS_UNIT})")
        ax.legend(title="variant (positions)", loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  fontsize=8)
    return Path(path)
