"""The tuning figure: how each variant responds to the learning rate and to the width, from the
trials (:mod:`lmablate.report.stats.sensitivity`); losses in the objective's unit."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
from matplotlib.transforms import ScaledTranslation

from lmablate.report.collect import present
from lmablate.report.figures import plotting
from lmablate.report.figures.plotting import objective_label
from lmablate.report.stats import sensitivity as sens

STAR_SIZE = 260  # points^2: the tuned configurations' stars
# stars closer than these (fractions of the panel's log-lr and loss ranges) would cover each
# other: they are fanned out sideways by STAR_SPREAD points each (a little over a star's width)
STAR_NEAR = (0.035, 0.04)
STAR_SPREAD = 17.0
OUTSIDE = "0.9"  # the shade of what lies outside the searched ranges


def _tuned_rows(tuned: pd.DataFrame | None, dataset: str) -> dict[str, pd.Series]:
    if tuned is None or tuned.empty or not {"lr", "d_model", "variant"} <= set(tuned):
        return {}
    rows = tuned[tuned["dataset"] == dataset].dropna(subset=["lr", "d_model"])
    return {str(r["variant"]): r for _, r in rows.iterrows()}


def _same_config(t: pd.DataFrame, r: pd.Series) -> np.ndarray:
    """Rows of ``t`` trained at ``r``'s lr (to 1e-9 relative) and d_model."""
    return (np.isclose(t["params_lr"].to_numpy(float), float(r["lr"]), rtol=1e-9, atol=0)
            & (t["params_d_model"].to_numpy(float) == float(r["d_model"])))


def search_bounds(tuned: pd.DataFrame | None, dataset: str
                  ) -> tuple[float | None, float | None, list[int]]:
    """``(lowest lr, highest lr, widths)`` searched on ``dataset`` by any variant, from
    ``tuned``'s ``lr_low``, ``lr_high``, ``d_model_choices`` (space-separated); None/[] unknown."""
    if tuned is None or tuned.empty or "dataset" not in tuned:
        return None, None, []
    rows = tuned[tuned["dataset"] == dataset]

    def bound(col: str, how: str) -> float | None:
        v = pd.to_numeric(rows[col], errors="coerce") if col in rows else pd.Series(dtype=float)
        return float(getattr(v, how)()) if v.notna().any() else None

    widths = sorted({int(w) for text in rows.get("d_model_choices", pd.Series(dtype=str))
                     .dropna().astype(str) for w in text.split()})
    return bound("lr_low", "min"), bound("lr_high", "max"), widths


def star_offsets(lr: Sequence[float], loss: Sequence[float], lr_span: float,
                 loss_span: float) -> np.ndarray:
    """Sideways offsets (points) of stars at ``(lr, loss)``: a group within :data:`STAR_NEAR`
    of each other (fractions of ``lr_span`` decades and of ``loss_span``) fanned out by
    :data:`STAR_SPREAD` in lr order (equal ones in the given order); 0 for a star alone."""
    x = np.log10(np.asarray(lr, dtype=float))
    y = np.asarray(loss, dtype=float)
    offsets = np.zeros(len(x))
    group_of = np.arange(len(x))
    for i in range(len(x)):  # a star joins the first earlier group it lies near
        near = [j for j in range(i) if abs(x[i] - x[j]) <= STAR_NEAR[0] * max(lr_span, 1e-12)
                and abs(y[i] - y[j]) <= STAR_NEAR[1] * max(loss_span, 1e-12)]
        group_of[i] = group_of[near[0]] if near else i
    for g in np.unique(group_of):
        members = sorted(np.flatnonzero(group_of == g), key=lambda i: (x[i], i))
        offsets[members] = (np.arange(len(members)) - (len(members) - 1) / 2) * STAR_SPREAD
    return offsets


def _shade_outside(ax: Any, low: float | None, high: float | None, pad: float = 0.0) -> bool:
    """Dashed lines at ``low`` and ``high``, shaded beyond them from ``pad`` (room for dodged
    markers) on; whether both are known (and drawn)."""
    if low is None or high is None:
        return False
    left, right = ax.get_xlim()
    ax.axvspan(left, low - pad, color=OUTSIDE, zorder=0, linewidth=0)
    ax.axvspan(high + pad, right, color=OUTSIDE, zorder=0, linewidth=0)
    for x in (low, high):
        ax.axvline(x, color="0.55", linestyle="--", linewidth=1.0, zorder=0.5)
    ax.set_xlim(left, right)
    return True


def plot_lr_response(trials: pd.DataFrame, tuned: pd.DataFrame | None, dataset: str,
                     path: Path, *, palette: Mapping[str, Any]) -> Path | None:
    """How each variant responds to the learning rate, one seed a point: left, the first-rung
    trials' loss against the lr (log axis; a line through the shared design points, a star at
    the configuration ``tuned`` chose, an ``x`` at the top if diverged); middle (isoFLOP), the
    best first-rung loss per width (:func:`~lmablate.report.stats.sensitivity.width_summary`);
    right, the last rung's trials per width, filled if chosen. Shaded: outside the ranges
    searched (:func:`search_bounds`). None without first-rung trials for ``dataset``.
    Raises ValueError if ``palette`` has no colour for a variant."""
    t = sens.first_rung(trials)
    t = t[t["dataset"] == dataset]
    if t.empty:
        return None
    order = present(t["variant"])
    colours = plotting.variant_palette(order, palette)
    chosen = _tuned_rows(tuned, dataset)
    lr_low, lr_high, choices = search_bounds(tuned, dataset)
    last = sens.last_rung(trials)
    last = last[(last["dataset"] == dataset) & ~last["diverged"]]
    fraction = t["budget_fraction"].dropna().unique() if "budget_fraction" in t else []
    share = f"{fraction[0]:g} of the budget" if len(fraction) == 1 else "the first rung"
    # the variants' points at one width: 0.3 of the smallest gap between widths, shared
    widths = np.unique(np.concatenate([t["params_d_model"].dropna().to_numpy(float),
                                       last["params_d_model"].to_numpy(float),
                                       np.asarray(choices, dtype=float)]))
    gaps = np.diff(widths)
    dodge = 0.3 * (gaps.min() if len(gaps) else 8.0) / max(1, len(order))
    with plotting.figure(path, figsize=(15.0, 4.8), ncols=3) as (fig, axes):
        searched_lr, marks = _lr_panel(fig, axes[0, 0], t, order, colours, chosen,
                                       (lr_low, lr_high), share)
        tick_at, searched_d = _width_panel(axes[0, 1], t, order, colours, choices, share, dodge)
        _full_budget_panel(axes[0, 2], last, order, colours, chosen, tick_at, dodge)
        objective = (str(next(iter(chosen.values())).get("objective", "val_loss"))
                     if chosen else "val_loss")
        for ax, where in zip(axes[0], ("at the trial's end", "(best of a width)",
                                       "at the full budget")):
            ax.set_ylabel(objective_label(objective, where))
        axes[0, 0].legend(handles=_lr_markers(*marks, (lr_low, lr_high) if searched_lr else None,
                                              choices if searched_d else None),
                          loc="best", fontsize=8)
        fig.legend(handles=[Line2D([], [], color=c, marker="o", markersize=5, label=v)
                            for v, c in colours.items()],
                   title="variant", loc="outside right upper", fontsize=9)
    return Path(path)


def _lr_panel(fig: Any, ax: Any, t: pd.DataFrame, order: Sequence[str], colours: Mapping[str, Any],
              chosen: Mapping[str, pd.Series], searched: tuple[float | None, float | None],
              share: str) -> tuple[bool, tuple[bool, Sequence[float]]]:
    """The left panel: whether the lrs searched were shaded, and :func:`_lr_markers`' first
    two arguments."""
    lr_low, lr_high = searched
    lrs = pd.concat([t["params_lr"], pd.Series([float(r["lr"]) for r in chosen.values()]
                                               + [b for b in (lr_low, lr_high) if b],
                                               dtype=float)]).dropna()
    lr_lim = None
    if len(lrs):
        low, high = float(lrs.min()), float(lrs.max())
        pad = (high / low) ** 0.05 if high > low else 2.0
        lr_lim = (low / pad, high * pad)
    stars: list[tuple[str, float, float]] = []  # (variant, lr, loss) of each tuned trial
    unmatched = False
    for variant in order:
        colour = colours[variant]
        mine = t[t["variant"] == variant]
        done = mine[~mine["diverged"]]
        d = done[done["batch"] == sens.DESIGN_BATCH].sort_values("params_lr")
        o = done[done["batch"] != sens.DESIGN_BATCH]
        ax.plot(d["params_lr"], d["value"], color=colour, marker="o", markersize=5,
                linewidth=1.6, zorder=3)
        ax.scatter(o["params_lr"], o["value"], color=colour, s=14, alpha=0.35, linewidths=0,
                   zorder=2)
        bad = mine[mine["diverged"]]
        ax.scatter(bad["params_lr"], [0.97] * len(bad), color=colour, marker="x", s=40,
                   transform=ax.get_xaxis_transform(), zorder=3, clip_on=False)
        if variant not in chosen:
            continue
        hit = done[_same_config(done, chosen[variant])]
        if len(hit):
            stars.append((variant, float(hit["params_lr"].iloc[0]), float(hit["value"].iloc[0])))
        else:
            unmatched = True
            ax.scatter([float(chosen[variant]["lr"])], [0.03], color=colour, marker="^", s=60,
                       edgecolors="black", linewidths=0.6, zorder=4,
                       transform=ax.get_xaxis_transform(), clip_on=False)
    offsets = _draw_stars(fig, ax, stars, t, lr_lim, colours)
    if lr_lim:
        ax.set_xlim(*lr_lim)
    ax.set_xscale("log")
    # 1-2-5 labelled ticks: a range may span less than a decade once extended
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    searched_lr = _shade_outside(ax, lr_low, lr_high)
    design = t[t["batch"] == sens.DESIGN_BATCH]
    at = ", ".join(map(str, sorted(int(d) for d in design["params_d_model"].dropna().unique())))
    ax.set_title(f"{t['dataset'].iloc[0]}: loss vs learning rate at {share}\n"
                 f"(lines: the shared design at d_model {at or '–'}; one seed)")
    ax.set_xlabel("peak learning rate (log scale)")
    return searched_lr, (unmatched, offsets)


def _draw_stars(fig: Any, ax: Any, stars: Sequence[tuple[str, float, float]], t: pd.DataFrame,
                lr_lim: tuple[float, float] | None, colours: Mapping[str, Any]) -> list[float]:
    if not stars:
        return []
    losses = t.loc[~t["diverged"], "value"].astype(float)
    loss_span = float(losses.max() - losses.min()) if len(losses) else 1.0
    lr_span = np.log10(lr_lim[1] / lr_lim[0]) if lr_lim else 1.0
    offsets = star_offsets([s[1] for s in stars], [s[2] for s in stars], lr_span, loss_span)
    for (variant, lr, loss), dx in zip(stars, offsets):
        # an offset in points, not data: equal stars fan apart alike on any axis
        shifted = ax.transData + ScaledTranslation(dx / 72, 0, fig.dpi_scale_trans)
        ax.scatter([lr], [loss], color=colours[variant], marker="*", s=STAR_SIZE,
                   edgecolors="black", linewidths=0.8, zorder=4, transform=shifted)
    return list(offsets)


def _width_panel(ax: Any, t: pd.DataFrame, order: Sequence[str], colours: Mapping[str, Any],
                 choices: Sequence[int], share: str, dodge: float) -> tuple[list[int], bool]:
    """The middle panel (dot area: trials; one poor trial says little): returns the widths
    ticked and whether the widths searched were shaded."""
    widths = sens.width_summary(t)
    for variant in order:
        w = widths[widths["variant"] == variant].dropna(subset=["best_loss"])
        ax.plot(w["d_model"], w["best_loss"], color=colours[variant], linewidth=1.6, zorder=3)
        ax.scatter(w["d_model"], w["best_loss"], color=colours[variant],
                   s=12 + 10 * w["n_trials"].astype(float), zorder=3)
    tick_at = _width_ticks(ax, widths, "d_model", choices)
    searched = bool(choices) and _shade_outside(ax, min(choices), max(choices),
                                                pad=dodge * (len(order) + 1) / 2)
    ax.set_title(f"isoFLOP: best loss per width at {share}\n(dot area: trials)")
    ax.set_xlabel("d_model (below: training tokens per parameter)")
    return tick_at, searched


def _full_budget_panel(ax: Any, last: pd.DataFrame, order: Sequence[str],
                       colours: Mapping[str, Any], chosen: Mapping[str, pd.Series],
                       tick_at: Sequence[int], dodge: float) -> None:
    any_picked = False
    for variant in order:
        colour = colours[variant]
        full = last[last["variant"] == variant]
        picked = (_same_config(full, chosen[variant]) if variant in chosen
                  else np.zeros(len(full), dtype=bool))
        shift = (order.index(variant) - (len(order) - 1) / 2) * dodge
        any_picked = any_picked or bool(picked.any())
        for filled, part in ((True, full[picked]), (False, full[~picked])):
            ax.scatter(part["params_d_model"] + shift, part["value"], marker="D", s=45,
                       facecolors=colour if filled else "white", edgecolors=colour,
                       linewidths=1.4, zorder=4)
    top = (last["budget_fraction"].dropna().unique()
           if "budget_fraction" in last and len(last) else [])
    top_share = ("no completed trial past the first rung" if len(top) != 1 else
                 "the full budget" if top[0] == 1 else f"{top[0]:g} of the budget")
    _width_ticks(ax, last, "params_d_model", tick_at)
    ax.set_title(f"last rung: {top_share}\n(the learning rate's bracket)")
    ax.set_xlabel("d_model (below: training tokens per parameter)")
    # a fitted lr between the points is no trial: then no diamond is filled
    marks = ([("0.3", "chosen"), ("white", "not chosen")] if any_picked else
             [("white", "trained; the chosen lr lies\nbetween them (fitted minimum)")])
    ax.legend(handles=[Line2D([], [], color="0.3", marker="D", linestyle="none",
                              markerfacecolor=face, label=label) for face, label in marks],
              loc="best", fontsize=8)


def _width_ticks(ax: Any, frame: pd.DataFrame, col: str, extra: Sequence[int]) -> list[int]:
    """Ticks at the widths ``frame[col]`` and ``extra``, labelled with their tokens per
    parameter where known; returns them."""
    ticks = (frame.drop_duplicates(col).set_index(col)["tokens_per_parameter"]
             if "tokens_per_parameter" in frame else pd.Series(dtype=float))
    ticks.index = ticks.index.astype(int)
    at = sorted({*ticks.index, *extra})
    ax.set_xticks(list(at))
    ax.set_xticklabels([f"{w}\n{ticks[w]:.3g}" if w in ticks.index and pd.notna(ticks[w])
                        else f"{w}" for w in at])
    if len(at):
        span = (at[-1] - at[0]) or 16.0
        ax.set_xlim(at[0] - 0.1 * span, at[-1] + 0.1 * span)
    return at


def _lr_markers(unmatched: bool, offsets: Sequence[float],
                lr_range: tuple[float, float] | None, choices: Sequence[int] | None) -> list:
    fanned = any(o != 0 for o in offsets)
    grey = dict(color="0.3", marker="o")
    handles = [
        Line2D([], [], **grey, markersize=5, label="design point (paired lr sweep)"),
        Line2D([], [], **grey, markersize=4, alpha=0.35, linestyle="none",
               label="other first-rung trial"),
        Line2D([], [], color="0.3", marker="x", linestyle="none",
               label="diverged (at the top edge)"),
        Line2D([], [], color="0.5", marker="*", markersize=13, markeredgecolor="black",
               linestyle="none", label="tuned configuration" + (
                   "\n(overlapping ones fanned out\nsideways, in lr order)" if fanned else ""))]
    if unmatched:
        handles.append(Line2D([], [], color="0.5", marker="^", markeredgecolor="black",
                              linestyle="none", label="tuned lr (no first-rung trial)"))
    if lr_range or choices:
        searched = "; ".join(([f"lr {lr_range[0]:g} to {lr_range[1]:g}"] if lr_range else [])
                             + ([f"d_model {' '.join(map(str, choices))}"] if choices else []))
        handles.append(Patch(facecolor=OUTSIDE, edgecolor="0.55", linestyle="--",
                             label=f"outside the searched range\n({searched})"))
    return handles
