"""The arithmetic figures: results per operation and operand length
(:mod:`lmablate.report.stats.arithmetic_tables`), and the learning speed."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from lmablate.report.collect import present
from lmablate.report.figures import plotting as plots
from lmablate.report.stats.statistics import METRICS, fraction_interval
from lmablate.report.stats.arithmetic_tables import FLOORS, MIN_BUCKET_PROBLEMS

BY_OP_DODGE = 0.5  # plot_by_op: the variants of an operation spread over this much of x
SEED_OFFSET = 0.045  # plot_by_op: the seeds' dots, right of their variant's interval (x units)
_LEGEND = dict(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)


def _of(frame: pd.DataFrame, dataset: str) -> pd.DataFrame:
    return frame[frame["dataset"] == dataset] if len(frame) else frame


def plot_length_generalisation(by_digits: pd.DataFrame, dataset: str, digits: int | None,
                               path: Path, *, palette: Mapping[str, Any]) -> Path | None:
    """Exact match (fraction) against operand length (digits) of ``by_digits``
    (:attr:`~lmablate.report.collect.RunOutputs.by_operand_digits`), a line per variant: mean
    over seeds, 95% t-interval within [0, 1]; a line at the longest training length
    ``digits``; problems per seed under each tick. None without values."""
    d = _of(by_digits, dataset)
    lengths = sorted(int(x) for x in d["digits"].dropna().unique()) if len(d) else []
    d = d.dropna(subset=["exact_match"])
    if d.empty:
        return None
    order = present(d["variant"])
    dodge = {v: 0.06 * (i - (len(order) - 1) / 2) for i, v in enumerate(order)}
    d = d.assign(x=d["digits"].astype(int) + d["variant"].astype(str).map(dodge),
                 exact_match=d["exact_match"].astype(float))
    n_seeds = int(d.groupby(["variant", "digits"], observed=True)["seed"].nunique().max())
    # a bucket of a few problems reads 0 or 1 by chance
    counts = (pd.to_numeric(d["n"], errors="coerce").groupby(d["digits"].astype(int)).min()
              if "n" in d else pd.Series(dtype=float))
    rough = bool((counts < MIN_BUCKET_PROBLEMS).any())
    with plots.figure(path, figsize=(8.5, 4.6)) as (fig, axes):
        ax = axes[0, 0]
        extra = []
        if digits is not None:
            if lengths[-1] > digits:
                ax.axvspan(digits + 0.5, lengths[-1] + 0.5, color="0.92", zorder=0)
                extra.append(Patch(facecolor="0.92", label="longer than any training problem"))
            ax.axvline(digits, color="0.4", linestyle="--", linewidth=1.2, zorder=1)
            extra.append(Line2D([], [], color="0.4", linestyle="--",
                                label=f"longest training length ({digits} digits)"))
        sns.lineplot(data=d, x="x", y="exact_match", hue="variant", hue_order=order,
                     palette=plots.variant_palette(order, palette), errorbar=fraction_interval,
                     err_style="bars", err_kws={"capsize": 4}, marker="o", markersize=6,
                     ax=ax)
        handles, labels = ax.get_legend_handles_labels()
        ax.set_xticks(lengths, [f"{n}" + ("" if pd.isna(counts.get(n)) else
                                          f"\n{int(counts[n])} problems"
                                          + (" †" if counts[n] < MIN_BUCKET_PROBLEMS else ""))
                                for n in lengths])
        ax.set_xlim(lengths[0] - 0.5, lengths[-1] + 0.5)
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(f"{dataset}: exact match by operand length\n(mean over {n_seeds} "
                     "seed(s); bars: 95% t-interval within [0, 1];\npoints of a length "
                     "dodged by variant)")
        ax.set_xlabel("operand digits (the longer operand); under each: problems per seed"
                      + (f"\n(†: fewer than {MIN_BUCKET_PROBLEMS}, a rough indication)"
                         if rough else ""))
        ax.set_ylabel("exact match (fraction)")
        ax.legend(handles + extra, labels + [h.get_label() for h in extra], title="variant",
                  **_LEGEND)
    return Path(path)


def nothing_solved(per_op: pd.DataFrame, dataset: str, metric: str = "exact_match") -> str | None:
    """A sentence saying why :func:`plot_by_op` draws nothing although there are results in
    ``metric``: every value (operation, variant, seed) is 0; None otherwise."""
    p = _of(per_op, dataset).dropna(subset=[metric]) if len(per_op) else per_op
    if p.empty or (p[metric].astype(float) != 0).any():
        return None
    what = "solved any problem" if metric == "exact_match" else "got an answer character right"
    return (f"{dataset}: {METRICS[metric][0]} by operation not drawn: no variant {what} "
            f"({METRICS[metric][0]} 0 on every operation, variant and seed).")


def plot_by_op(per_op: pd.DataFrame, dataset: str, path: Path, metric: str = "exact_match", *,
               palette: Mapping[str, Any], references: pd.DataFrame | None = None) -> Path | None:
    """``metric`` (fraction) per operation and variant: mean over seeds, 95% t-interval within
    [0, 1], seeds as faint dots, the floor of :data:`FLOORS` from ``references``
    (references.csv) a dashed line. None without values, or all 0 (:func:`nothing_solved`).
    Raises ValueError if ``palette`` has no colour for a variant."""
    p = _of(per_op, dataset).dropna(subset=[metric]) if len(per_op) else per_op
    if p.empty or nothing_solved(p, dataset, metric):
        return None
    p = p.assign(**{metric: p[metric].astype(float), "op": p["op"].astype(str)})
    label = METRICS[metric][0]
    order = present(p["variant"])
    ops = list(pd.unique(p["op"]))
    n_seeds = int(p.groupby(["variant", "op"], observed=True)["seed"].nunique().max())
    r = references if references is not None else pd.DataFrame(columns=["dataset"])
    r = r[(r["dataset"] == dataset) & (r["metric"] == metric) & (r["reference"] == FLOORS[metric])]
    floor = {f"{x.reference} \"{str(x.detail).strip('`')}\" (all operations)": float(x.value)
             for x in r.itertuples()}
    colours = plots.variant_palette(order, palette)
    with plots.figure(path, figsize=(0.5 * len(ops) * len(order) + 5.5, 4.4)) as (fig, axes):
        ax = axes[0, 0]
        sns.pointplot(data=p, x="op", y=metric, hue="variant", order=ops, hue_order=order,
                      palette=colours, errorbar=fraction_interval,
                      # seaborn divides the dodge by (hue levels - 1): one variant is not dodged
                      dodge=BY_OP_DODGE if len(order) > 1 else False, linestyle="none",
                      markers="o", capsize=0.08, ax=ax)
        handles, labels = ax.get_legend_handles_labels()
        # the seeds beside their mean (pointplot spreads the variants evenly over BY_OP_DODGE),
        # just right of the interval's bar, which would hide them
        shift = dict(zip(order, np.linspace(-BY_OP_DODGE / 2, BY_OP_DODGE / 2, len(order))
                         if len(order) > 1 else [0.0]))
        for v in order:
            q = p[p["variant"] == v]
            ax.scatter(q["op"].map(ops.index) + shift[v] + SEED_OFFSET, q[metric],
                       color=colours[v], s=14, alpha=0.6, linewidths=0, zorder=1)
        refs = plots.draw_references(ax, floor)
        ax.set_ylim(-0.02, 1.02)
        ax.set(title=f"{dataset}: {label} by operation\n(mean over {n_seeds} seed(s), bars = "
               "95% t-interval within [0, 1]; faint dots: seeds)", xlabel="operation",
               ylabel=f"{label} (fraction)")
        ax.legend(handles + refs, labels + [h.get_label() for h in refs],
                  title="variant / floor", **_LEGEND)
    return Path(path)


def plot_learning_speed(speed: pd.DataFrame, dataset: str, path: Path, *,
                        palette: Mapping[str, Any]) -> Path | None:
    """The share of seeds learned (Kaplan-Meier, fraction) against training tokens (millions),
    a panel per threshold reached, a step line per variant with its pointwise 95% band
    (:func:`~lmablate.report.stats.learning_speed.share_learned_curves`); ``|``: censored.
    None without answer-probe runs."""
    from lmablate.report.stats.learning_speed import THRESHOLDS, share_learned_curves

    s = _of(speed, dataset)
    if s.empty:
        return None
    order = present(s["variant"])
    colours = plots.variant_palette(order, palette)
    present_ = [t for t in THRESHOLDS if (s["threshold"] == t).any()]
    thresholds = [t for t in present_
                  if s.loc[s["threshold"] == t, "learned"].astype(bool).any()] or present_[:1]
    budget = float(s["tokens"].max()) / 1e6
    with plots.figure(path, figsize=(4.6 * len(thresholds) + 1.6, 4.0),
                      ncols=len(thresholds)) as (fig, axes):
        for ax, threshold in zip(axes[0], thresholds):
            curves = share_learned_curves(s, dataset, threshold)
            for variant in order:
                if (c := curves.get(str(variant))) is None:
                    continue
                mine = s[(s["variant"] == variant) & (s["threshold"] == threshold)]
                end = float(mine["tokens"].max()) / 1e6  # its own budget: widths differ
                x = np.append(c["tokens"].to_numpy() / 1e6, end)
                step = {k: np.append(c[k], c[k].iloc[-1]) for k in ("share", "low", "high")}
                n = int((s["variant"] == variant).sum() / len(thresholds))
                ax.step(x, step["share"], where="post", color=colours[variant], linewidth=1.6,
                        label=f"{variant} ({n} seeds)")
                ax.fill_between(x, step["low"], step["high"], step="post",
                                color=colours[variant], alpha=0.12, linewidth=0)
                censored = mine[~mine["learned"].astype(bool)]
                if len(censored):
                    ax.scatter(censored["tokens"] / 1e6, np.full(len(censored),
                                                                 c["share"].iloc[-1]),
                               marker="|", s=120, color=colours[variant], zorder=3)
            ax.axvline(budget, color="0.4", linestyle="--", linewidth=1)
            ax.set_xlim(0, budget * 1.03)
            ax.set_ylim(-0.02, 1.02)
            ax.set(xlabel="training tokens (millions); dashed: the most any run trained",
                   ylabel="share of seeds learned (Kaplan-Meier)",
                   title=f"exact match ≥ {threshold:g} on the probe problems")
        axes[0][-1].legend(title="variant", loc="upper left", bbox_to_anchor=(1.02, 1.0),
                           fontsize=9)
        fig.suptitle(f"{dataset}: how fast each variant learns (bands: pointwise 95% "
                     "intervals; |: seeds not learned by the budget)", fontsize=10)
    return Path(path)
