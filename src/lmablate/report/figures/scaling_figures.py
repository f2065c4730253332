"""The figures of a scaling study: loss and effects against compute
(:mod:`lmablate.report.stats.scaling`), isoFLOP profiles (:mod:`lmablate.report.stats.isoflop`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.ticker import FuncFormatter

from lmablate.report.collect import BASELINE, present
from lmablate.report.figures.plotting import metric_unit, panels, variant_palette
from lmablate.report.stats.isoflop import PARABOLA
from lmablate.report.stats.scaling import LOG_LINEAR, predict
from lmablate.report.stats.statistics import METRICS

# plain numbers on a log axis (2.2, not 2.2 x 10^0), minor ticks too: a loss spans < a decade
_PLAIN = FuncFormatter(lambda y, _: f"{y:.3g}")


def _per_dataset(path: Path, frame: pd.DataFrame, palette: Mapping[str, Any], suptitle: str,
                 draw: Callable[..., None]) -> Path | None:
    """A panel per dataset of ``frame`` with two or more budgets (None without any), drawn by
    ``draw(ax, rows, order, colours)``; x: training FLOPs."""
    datasets = [d for d in present(frame["dataset"])
                if frame[frame["dataset"] == d]["budget_flops"].nunique() >= 2]
    if not datasets:
        return None
    with panels(path, len(datasets), 2, (6.0, 4.4), (1.6, 0.6)) as (fig, axes):
        for ax, ds in zip(axes.ravel(), datasets):
            rows = frame[frame["dataset"] == ds]
            order = present(rows["variant"])
            draw(ax, rows, order, variant_palette(order, palette))
            ax.set(title=ds, xlabel="training compute (FLOPs)")
        _legend(fig, axes, "variant", suptitle)
    return path


def plot_scaling_curves(path: Path, scaling: pd.DataFrame, fits: pd.DataFrame,
                        resamples: Mapping[tuple[str, str], np.ndarray],
                        metric_of: Mapping[str, str], palette: Mapping[str, Any]) -> Path | None:
    """A panel per dataset: each seed's headline loss (``metric_of[dataset]``; small dots) and
    the mean over seeds (large) at each budget against training FLOPs (log-log), each variant's
    fitted curve (``fits``, dashed where only a log-log line) with its bootstrap band
    (``resamples``). None without a dataset of two or more budgets."""
    def draw(ax: Any, frame: pd.DataFrame, order: list, colours: dict) -> None:
        ds = frame["dataset"].iloc[0]
        metric = metric_of[ds]
        grid = np.geomspace(frame["budget_flops"].min(), frame["budget_flops"].max(), 60)
        for variant in order:
            v = frame[frame["variant"] == variant]
            ax.scatter(v["budget_flops"], v[metric], s=8, alpha=0.35, color=colours[variant],
                       linewidths=0)
            means = v.groupby("budget_flops")[metric].mean()
            ax.scatter(means.index, means.to_numpy(), s=30, color=colours[variant],
                       label=variant, zorder=3)
            fit = fits[(fits["dataset"] == ds) & (fits["variant"] == variant)]
            if fit.empty or not fit.iloc[0]["form"] or not np.isfinite(fit.iloc[0]["E"]):
                continue
            mid, low, high = predict(fit.iloc[0], resamples.get((ds, variant)), grid)
            style = "--" if fit.iloc[0]["form"] == LOG_LINEAR else "-"
            ax.plot(grid, mid, style, color=colours[variant], linewidth=1.3)
            if np.isfinite(low).any():
                ax.fill_between(grid, low, high, color=colours[variant], alpha=0.12,
                                linewidth=0)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(_PLAIN)
        ax.yaxis.set_minor_formatter(_PLAIN)
        ax.set_ylabel(f"{METRICS[metric][0]} ({metric_unit(metric)})")
    return _per_dataset(path, scaling, palette, "Loss against compute, with fitted curves", draw)


def plot_effect_trends(path: Path, effects: pd.DataFrame, palette: Mapping[str, Any]
                       ) -> Path | None:
    """A panel per dataset: each variant's difference to the baseline at each budget (mean
    over seeds, Holm-adjusted interval of :func:`lmablate.report.stats.scaling.
    effects_by_budget`) against training FLOPs (log axis); below 0: better. None without a
    dataset of two or more budgets."""
    def draw(ax: Any, frame: pd.DataFrame, order: list, colours: dict) -> None:
        budgets = sorted(frame["budget_flops"].unique())
        # a small sideways offset per variant (log space): intervals do not hide each other
        offsets = np.linspace(-0.04, 0.04, len(order)) if len(order) > 1 else [0.0]
        for variant, off in zip(order, offsets):
            v = frame[frame["variant"] == variant].sort_values("budget_flops")
            y = v["mean_diff"].to_numpy(float)
            err = np.vstack([y - v["ci_holm_low"].to_numpy(float),
                             v["ci_holm_high"].to_numpy(float) - y])
            ax.errorbar(v["budget_flops"].to_numpy(float) * 10 ** off, y,
                        yerr=np.where(np.isfinite(err), err, 0), marker="o", markersize=4,
                        capsize=2, color=colours[variant], label=variant)
        ax.axhline(0, color="0.3", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_xticks(budgets, [f"{b:.2g}" for b in budgets])
        metric = str(frame["metric"].iloc[0])
        ax.set_ylabel(f"{METRICS[metric][0]} - {BASELINE} ({metric_unit(metric)})")
    return _per_dataset(path, effects, palette,
                        "Each effect against compute (below 0: better than the baseline)", draw)


def _legend(fig: Any, axes: Any, title: str, suptitle: str) -> None:
    """The first panel's legend right of the figure, and the figure's title."""
    handles, labels = axes.ravel()[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper", title=title)
    fig.suptitle(suptitle)


def plot_isoflop(path: Path, points: pd.DataFrame, optimal: pd.DataFrame,
                 order: Sequence[str]) -> Path | None:
    """A panel per dataset x variant: validation loss (nats/char) of each width's best
    lowest-rung trial against ``d_model`` (log), a line per budget (hollow: tried at one lr),
    ``optimal`` width marked (star: parabola vertex, ring: best measured). None without points."""
    if points.empty:
        return None
    keys = [(d, v) for d in present(points["dataset"]) for v in order
            if ((points["dataset"] == d) & (points["variant"] == v)).any()]
    with panels(path, len(keys), 3, (3.6, 3.0), (1.8, 0.7)) as (fig, axes):
        budgets = sorted(points["budget_flops"].unique())
        shades = dict(zip(budgets, sns.color_palette("crest", len(budgets))))
        for ax, (ds, variant) in zip(axes.ravel(), keys):
            frame = points[(points["dataset"] == ds) & (points["variant"] == variant)]
            for budget, group in frame.groupby("budget_flops", sort=True):
                group = group.sort_values("d_model")
                shade = shades[budget]
                ax.plot(group["d_model"], group["val_loss"], color=shade,
                        label=f"{budget:.2g} (trials {group['trial_flops'].iloc[0]:.2g})")
                once = group["n_trials"] < 2
                ax.scatter(group["d_model"][~once], group["val_loss"][~once], s=14,
                           color=shade, zorder=3)
                ax.scatter(group["d_model"][once], group["val_loss"][once], s=14,
                           facecolors="white", edgecolors=shade, zorder=3)
                best = optimal[(optimal["dataset"] == ds) & (optimal["variant"] == variant)
                               & np.isclose(optimal["budget_flops"].astype(float), budget)]
                if len(best) and np.isfinite(best.iloc[0]["optimal_d_model"]):
                    width = best.iloc[0]["optimal_d_model"]
                    loss = np.interp(np.log(width), np.log(group["d_model"].astype(float)),
                                     group["val_loss"].astype(float))
                    star = best.iloc[0]["method"] == PARABOLA
                    ax.scatter([width], [loss], marker="*" if star else "o", s=90 if star else 60,
                               facecolors=shade if star else "none", edgecolors=shade, zorder=3)
            ax.set_xscale("log")
            widths = sorted(frame["d_model"].unique())
            ax.set_xticks(widths, [str(int(w)) for w in widths])
            ax.minorticks_off()
            ax.set(title=f"{ds}: {variant}", xlabel="d_model",
                   ylabel="validation loss (nats/char)")
        _legend(fig, axes, "budget (FLOPs)", "IsoFLOP profiles of the tuning's lowest rung "
                "(star: parabola vertex; ring: best width measured)")
    return path
