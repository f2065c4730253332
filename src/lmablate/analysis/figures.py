"""The study's figures: one seaborn figure per ``plot_*`` function, written as a PNG.

Every function takes the frames of :mod:`lmablate.analysis.collect` (or plain arrays) and a
path, draws with matplotlib's Agg (no display, no pyplot state) and writes the PNG atomically;
it returns the path, or None when there is nothing to draw. Variants appear in the study order
carried by the frames' categorical ``variant`` column (baseline first), never re-sorted here.

Units: losses are natural-log cross-entropy per character token (nats/token); accuracies are
fractions in [0, 1]; parameter counts are counts; learning rates per optimizer step.

The arithmetic figures (by operation, by operand length) are drawn in
:mod:`lmablate.analysis.arithmetic` with this module's :func:`_figure` and palettes.

:func:`plot_attention` and :func:`plot_embedding_pca` take plain arrays, so the caller decides
which model and which input to visualise (the report stage loads checkpoints for them).

Colours: the figures that colour by variant take ``palette`` (variant -> colour, e.g. from
:func:`lmablate.analysis.families.family_palette`, which gives each family of variants its own
hue); without it every variant gets its own categorical colour. Reference losses (e.g. n-gram
models' test losses, label -> nats/token) are drawn by :func:`plot_val_loss_curves` and
:func:`plot_test_loss` as labelled grey horizontal lines.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.legend_handler import HandlerLine2D
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import (FuncFormatter, LogLocator, NullFormatter,
                               StrMethodFormatter)

from lmablate import fileio
from lmablate.analysis import sensitivity as sens
from lmablate.analysis.collect import BASELINE, present
from lmablate.analysis.statistics import (ALPHA, METRICS, VERDICT_BETTER, VERDICT_FEW,
                                          VERDICT_IDENTICAL, VERDICT_NSD, VERDICT_WORSE,
                                          t_interval)

DPI = 110
VERDICT_COLORS = {
    VERDICT_BETTER: "#1a9850",
    VERDICT_WORSE: "#d73027",
    VERDICT_NSD: "#4d4d4d",
    VERDICT_FEW: "#b0b0b0",
    VERDICT_IDENTICAL: "#5b7a99",  # blue-grey: a result, but not a tested one
}

JITTER_SEED = 0  # the strip plot's horizontal jitter (see plot_test_loss)

# (colour, dash pattern) of the 1st, 2nd, ... reference line: grey tones so that they read as
# background, distinct dashes so that they can be told apart without colour
REFERENCE_STYLES = [("0.35", (0, (7, 3))), ("0.5", (0, (2, 2))), ("0.25", (0, (7, 2, 1.5, 2))),
                    ("0.6", (0, (1, 1))), ("0.4", (0, (12, 3)))]
# plot_test_loss draws a reference only within this many data ranges beyond the data (the
# seeds and the means' intervals): a far reference (a unigram model ~1.3 nats above the
# variants) would squash the differences between variants into a few pixels
REFERENCE_WINDOW = 1.5


@contextmanager
def _figure(path: Path, figsize: tuple[float, float] = (7.5, 4.5), nrows: int = 1,
            ncols: int = 1, **subplot_kw: Any) -> Iterator[tuple[Figure, np.ndarray]]:
    """A seaborn-styled figure saved (atomically, PNG, :data:`DPI`) to ``path`` on exit.

    Uses ``matplotlib.figure.Figure`` directly, not pyplot: no global figure registry to leak,
    no GUI backend needed (the PNG is drawn by Agg), and the caller's pyplot state is untouched.
    Style contexts are local for the same reason (``sns.set_theme`` would change global rc).
    """
    with sns.axes_style("whitegrid"), sns.plotting_context("notebook", font_scale=0.85):
        fig = Figure(figsize=figsize, dpi=DPI, layout="constrained")
        axes = fig.subplots(nrows, ncols, squeeze=False, **subplot_kw)
        yield fig, axes
        with fileio.atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", dpi=DPI)


def _palette(order: Sequence[str]) -> dict[str, Any]:
    """One colour per variant of ``order`` (a figure's variants in study order), so figures
    showing the same variants colour them alike."""
    return dict(zip(order, sns.color_palette("tab10" if len(order) <= 10 else "husl",
                                             len(order))))


def _variant_palette(order: Sequence[str], palette: Mapping[str, Any] | None) -> dict[str, Any]:
    """The colour of each variant of ``order``: from ``palette`` (variant -> colour) when given,
    else :func:`_palette`.

    Raises:
        ValueError: ``palette`` has no colour for a variant of ``order``.
    """
    if palette is None:
        return _palette(order)
    missing = [v for v in order if v not in palette]
    if missing:
        raise ValueError(f"palette has no colour for the variants {missing}")
    return {v: palette[v] for v in order}


def _draw_references(ax: Any, references: Mapping[str, float] | None,
                     window: tuple[float, float] | None = None) -> list[Line2D]:
    """Draw each reference (label -> loss, nats/token) as a grey dashed horizontal line; return
    the legend handles, labelled ``"<label>: <value>"`` (3 decimals).

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


def _rotate_if_crowded(ax: Any, n: int) -> None:
    if n > 4:
        ax.tick_params(axis="x", labelrotation=30)
        for label in ax.get_xticklabels():
            label.set_horizontalalignment("right")


def plot_val_loss_curves(history: pd.DataFrame, dataset: str, path: Path, *,
                         palette: Mapping[str, Any] | None = None,
                         references: Mapping[str, float] | None = None) -> Path | None:
    """Validation loss (nats/token) against optimizer step, one line per variant: the mean over
    seeds with a band of +-1 SD over seeds (SD, not a bootstrap CI: 3 seeds make a poor
    bootstrap).

    Args:
        palette: variant -> colour (e.g. :func:`~lmablate.analysis.families.family_palette`);
            None: one categorical colour per variant.
        references: label -> loss (nats/token), e.g. n-gram baselines; each is a grey dashed
            horizontal line, named with its value in the legend. All are drawn, whatever their
            value: the curves start near log(vocab size) and pass most references.

    Returns ``path``, or None if there is no history for ``dataset``."""
    h = history[history["dataset"] == dataset] if len(history) else history
    if h.empty or "val_loss" not in h:
        return None
    h = h.dropna(subset=["val_loss"])
    order = present(h["variant"])
    n_seeds = h.groupby("variant", observed=True)["seed"].nunique().max()
    with _figure(path, figsize=(8.5, 4.8)) as (fig, axes):
        ax = axes[0, 0]
        sns.lineplot(data=h, x="step", y="val_loss", hue="variant", hue_order=order,
                     palette=_variant_palette(order, palette), errorbar="sd", marker="o",
                     markersize=4, ax=ax)
        handles, labels = ax.get_legend_handles_labels()
        refs = _draw_references(ax, references)
        ax.set_title(f"{dataset}: validation loss during training\n"
                     f"(mean over {n_seeds} seed(s), band = ±1 SD)")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("validation loss (nats/token)")
        # outside the axes: with a dozen variants an inner legend hides the curves
        ax.legend(handles + refs, labels + [r.get_label() for r in refs],
                  title="variant" + (" / reference (nats/token)" if refs else ""),
                  loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    return Path(path)


def plot_test_loss(ablation: pd.DataFrame, dataset: str, path: Path, *,
                   references: Mapping[str, float] | None = None) -> Path | None:
    """Test loss (nats/token) per variant: each seed as a grey dot, the mean as a diamond with
    its 95% Student-t interval (the same interval as summary.csv); a dotted line marks the
    baseline mean.

    Args:
        references: label -> loss (nats/token), e.g. n-gram baselines. A reference within
            :data:`REFERENCE_WINDOW` data ranges of the data (seeds and intervals) is a grey
            dashed line named with its value in the legend; a farther one is not drawn, so as
            not to squash the variants' differences, and the legend names it as
            ``"<label>: <value> (off the axis, above)"`` (or below).

    Returns ``path``, or None without test losses for ``dataset``."""
    d = ablation[(ablation["dataset"] == dataset)].dropna(subset=["test_loss"])
    if d.empty:
        return None
    order = present(d["variant"])
    with _figure(path, figsize=(max(6.0, 1.1 * len(order) + 2.5), 4.5)) as (fig, axes):
        ax = axes[0, 0]
        # seaborn draws the jitter from numpy's global generator: seed it for this call only,
        # so that the same runs always give the same figure (and the caller's state is kept)
        state = np.random.get_state()
        np.random.seed(JITTER_SEED)
        try:
            sns.stripplot(data=d, x="variant", y="test_loss", order=order, color="0.5", size=5,
                          alpha=0.75, jitter=0.12, ax=ax)
        finally:
            np.random.set_state(state)
        sns.pointplot(data=d, x="variant", y="test_loss", order=order, errorbar=t_interval,
                      color="C3", markers="D", linestyle="none", capsize=0.15, ax=ax)
        base = d.loc[d["variant"] == BASELINE, "test_loss"]
        handles = [
            Line2D([], [], color="0.5", marker="o", linestyle="none", label="one seed"),
            Line2D([], [], color="C3", marker="D", label="mean ± 95% t-interval"),
        ]
        if len(base):
            ax.axhline(base.mean(), color="0.3", linestyle=":", linewidth=1)
            handles.append(Line2D([], [], color="0.3", linestyle=":", label="baseline mean"))
        handles += _draw_references(ax, references, _reference_window(d))
        ax.set_title(f"{dataset}: test loss per variant")
        ax.set_xlabel("variant")
        ax.set_ylabel("test loss (nats/token)")
        ax.legend(handles=handles, loc="best", fontsize=8)
        _rotate_if_crowded(ax, len(order))
    return Path(path)


def _reference_window(d: pd.DataFrame) -> tuple[float, float]:
    """The test losses (nats/token) within which :func:`plot_test_loss` draws references: the
    range of the seeds' losses and of the means' t-intervals, widened on each side by
    :data:`REFERENCE_WINDOW` times its width (times 5% of the loss when all are equal)."""
    values = list(d["test_loss"].astype(float))
    for _, losses in d.groupby("variant", observed=True)["test_loss"]:
        values += [float(v) for v in t_interval(losses)]
    finite = [v for v in values if np.isfinite(v)]
    low, high = min(finite), max(finite)
    span = high - low if high > low else 0.05 * max(abs(high), 1.0)
    return low - REFERENCE_WINDOW * span, high + REFERENCE_WINDOW * span


def plot_forest(comparisons: pd.DataFrame, dataset: str, path: Path,
                metric: str = "test_loss") -> Path | None:
    """Forest plot of ``variant - baseline`` in ``metric`` (the metric's unit) per variant,
    paired by seed: the mean difference as a diamond coloured by the Holm-corrected verdict,
    its raw 95% t-interval as a thin line with caps and its Holm-adjusted interval
    (``ci_holm_low``..``ci_holm_high``, when given) as a thick translucent bar; a vertical line
    at 0 (no difference). A text column right of the axes gives each variant's Holm p-value
    (``*`` = significant), ``"identical on every seed"`` or ``"n=2: no test"``: outside the
    data area, no label can hide a marker or an interval. The legend (verdicts, interval kinds)
    is below the figure. Returns ``path``, or None when ``dataset`` has no comparison for
    ``metric``."""
    c = _forest_rows(comparisons, dataset, metric)
    if c.empty:
        return None
    with _figure(path, figsize=(8.0, 2.4 + 0.45 * len(c))) as (fig, axes):
        _draw_forest(fig, axes[0, 0], c, dataset, metric)
    return Path(path)


def _forest_rows(comparisons: pd.DataFrame, dataset: str, metric: str) -> pd.DataFrame:
    """The rows of the forest plot, in variant order, with ``y`` = 0, 1, ...; the Holm interval
    columns are NaN when ``comparisons`` has none."""
    c = comparisons[(comparisons["dataset"] == dataset) & (comparisons["metric"] == metric)]
    c = c.dropna(subset=["mean_diff"])
    c = c[c["variant"] != BASELINE].reset_index(drop=True)  # rows already in variant order
    for col in ("ci95_low", "ci95_high", "ci_holm_low", "ci_holm_high", "p_holm"):
        c[col] = c[col].astype(float) if col in c else np.nan
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
    ax.axvline(0, color="black", linewidth=1, linestyle="--")
    for _, r in c.iterrows():
        colour = VERDICT_COLORS[r["verdict"]]
        if np.isfinite(r["ci_holm_low"]) and np.isfinite(r["ci_holm_high"]):
            ax.barh(r["y"], r["ci_holm_high"] - r["ci_holm_low"], left=r["ci_holm_low"],
                    height=0.5, color=colour, alpha=0.3, linewidth=0, zorder=1)
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
    ax.margins(x=0.08)
    label, unit, higher = METRICS[metric]
    better = "> 0" if higher else "< 0"
    ax.set_xlabel(f"Δ {label} (variant − baseline){', ' + unit if unit else ''}; "
                  f"{better} = better")
    ax.set_ylabel("variant")
    ax.set_title(f"{dataset}: difference to baseline in {label}, paired by seed\n"
                 "thin line with caps: 95% t-interval; thick bar: Holm-adjusted interval\n"
                 f"p_Holm: Holm-corrected p-value, * = significant (α={ALPHA})")
    _forest_legend(fig, verdicts)


def _forest_legend(fig: Figure, verdicts: Sequence[str]) -> None:
    """The forest plot's legend, below the figure: outside the axes and away from the p-value
    column at their right, it can cover neither."""
    raw = Line2D([], [], color="0.3", linewidth=1.3, marker="|", markersize=9,
                 markeredgewidth=1.3)
    handles = [Line2D([], [], color=VERDICT_COLORS[v], marker="D", markeredgecolor="white",
                      markersize=8, linestyle="none") for v in verdicts]
    handles += [raw, Patch(facecolor="0.3", alpha=0.3, linewidth=0)]
    labels = [*verdicts, "95% t-interval (raw)", "Holm-adjusted interval"]
    # two markers on the raw interval's sample: the caps at its ends
    fig.legend(handles, labels, loc="outside lower center", ncol=3, fontsize=8,
               title="verdict (colour) and intervals", title_fontsize=8,
               handler_map={raw: HandlerLine2D(numpoints=2)})


def _tuned_rows(tuned: pd.DataFrame | None, dataset: str) -> dict[str, pd.Series]:
    """variant -> its row of ``tuned`` (best.json) for ``dataset``; empty without lr and
    d_model columns."""
    if tuned is None or tuned.empty or not {"lr", "d_model", "variant"} <= set(tuned):
        return {}
    rows = tuned[tuned["dataset"] == dataset].dropna(subset=["lr", "d_model"])
    return {str(r["variant"]): r for _, r in rows.iterrows()}


def _same_config(t: pd.DataFrame, lr: float, d_model: float) -> np.ndarray:
    """Rows of ``t`` trained at ``lr`` (to 1e-9 relative) and ``d_model``."""
    return (np.isclose(t["params_lr"].to_numpy(float), lr, rtol=1e-9, atol=0)
            & (t["params_d_model"].to_numpy(float) == float(d_model)))


def plot_lr_response(trials: pd.DataFrame, tuned: pd.DataFrame | None, dataset: str,
                     path: Path, *, palette: Mapping[str, Any] | None = None) -> Path | None:
    """How each variant of ``dataset`` responds to the learning rate, from its tuning trials
    (:mod:`lmablate.analysis.sensitivity`); two panels, colour = variant (``palette``:
    variant -> colour; None: one categorical colour each).

    * Left: the final validation loss (nats/token) of the first-rung trials against the
      learning rate (log axis). A line per variant joins its shared design points (rung 0,
      batch 0: the same learning rates at one width for every variant, so the lines are
      paired point by point); its other first-rung trials (TPE proposals, any width) are small
      faint dots; a diverged trial is an ``x`` at the top edge (it has no loss); a star marks
      the first-rung trial of the configuration tuning chose (``tuned``: best.json), a
      triangle at the bottom edge its learning rate when no first-rung trial matches.
    * Right, at equal compute (isoFLOP): the lowest first-rung loss per width
      (:func:`~lmablate.analysis.sensitivity.width_summary`; the tick labels give each width's
      training tokens per parameter), and the trials of the last rung (the full budget) as
      diamonds, filled for the chosen one. Their losses are at that larger share of the
      budget, hence lower.

    Every point is one seed (``tune.seed``). Returns ``path``, or None without first-rung
    trials for ``dataset`` (or a ``trials.csv`` without rungs, batches, lr, width or value).
    """
    t = sens.first_rung(trials)
    t = t[t["dataset"] == dataset]
    if t.empty:
        return None
    order = present(t["variant"])
    colours = _variant_palette(order, palette)
    chosen = _tuned_rows(tuned, dataset)
    last = sens.last_rung(trials)
    last = last[(last["dataset"] == dataset) & ~last["diverged"]]
    widths = sens.width_summary(t)
    design = t[t["batch"] == sens.DESIGN_BATCH]
    fraction = (t["budget_fraction"].dropna().unique() if "budget_fraction" in t else [])
    share = f"{fraction[0]:g} of the budget" if len(fraction) == 1 else "the first rung"
    design_widths = sorted(int(d) for d in design["params_d_model"].dropna().unique())
    gaps = np.diff(np.unique(np.concatenate([t["params_d_model"].dropna().to_numpy(float),
                                             last["params_d_model"].to_numpy(float)])))
    dodge = 0.3 * (gaps.min() if len(gaps) else 8.0) / max(1, len(order))
    unmatched = False  # a tuned lr drawn as a triangle: no first-rung trial at it
    with _figure(path, figsize=(12.5, 4.8), ncols=2) as (fig, axes):
        left, right = axes[0, 0], axes[0, 1]
        for variant in order:
            colour = colours[variant]
            mine = t[t["variant"] == variant]
            done = mine[~mine["diverged"]]
            d = done[done["batch"] == sens.DESIGN_BATCH].sort_values("params_lr")
            o = done[done["batch"] != sens.DESIGN_BATCH]
            left.plot(d["params_lr"], d["value"], color=colour, marker="o", markersize=5,
                      linewidth=1.6, zorder=3)
            left.scatter(o["params_lr"], o["value"], color=colour, s=14, alpha=0.35,
                         linewidths=0, zorder=2)
            bad = mine[mine["diverged"]]
            left.scatter(bad["params_lr"], [0.97] * len(bad), color=colour, marker="x", s=40,
                         transform=left.get_xaxis_transform(), zorder=3, clip_on=False)
            if variant in chosen:
                r = chosen[variant]
                hit = done[_same_config(done, float(r["lr"]), float(r["d_model"]))]
                if len(hit):
                    left.scatter(hit["params_lr"].iloc[:1], hit["value"].iloc[:1],
                                 color=colour, marker="*", s=260, edgecolors="black",
                                 linewidths=0.8, zorder=4)
                else:
                    unmatched = True
                    left.scatter([float(r["lr"])], [0.03], color=colour, marker="^", s=60,
                                 edgecolors="black", linewidths=0.6, zorder=4,
                                 transform=left.get_xaxis_transform(), clip_on=False)
            w = widths[widths["variant"] == variant].dropna(subset=["best_loss"])
            right.plot(w["d_model"], w["best_loss"], color=colour, linewidth=1.6, zorder=3)
            # dot area grows with the trials behind a width's best: one TPE trial at a poor
            # learning rate says little about the width
            right.scatter(w["d_model"], w["best_loss"], color=colour,
                          s=12 + 10 * w["n_trials"].astype(float), zorder=3)
            full = last[last["variant"] == variant]
            picked = (_same_config(full, float(chosen[variant]["lr"]),
                                   float(chosen[variant]["d_model"]))
                      if variant in chosen else np.zeros(len(full), dtype=bool))
            # dodged sideways by variant, so that variants at one width do not hide each other
            shift = (order.index(variant) - (len(order) - 1) / 2) * dodge
            for filled, part in ((True, full[picked]), (False, full[~picked])):
                right.scatter(part["params_d_model"] + shift, part["value"], marker="D", s=45,
                              facecolors=colour if filled else "white", edgecolors=colour,
                              linewidths=1.4, zorder=4)
        lrs = pd.concat([t["params_lr"], pd.Series([float(r["lr"]) for r in chosen.values()],
                                                   dtype=float)]).dropna()
        if len(lrs):
            low, high = float(lrs.min()), float(lrs.max())
            pad = (high / low) ** 0.05 if high > low else 2.0
            left.set_xlim(low / pad, high * pad)
        left.set_xscale("log")
        # 1-2-5 labelled ticks: a range may span less than a decade once extended
        left.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        left.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        left.xaxis.set_minor_formatter(NullFormatter())
        at = ", ".join(map(str, design_widths)) or "–"
        left.set_title(f"{dataset}: loss vs learning rate at {share}\n"
                       f"(lines: the shared design at d_model {at}; one seed)")
        left.set_xlabel("peak learning rate (log scale)")
        left.set_ylabel("validation loss at the trial's end (nats/token)")
        ticks = widths.drop_duplicates("d_model").sort_values("d_model")
        right.set_xticks(ticks["d_model"].tolist())
        right.set_xticklabels([f"{int(r.d_model)}\n{r.tokens_per_parameter:.3g}"
                               if pd.notna(r.tokens_per_parameter) else f"{int(r.d_model)}"
                               for r in ticks.itertuples()])
        right.margins(x=0.08)
        top = (last["budget_fraction"].dropna().unique()
               if "budget_fraction" in last and len(last) else [])
        top_share = ("no completed trial past the first rung" if len(top) != 1 else
                     "diamonds: last rung, " + ("the full budget" if top[0] == 1 else
                                                f"{top[0]:g} of the budget"))
        right.set_title(f"isoFLOP: best loss per width at {share}\n({top_share})")
        right.set_xlabel("d_model (below: training tokens per parameter)")
        right.set_ylabel("validation loss (nats/token)")
        handles = [Line2D([], [], color=colours[v], marker="o", markersize=5, label=v)
                   for v in order]
        handles += [
            Line2D([], [], color="0.3", marker="o", markersize=5,
                   label="design point (paired lr sweep)"),
            Line2D([], [], color="0.3", marker="o", markersize=4, alpha=0.35,
                   linestyle="none", label="other first-rung trial"),
            Line2D([], [], color="0.3", marker="o", markersize=8, linestyle="none",
                   label="best of a width (area: trials)"),
            Line2D([], [], color="0.3", marker="x", linestyle="none",
                   label="diverged (at the top edge)"),
            Line2D([], [], color="0.5", marker="*", markersize=13, markeredgecolor="black",
                   linestyle="none", label="tuned configuration"),
            Line2D([], [], color="0.3", marker="D", markerfacecolor="0.3", linestyle="none",
                   label="last rung: chosen"),
            Line2D([], [], color="0.3", marker="D", markerfacecolor="white", linestyle="none",
                   label="last rung: not chosen")]
        if unmatched:
            handles.append(Line2D([], [], color="0.5", marker="^", markeredgecolor="black",
                                  linestyle="none", label="tuned lr (no first-rung trial)"))
        fig.legend(handles=handles, title="variant / marker", loc="outside right upper",
                   fontsize=8)
    return Path(path)


def plot_params_vs_loss(ablation: pd.DataFrame, dataset: str, path: Path, *,
                        palette: Mapping[str, Any] | None = None) -> Path | None:
    """Non-embedding parameter count against test loss (nats/token), one point per seed,
    colour and marker = variant (``palette``: variant -> colour; None: one categorical colour
    each). Shows whether a variant's gain is just extra capacity.
    Returns ``path``, or None without parameter counts for ``dataset``."""
    d = ablation[ablation["dataset"] == dataset].dropna(
        subset=["test_loss", "n_params_non_embedding"]).copy()
    if d.empty:
        return None
    d["n_params_non_embedding"] = d["n_params_non_embedding"].astype(float)
    order = present(d["variant"])
    with _figure(path, figsize=(7.5, 4.5)) as (fig, axes):
        ax = axes[0, 0]
        sns.scatterplot(data=d, x="n_params_non_embedding", y="test_loss", hue="variant",
                        hue_order=order, palette=_variant_palette(order, palette),
                        style="variant",
                        style_order=order, s=70, alpha=0.85, ax=ax)
        ax.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))  # exact counts
        ax.margins(x=0.1)
        ax.set_title(f"{dataset}: size vs test loss (one point per seed)")
        ax.set_xlabel("non-embedding parameters (count)")
        ax.set_ylabel("test loss (nats/token)")
        ax.legend(title="variant", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return Path(path)


def plot_grad_flow(grad: pd.DataFrame, dataset: str, path: Path) -> Path | None:
    """Heatmap of the fraction of gradient entries with |grad| < 1e-8 after the last training
    step (mean over seeds), parameter group (rows) x variant (columns). High values flag dead
    units or vanishing gradients. Returns ``path``, or None without grad stats."""
    g = grad[grad["dataset"] == dataset] if len(grad) else grad
    if g.empty or "frac_near_zero" not in g:
        return None
    order = present(g["variant"])
    table = g.pivot_table(index="group", columns="variant", values="frac_near_zero",
                          aggfunc="mean", observed=True)
    table = table.reindex(index=list(pd.unique(g["group"])),
                          columns=[v for v in order if v in table.columns])
    with _figure(path, figsize=(1.2 * len(order) + 4.0, 0.4 * len(table) + 1.8)) as (fig, axes):
        ax = axes[0, 0]
        sns.heatmap(table, annot=True, fmt=".2f", vmin=0, vmax=1, cmap="rocket_r",
                    linewidths=0.5, cbar_kws={"label": "fraction of |grad| < 1e-8"}, ax=ax)
        ax.set_title(f"{dataset}: near-zero gradients after the last step (mean over seeds)")
        ax.set_xlabel("variant")
        ax.set_ylabel("parameter group")
        ax.tick_params(axis="y", labelrotation=0)
    return Path(path)


def _visible(token: str) -> str:
    """A printable stand-in for whitespace/control characters in tick labels."""
    return {" ": "␣", "\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(token, token)


def plot_attention(maps: Mapping[str, np.ndarray], tokens: Sequence[str], title: str,
                   path: Path) -> Path:
    """Attention weights on one input, one heatmap per panel (e.g. per variant).

    Args:
        maps: panel label -> array ``(T, T)``; ``m[i, j]`` is the weight query position i gives
            to key position j (rows sum to 1; causal maps are lower-triangular), e.g. the last
            layer's weights averaged over heads.
        tokens: the T input characters (ticks; whitespace shown as ␣ / \\n).
        title: figure title; path: PNG to write.

    Raises:
        ValueError: a map is not square T x T with T = ``len(tokens)``, or ``maps`` is empty.
    """
    arrays = {k: np.asarray(v, dtype=float) for k, v in maps.items()}
    t_len = len(tokens)
    if not arrays or any(m.shape != (t_len, t_len) for m in arrays.values()):
        raise ValueError(f"plot_attention: expected (T, T) maps with T = len(tokens) = {t_len}, "
                         f"got {[m.shape for m in arrays.values()]}")
    labels = [_visible(t) for t in tokens]
    step = max(1, math.ceil(t_len / 24))
    ncols = min(len(arrays), 4)
    nrows = math.ceil(len(arrays) / ncols)
    with _figure(path, figsize=(3.3 * ncols + 1.2, 3.3 * nrows + 0.8), nrows=nrows,
                 ncols=ncols) as (fig, axes):
        for ax in axes.ravel()[len(arrays):]:
            ax.set_visible(False)
        for i, (name, m) in enumerate(arrays.items()):
            ax = axes.ravel()[i]
            sns.heatmap(m, vmin=0, vmax=1, cmap="viridis", cbar=False, square=True,
                        xticklabels=False, yticklabels=False, ax=ax)
            ticks = np.arange(0, t_len, step) + 0.5
            ax.set_xticks(ticks, labels[::step] if i // ncols == nrows - 1 else [], rotation=90,
                          fontsize=6)
            ax.set_yticks(ticks, labels[::step] if i % ncols == 0 else [], fontsize=6)
            ax.set_title(name, fontsize=9)
        fig.supxlabel("key position (attended to)")
        fig.supylabel("query position")
        fig.colorbar(axes[0, 0].collections[0], ax=axes.ravel().tolist(), shrink=0.6,
                     label="attention weight")
        fig.suptitle(title)
    return Path(path)


def _char_class(ch: str) -> str:
    if ch.isspace():
        return "whitespace"
    if ch.isdigit():
        return "digit"
    if ch.isalpha():
        return "upper case" if ch.isupper() else "lower case"
    return "punctuation/other"


def plot_embedding_pca(embs: Mapping[str, np.ndarray], chars: Sequence[str], title: str,
                       path: Path) -> Path:
    """Token embeddings projected on their first two principal components, one panel per entry
    of ``embs`` (e.g. per variant); points labelled with their character, coloured by class.

    PCA: SVD of the column-centred matrix; each panel's axes give the share of variance.

    Args:
        embs: panel label -> ``(vocab_size, d_model)`` embedding weights.
        chars: the character of each row (len == vocab_size).
        title: figure title; path: PNG to write.

    Raises:
        ValueError: an array is not 2-D, has fewer than 2 columns, or rows != ``len(chars)``;
            or ``embs`` is empty.
    """
    arrays = {k: np.asarray(v, dtype=float) for k, v in embs.items()}
    if not arrays or any(e.ndim != 2 or e.shape[0] != len(chars) or e.shape[1] < 2
                         for e in arrays.values()):
        raise ValueError(f"plot_embedding_pca: expected arrays of shape (len(chars)="
                         f"{len(chars)}, d >= 2), got {[e.shape for e in arrays.values()]}")
    classes = [_char_class(c) for c in chars]
    ncols = min(len(arrays), 4)
    nrows = math.ceil(len(arrays) / ncols)
    with _figure(path, figsize=(4.2 * ncols, 3.8 * nrows + 0.6), nrows=nrows,
                 ncols=ncols) as (fig, axes):
        for ax in axes.ravel()[len(arrays):]:
            ax.set_visible(False)
        for i, (name, emb) in enumerate(arrays.items()):
            ax = axes.ravel()[i]
            centred = emb - emb.mean(axis=0)
            _, s, vt = np.linalg.svd(centred, full_matrices=False)
            pcs = centred @ vt[:2].T
            explained = s**2 / max(float(np.sum(s**2)), np.finfo(float).tiny)
            d = pd.DataFrame({"pc1": pcs[:, 0], "pc2": pcs[:, 1], "class": classes})
            sns.scatterplot(data=d, x="pc1", y="pc2", hue="class", s=25, alpha=0.6, ax=ax,
                            legend=i == 0)
            for (x, y), ch in zip(pcs[:, :2], chars):
                ax.annotate(_visible(ch), (x, y), xytext=(2, 2), textcoords="offset points",
                            fontsize=6)
            ax.set_title(name, fontsize=9)
            ax.set_xlabel(f"PC1 ({explained[0]:.0%} of variance)")
            ax.set_ylabel(f"PC2 ({explained[1]:.0%} of variance)")
        if axes[0, 0].get_legend() is not None:
            axes[0, 0].legend(title="character class", fontsize=7, title_fontsize=7)
        fig.suptitle(title)
    return Path(path)



def plot_position_loss(curves: pd.DataFrame, dataset: str, context_length: int, path: Path, *,
                       palette: Mapping[str, Any] | None = None,
                       positions: Mapping[str, str] | None = None) -> Path | None:
    """Test loss (nats/token) against token position, one line per variant, in the style of
    Press et al. 2022, fig. 1: each variant at the longest length it can run (a learned position
    table stops at ``context_length``), the mean over seeds of each position bucket, and a
    dashed vertical line where the training context ends.

    Args:
        curves: :func:`lmablate.analysis.extrapolation.position_curves` of ``dataset``.
        positions: variant -> its position scheme, named in the legend.

    Returns ``path``, or None if ``curves`` is empty."""
    if curves.empty:
        return None
    order = present(curves["variant"])
    colours = _variant_palette(order, palette)
    with _figure(path, figsize=(8.5, 4.8)) as (fig, axes):
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
        ax.set_ylabel("test loss (nats/token)")
        ax.legend(title="variant (positions)", loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  fontsize=8)
    return Path(path)
