"""The figures of losses and comparisons: each ``plot_*`` writes a PNG and returns its path, or
None when there is nothing (worth) drawing; variants in study order, coloured by ``palette``."""

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

# blue-grey: a result but not a tested one; orange: significant, but within the tuning's reach
VERDICT_COLORS = {VERDICT_BETTER: "#1a9850", VERDICT_WORSE: "#d73027", VERDICT_NSD: "#4d4d4d",
                  VERDICT_FEW: "#b0b0b0", VERDICT_IDENTICAL: "#5b7a99",
                  VERDICT_UNDECIDED_TUNING: "#e08214"}
JITTER_SEED = 0  # the strip plot's horizontal jitter (plot_test_loss)
# references drawn within this many data ranges of the data (plot_test_loss), or this share of
# the curves' range (plot_val_loss_curves): a far unigram line would squash the variants
REFERENCE_WINDOW = 1.5
CURVE_REFERENCE_WINDOW = 0.1
# no plot_params_vs_loss below this max/min parameter ratio: variants at one width differ by a
# few percent and seed noise would read as a trend in size (tuned widths differ by >= 1.5x)
MIN_PARAMS_RATIO = 1.2
LOG_SPAN = 10.0  # plot_val_loss_curves' y axis is log when the means span more (answer loss)


def plot_val_loss_curves(history: pd.DataFrame, dataset: str, path: Path, *,
                         palette: Mapping[str, Any], references: Mapping[str, float] | None = None,
                         metric: str = "val_loss",
                         flops_per_token: Mapping[str, float] | None = None) -> Path | None:
    """``metric`` (``val_loss``, nats/char, or ``val_answer_loss``, nats/answer char) during
    training, a line per variant: mean over seeds, band +-1 SD; ``references`` (label -> loss)
    within :data:`CURVE_REFERENCE_WINDOW`. x: FLOPs (tokens x ``flops_per_token[variant]``)
    when given, else tokens; y log past :data:`LOG_SPAN`. None without ``metric``."""
    h = history[history["dataset"] == dataset] if len(history) else history
    if h.empty or metric not in h or (h := h.dropna(subset=[metric])).empty:
        return None
    order = present(h["variant"])
    n_seeds = h.groupby("variant", observed=True)["seed"].nunique().max()
    x, x_label = "tokens", "training tokens"
    if flops_per_token is not None and all(v in flops_per_token for v in order):
        h = h.assign(flops=h["tokens"] * h["variant"].astype(str).map(flops_per_token))
        x, x_label = "flops", "training compute (FLOPs)"
    name, unit = curve_label(metric)
    window, log = _curve_window(h, x, metric)
    with plotting.figure(path, figsize=(8.5, 4.8)) as (fig, axes):
        ax = axes[0, 0]
        sns.lineplot(data=h, x=x, y=metric, hue="variant", hue_order=order,
                     palette=plotting.variant_palette(order, palette), errorbar="sd", marker="o",
                     markersize=4, ax=ax)
        handles, labels = ax.get_legend_handles_labels()
        refs = plotting.draw_references(ax, references, window)
        ax.set(title=f"{dataset}: {name} during training\n"
               f"(mean over {n_seeds} seed(s), band = ±1 SD)", xlabel=x_label,
               ylabel=f"{name} ({unit})" if unit else name)
        if log:
            ax.set_yscale("log")
        # outside the axes: with a dozen variants an inner legend hides the curves
        ax.legend(handles + refs, labels + [r.get_label() for r in refs],
                  title="variant" + (" / reference" if refs else ""),
                  loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9)
    return Path(path)


def curve_label(metric: str) -> tuple[str, str]:
    """``(name, unit)`` of a ``history.csv`` curve (``val_<m>``: the validation twin of ``m``)."""
    if metric in METRICS:
        return METRICS[metric][0], METRICS[metric][1]
    name, unit, _ = METRICS.get(metric.removeprefix("val_"), (metric, "", None))
    return f"validation {name}", unit


def _widen(low: float, high: float, k: float) -> tuple[float, float]:
    span = high - low if high > low else 0.05 * max(abs(high), 1.0)
    return low - k * span, high + k * span


def _curve_window(h: pd.DataFrame, x: str, metric: str) -> tuple[tuple[float, float], bool]:
    """The curves' range (mean +- SD) widened for references, and whether the axis is log."""
    means = h.groupby(["variant", x], observed=True)[metric].agg(["mean", "std"]).fillna(0.0)
    low = float((means["mean"] - means["std"]).min())
    high = float((means["mean"] + means["std"]).max())
    m = means["mean"]
    if not (m.min() > 0 and m.max() > LOG_SPAN * m.min()):
        return _widen(low, high, CURVE_REFERENCE_WINDOW), False
    low = max(low, high * 1e-6)
    pad = np.exp(CURVE_REFERENCE_WINDOW * (np.log(high / low) if high > low else np.log(2.0)))
    return (low / pad, high * pad), True


def plot_test_loss(ablation: pd.DataFrame, dataset: str, path: Path, *,
                   references: Mapping[str, float] | None = None,
                   metric: str = "test_loss") -> Path | None:
    """``metric`` (``test_loss``, nats/char, or ``answer_loss``, nats/answer char) per variant:
    seeds as grey dots, the mean a diamond with its 95% t-interval, a dotted baseline mean;
    ``references`` (label -> loss) within :data:`REFERENCE_WINDOW`. None without values."""
    if metric not in ablation or (d := ablation[ablation["dataset"] == dataset].dropna(
            subset=[metric])).empty:
        return None
    order = present(d["variant"])
    with plotting.figure(path, figsize=(max(6.0, 1.1 * len(order) + 2.5), 4.5)) as (fig, axes):
        ax = axes[0, 0]
        # seaborn jitters with numpy's global generator: seeded for this call only
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
        handles = [Line2D([], [], color="0.5", marker="o", linestyle="none", label="one seed"),
                   Line2D([], [], color="C3", marker="D", label="mean ± 95% t-interval")]
        if len(base):
            ax.axhline(base.mean(), color="0.3", linestyle=":", linewidth=1)
            handles.append(Line2D([], [], color="0.3", linestyle=":", label="baseline mean"))
        handles += plotting.draw_references(ax, references, _reference_window(d, metric))
        name, unit, _ = METRICS.get(metric, (metric, "", None))
        ax.set(title=f"{dataset}: {name} per variant", xlabel="variant",
               ylabel=f"{name} ({unit})" if unit else name)
        ax.legend(handles=handles, loc="best", fontsize=9)
        plotting.rotate_if_crowded(ax, len(order))
    return Path(path)


def _reference_window(d: pd.DataFrame, metric: str) -> tuple[float, float]:
    values = [*d[metric].astype(float), *(float(v) for _, losses in d.groupby(
        "variant", observed=True)[metric] for v in t_interval(losses))]
    finite = [v for v in values if np.isfinite(v)]
    return _widen(min(finite), max(finite), REFERENCE_WINDOW)


def plot_forest(comparisons: pd.DataFrame, dataset: str, path: Path,
                metric: str = "test_loss") -> Path | None:
    """Forest plot of ``variant - baseline`` in ``metric`` (its unit), paired by seed: the mean
    a diamond coloured by verdict, the raw 95% t-interval a line with caps, the Holm interval
    a bar, widened by ``tuning_uncertainty`` a dotted box; the Holm p-values in a column at the
    right. None without comparisons in ``metric``."""
    c = _forest_rows(comparisons, dataset, metric)
    if c.empty:
        return None
    label, _, higher = METRICS[metric]
    unit = plotting.metric_unit(metric)
    with plotting.figure(path, figsize=(8.0, 2.4 + 0.45 * len(c))) as (fig, axes):
        ax = axes[0, 0]
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
        for _, r in c.iterrows():  # a column right of the axes: no label hides a marker
            ax.annotate(_forest_note(r), xy=(1.02, r["y"]), xycoords=("axes fraction", "data"),
                        va="center", ha="left", fontsize=8, annotation_clip=False)
        ax.set_yticks(c["y"], c["variant"])
        ax.set_ylim(len(c) - 0.5, -0.5)  # first variant on top, as in the tables
        ax.set_xlim(*forest_limits(c))
        ax.set_xlabel(f"Δ {label} (variant − baseline){', ' + unit if unit else ''}; "
                      f"{'> 0' if higher else '< 0'} = better")
        ax.set_ylabel("variant")
        tuned = bool(np.isfinite(c["tuned_low"]).any())
        ax.set_title(f"{dataset}: difference to baseline in {label}, paired by seed\n"
                     "thin line with caps: 95% t-interval; thick bar: Holm-adjusted interval"
                     + ("; dotted: ± tuning uncertainty" if tuned else "") + "\n"
                     f"p_Holm: Holm-corrected p-value, * = significant (α={ALPHA})")
        _forest_legend(fig, verdicts, tuned)
    return Path(path)


def _forest_rows(comparisons: pd.DataFrame, dataset: str, metric: str) -> pd.DataFrame:
    """The rows in variant order, ``y`` = 0, 1, ..., with the Holm interval ± tuning
    uncertainty (``tuned_low``, ``tuned_high``)."""
    c = comparisons[(comparisons["dataset"] == dataset) & (comparisons["metric"] == metric)]
    c = c.dropna(subset=["mean_diff"])
    c = c[c["variant"] != BASELINE].reset_index(drop=True)
    for col in ("ci95_low", "ci95_high", "ci_holm_low", "ci_holm_high", "p_holm",
                "tuning_uncertainty"):
        c[col] = c[col].astype(float) if col in c else np.nan
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


def forest_limits(c: pd.DataFrame, margin: float = 0.06) -> tuple[float, float]:
    """The x range of a forest plot of rows ``c``: every mean, interval end and 0, widened by
    ``margin`` of the span a side."""
    cols = [x for x in ("mean_diff", "ci95_low", "ci95_high", "ci_holm_low", "ci_holm_high",
                        "tuned_low", "tuned_high") if x in c]
    values = np.concatenate([c[cols].to_numpy(float).ravel(), [0.0]])
    values = values[np.isfinite(values)]
    low, high = float(values.min()), float(values.max())
    span = high - low if high > low else max(abs(high), 1e-3)
    return low - margin * span, high + margin * span


def _forest_legend(fig: Figure, verdicts: Sequence[str], tuned: bool) -> None:
    raw = Line2D([], [], color="0.3", linewidth=1.3, marker="|", markersize=9,
                 markeredgewidth=1.3)
    handles = [Line2D([], [], color=VERDICT_COLORS[v], marker="D", markeredgecolor="white",
                      markersize=8, linestyle="none") for v in verdicts]
    handles += [raw, Patch(facecolor="0.3", alpha=0.3, linewidth=0)]
    labels = [*verdicts, "95% t-interval (raw)", "Holm-adjusted interval"]
    if tuned:
        handles.append(Patch(fill=False, edgecolor="0.3", linestyle=":", linewidth=1.1))
        labels.append("Holm interval ± tuning uncertainty")
    fig.legend(handles, labels, loc="outside lower center", ncol=3, fontsize=8,
               title="verdict (colour) and intervals", title_fontsize=8,
               handler_map={raw: HandlerLine2D(numpoints=2)})  # 2 markers: the caps


def _with_params(ablation: pd.DataFrame, dataset: str) -> pd.DataFrame:
    return ablation[ablation["dataset"] == dataset].dropna(
        subset=["test_loss", "n_params_non_embedding"])


def params_too_narrow(ablation: pd.DataFrame, dataset: str) -> str | None:
    """Why :func:`plot_params_vs_loss` draws nothing although there are parameter counts (they
    differ by less than :data:`MIN_PARAMS_RATIO`), as a sentence; else None."""
    n = _with_params(ablation, dataset)["n_params_non_embedding"].astype(float)
    if n.empty or n.max() >= MIN_PARAMS_RATIO * n.min():
        return None
    low, high = float(n.min()), float(n.max())
    return (f"{dataset}: non-embedding parameters vs test loss not drawn: the parameter counts "
            f"span {low:,.0f} to {high:,.0f} ({high / low - 1:.1%} apart), too narrow a range "
            "to show a trend in size (the figure needs the largest at least "
            f"{MIN_PARAMS_RATIO:g} times the smallest).")


def plot_params_vs_loss(ablation: pd.DataFrame, dataset: str, path: Path, *,
                        palette: Mapping[str, Any]) -> Path | None:
    """Non-embedding parameters (count) against test loss (nats/char), a point per seed: is a
    gain just capacity? None without counts or when :func:`params_too_narrow`.
    Raises ValueError if ``palette`` has no colour for a variant."""
    d = _with_params(ablation, dataset).copy()
    if d.empty or params_too_narrow(ablation, dataset):
        return None
    d["n_params_non_embedding"] = d["n_params_non_embedding"].astype(float)
    order = present(d["variant"])
    with plotting.figure(path, figsize=(7.5, 4.5)) as (fig, axes):
        ax = axes[0, 0]
        sns.scatterplot(data=d, x="n_params_non_embedding", y="test_loss", hue="variant",
                        hue_order=order, palette=plotting.variant_palette(order, palette),
                        style="variant", style_order=order, s=70, alpha=0.85, ax=ax)
        ax.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))  # exact counts
        ax.margins(x=0.1)
        ax.set(title=f"{dataset}: size vs test loss (one point per seed)",
               xlabel="non-embedding parameters (count)", ylabel=f"test loss ({LOSS_UNIT})")
        ax.legend(title="variant", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return Path(path)


def plot_position_loss(curves: pd.DataFrame, dataset: str, context_length: int, path: Path, *,
                       palette: Mapping[str, Any],
                       positions: Mapping[str, str] | None = None) -> Path | None:
    """Test loss (nats/char) against token position as in Press et al. 2022, fig. 1: a line
    per variant of ``curves`` (:func:`lmablate.report.stats.extrapolation.position_curves`), a
    line at ``context_length``; ``positions``: variant -> scheme. None if ``curves`` is empty."""
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
        ax.set(title=f"{dataset}: test loss by token position, up to "
               f"{int(curves['factor'].max())}x the training context\n"
               f"(mean over {int(curves['seeds'].max())} seed(s); a point is a bucket of "
               "positions, drawn at its first)",
               xlabel="token position in the window (1-based)", ylabel=f"test loss ({LOSS_UNIT})")
        ax.legend(title="variant (positions)", loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  fontsize=8)
    return Path(path)
