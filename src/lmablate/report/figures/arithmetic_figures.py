"""The arithmetic figures: results per operation and per operand length, beside the floors.

:func:`plot_by_op` and :func:`plot_length_generalisation` draw the tables of
:mod:`lmablate.report.stats.arithmetic_tables` (the floors of
:data:`~lmablate.report.stats.arithmetic_tables.FLOORS`, the lengths of
:func:`~lmablate.report.stats.arithmetic_tables.length_table`) with
:func:`lmablate.report.figures.plotting.figure`; variants take their colours from ``palette``
(:func:`lmablate.report.families.family_palette`).

Units: accuracies as fractions in [0, 1], lengths in digits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

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

def plot_length_generalisation(by_digits: pd.DataFrame, dataset: str, digits: int | None,
                               path: Path, *, palette: Mapping[str, Any]
                               ) -> Path | None:
    """Exact match (fraction, y in [0, 1]) against operand length in digits (x), one line per
    variant (``palette``: variant -> colour): the mean over
    seeds with its 95% Student-t interval clipped to [0, 1] as error bars
    (:func:`~lmablate.report.stats.statistics.fraction_interval`, as summary.csv). A dashed line
    marks the longest training length ``digits`` and the lengths past it (the length split) are
    shaded; a variant's points are dodged sideways by a few hundredths of a digit; each length's
    tick gives its problems per seed, marked † below
    :data:`~lmablate.report.stats.arithmetic_tables.MIN_BUCKET_PROBLEMS`. Lengths a variant cannot
    run (a string in metrics.json) are left out of its line.

    Args:
        by_digits: :attr:`~lmablate.report.collect.RunOutputs.by_operand_digits`.

    Returns ``path``, or None without exact-match values for ``dataset``."""
    d = by_digits[by_digits["dataset"] == dataset] if len(by_digits) else by_digits
    lengths = sorted(int(x) for x in d["digits"].dropna().unique()) if len(d) else []
    d = d.dropna(subset=["exact_match"])
    if d.empty:
        return None
    order = present(d["variant"])
    # each variant's points moved sideways a little, so that equal means do not hide each other
    dodge = {v: 0.06 * (i - (len(order) - 1) / 2) for i, v in enumerate(order)}
    d = d.assign(x=d["digits"].astype(int) + d["variant"].astype(str).map(dodge),
                 exact_match=d["exact_match"].astype(float))
    n_seeds = int(d.groupby(["variant", "digits"], observed=True)["seed"].nunique().max())
    with plots.figure(path, figsize=(8.5, 4.6)) as (fig, axes):
        ax = axes[0, 0]
        extra = _mark_training_length(ax, digits, lengths)
        sns.lineplot(data=d, x="x", y="exact_match", hue="variant", hue_order=order,
                     palette=plots.variant_palette(order, palette), errorbar=fraction_interval,
                     err_style="bars", err_kws={"capsize": 4}, marker="o", markersize=6,
                     ax=ax)
        handles, labels = ax.get_legend_handles_labels()
        rough = _length_ticks(ax, d, lengths)
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(f"{dataset}: exact match by operand length\n(mean over {n_seeds} "
                     "seed(s); bars: 95% t-interval within [0, 1];\npoints of a length "
                     "dodged by variant)")
        ax.set_xlabel("operand digits (the longer operand); under each: problems per seed"
                      + (f"\n(†: fewer than {MIN_BUCKET_PROBLEMS}, a rough indication)"
                         if rough else ""))
        ax.set_ylabel("exact match (fraction)")
        ax.legend(handles + extra, labels + [h.get_label() for h in extra],
                  title="variant", loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    return Path(path)


def _mark_training_length(ax: Any, digits: int | None, lengths: Sequence[int]) -> list:
    """A dashed line on ``ax`` at the longest training length ``digits``, the lengths past it
    shaded; returns their legend handles (none where ``digits`` is unknown)."""
    extra = []
    if digits is not None:
        if lengths[-1] > digits:
            ax.axvspan(digits + 0.5, lengths[-1] + 0.5, color="0.92", zorder=0)
            extra.append(Patch(facecolor="0.92", label="longer than any training problem"))
        ax.axvline(digits, color="0.4", linestyle="--", linewidth=1.2, zorder=1)
        extra.append(Line2D([], [], color="0.4", linestyle="--",
                            label=f"longest training length ({digits} digits)"))
    return extra


def _length_ticks(ax: Any, d: pd.DataFrame, lengths: Sequence[int]) -> bool:
    """A tick of ``ax`` at each of ``lengths``, with its problems per seed under it, and the x
    limits around them. Returns whether a length has fewer than
    :data:`~lmablate.report.stats.arithmetic_tables.MIN_BUCKET_PROBLEMS` (marked †)."""
    # a bucket of a few problems reads 0 or 1 by chance
    counts = (pd.to_numeric(d["n"], errors="coerce").groupby(d["digits"].astype(int)).min()
              if "n" in d else pd.Series(dtype=float))
    ax.set_xticks(lengths, [f"{n}" + ("" if pd.isna(counts.get(n)) else
                                      f"\n{int(counts[n])} problems"
                                      + (" †" if counts[n] < MIN_BUCKET_PROBLEMS else ""))
                            for n in lengths])
    ax.set_xlim(lengths[0] - 0.5, lengths[-1] + 0.5)
    return bool((counts < MIN_BUCKET_PROBLEMS).any())


def nothing_solved(per_op: pd.DataFrame, dataset: str, metric: str = "exact_match") -> str | None:
    """Why :func:`plot_by_op` draws no figure of ``dataset`` in ``metric`` although it has
    per-operation results: a sentence when every value (each operation, variant and seed) is
    0; None otherwise."""
    p = per_op[per_op["dataset"] == dataset].dropna(subset=[metric]) if len(per_op) else per_op
    if p.empty or (p[metric].astype(float) != 0).any():
        return None
    what = "solved any problem" if metric == "exact_match" else "got an answer character right"
    return (f"{dataset}: {METRICS[metric][0]} by operation not drawn: no variant {what} "
            f"({METRICS[metric][0]} 0 on every operation, variant and seed).")


def plot_by_op(per_op: pd.DataFrame, dataset: str, path: Path, metric: str = "exact_match", *,
               palette: Mapping[str, Any], references: pd.DataFrame | None = None) -> Path | None:
    """``metric`` (fraction, y in [0, 1]) per arithmetic operation (x) and variant (colour,
    ``palette``: variant -> colour; dodged sideways): the mean over seeds with its 95% Student-t
    interval clipped to [0, 1] (:func:`~lmablate.report.stats.statistics.fraction_interval`, as
    summary.csv), and the
    floor of :data:`FLOORS` from ``references`` (the report's references.csv rows: the best
    answer that ignores the question, scored on all the test problems, not per operation) as a
    grey dashed line.

    Returns ``path``, or None when ``dataset`` has no per-op ``metric``, or when every value
    is 0 (no variant solved any problem: an all-zero figure says nothing a sentence does not,
    :func:`nothing_solved`).

    Raises:
        ValueError: ``palette`` has no colour for a variant.
    """
    p = per_op[per_op["dataset"] == dataset].dropna(subset=[metric]) if len(per_op) else per_op
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
    with plots.figure(path, figsize=(0.5 * len(ops) * len(order) + 5.5, 4.4)) as (fig, axes):
        ax = axes[0, 0]
        sns.pointplot(data=p, x="op", y=metric, hue="variant", order=ops, hue_order=order,
                      palette=plots.variant_palette(order, palette), errorbar=fraction_interval,
                      # seaborn divides the dodge by (hue levels - 1): one variant is not dodged
                      dodge=BY_OP_DODGE if len(order) > 1 else False, linestyle="none",
                      markers="o", capsize=0.08, ax=ax)
        handles, labels = ax.get_legend_handles_labels()
        # each seed a faint dot beside its mean: seeds that learnt and seeds that did not
        # make a wide interval, and the dots show which
        colours = plots.variant_palette(order, palette)
        # pointplot dodges its hue levels evenly over BY_OP_DODGE: the seeds at the same places
        shift = dict(zip(order, np.linspace(-BY_OP_DODGE / 2, BY_OP_DODGE / 2, len(order))
                         if len(order) > 1 else [0.0]))
        for v in order:
            q = p[p["variant"] == v]
            # just right of the interval's bar, which would hide them
            ax.scatter(q["op"].map(ops.index) + shift[v] + SEED_OFFSET, q[metric],
                       color=colours[v], s=14, alpha=0.6, linewidths=0, zorder=1)
        refs_drawn = plots.draw_references(ax, floor)
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(f"{dataset}: {label} by operation\n(mean over {n_seeds} seed(s), bars = "
                     "95% t-interval within [0, 1]; faint dots: seeds)")
        ax.set_xlabel("operation")
        ax.set_ylabel(f"{label} (fraction)")
        ax.legend(handles + refs_drawn, labels + [h.get_label() for h in refs_drawn],
                  title="variant / floor", loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    return Path(path)


def plot_learning_speed(speed: pd.DataFrame, dataset: str, path: Path, *,
                        palette: Mapping[str, Any]) -> Path | None:
    """The share of seeds that have learned (Kaplan-Meier, y, fraction) against training
    tokens (x, millions), one panel per threshold of
    :data:`~lmablate.report.stats.learning_speed.THRESHOLDS`, one step line per variant in its
    ``palette`` colour with its pointwise 95% band
    (:func:`~lmablate.report.stats.learning_speed.share_learned_curves`) up to the tokens its runs
    trained (a wider variant trains fewer at equal FLOPs); a seed that never learned is
    censored there, marked ``|``. A threshold no seed reached gets no panel, unless none was
    reached at all (then the lowest alone). Returns ``path``, or None without tokens to learn
    for ``dataset`` (runs without the answer probe)."""
    from lmablate.report.stats.learning_speed import THRESHOLDS, share_learned_curves

    s = speed[speed["dataset"] == dataset] if len(speed) else speed
    if s.empty:
        return None
    order = present(s["variant"])
    colours = plots.variant_palette(order, palette)
    # a panel per threshold some seed reached: one where none did would be empty lines at 0
    # (the lowest threshold stays, so that a study where no seed learned still says so)
    present_ = [t for t in THRESHOLDS if (s["threshold"] == t).any()]
    thresholds = [t for t in present_
                  if s.loc[s["threshold"] == t, "learned"].astype(bool).any()] or present_[:1]
    budget = float(s["tokens"].max()) / 1e6
    with plots.figure(path, figsize=(4.6 * len(thresholds) + 1.6, 4.0),
                      ncols=len(thresholds)) as (fig, axes):
        for ax, threshold in zip(axes[0], thresholds):
            curves = share_learned_curves(s, dataset, threshold)
            for variant in order:
                c = curves.get(str(variant))
                if c is None:
                    continue
                mine = s[(s["variant"] == variant) & (s["threshold"] == threshold)]
                end = float(mine["tokens"].max()) / 1e6  # its own budget: widths differ
                x = np.append(c["tokens"].to_numpy() / 1e6, end)
                colour = colours[variant]
                n = int((s["variant"] == variant).sum() / len(thresholds))
                ax.step(x, np.append(c["share"], c["share"].iloc[-1]), where="post",
                        color=colour, linewidth=1.6, label=f"{variant} ({n} seeds)")
                ax.fill_between(x, np.append(c["low"], c["low"].iloc[-1]),
                                np.append(c["high"], c["high"].iloc[-1]), step="post",
                                color=colour, alpha=0.12, linewidth=0)
                censored = mine[~mine["learned"].astype(bool)]
                if len(censored):  # at the tokens where each was censored
                    ax.scatter(censored["tokens"] / 1e6, np.full(len(censored),
                                                                 c["share"].iloc[-1]),
                               marker="|", s=120, color=colour, zorder=3)
            ax.axvline(budget, color="0.4", linestyle="--", linewidth=1)
            ax.set_xlim(0, budget * 1.03)
            ax.set_ylim(-0.02, 1.02)
            ax.set_xlabel("training tokens (millions); dashed: the most any run trained")
            ax.set_ylabel("share of seeds learned (Kaplan-Meier)")
            ax.set_title(f"exact match ≥ {threshold:g} on the probe problems")
        axes[0][-1].legend(title="variant", loc="upper left", bbox_to_anchor=(1.02, 1.0),
                           fontsize=9)
        fig.suptitle(f"{dataset}: how fast each variant learns (bands: pointwise 95% "
                     "intervals; |: seeds not learned by the budget)", fontsize=10)
    return Path(path)
