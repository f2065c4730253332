"""The replication forest plot: per variant, each replicate's Δ to the baseline and the
replicates combined (:func:`lmablate.report.stats.replication.combine_replicates`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from lmablate.report.figures import plotting
from lmablate.report.figures.losses import VERDICT_COLORS
from lmablate.report.stats.statistics import METRICS

COMBINED_LABEL = "combined"  # the y label of a variant's combined row
FEW_COLOUR = "#b0b0b0"  # a combined row without a verdict (one replicate)
_COLUMNS = ["variant", "label", "mean_diff", "low", "high", "verdict", "combined"]


def replication_rows(replicates: pd.DataFrame, combined: pd.DataFrame,
                     dataset: str) -> pd.DataFrame:
    """The plot's rows of ``dataset``, top to bottom: each variant's replicates in order, then
    its combined row. Columns ``variant, label, mean_diff, low, high, verdict, combined, y``
    (``low``/``high``: the Holm-adjusted interval)."""
    rows = []
    for variant in dict.fromkeys(replicates.loc[replicates["dataset"] == dataset, "variant"]):
        rep = replicates[(replicates["dataset"] == dataset) & (replicates["variant"] == variant)]
        c = combined[(combined["dataset"] == dataset) & (combined["variant"] == variant)]
        for is_combined, frame in ((False, rep.sort_values("replicate")), (True, c)):
            rows += [[variant, f"{variant}, " + (COMBINED_LABEL if is_combined else
                                                 f"replicate {r['replicate']}"),
                      r["mean_diff"], r["ci_holm_low"], r["ci_holm_high"], r["verdict"],
                      is_combined] for _, r in frame.iterrows()]
    out = pd.DataFrame(rows, columns=_COLUMNS)
    out["y"] = np.arange(len(out), dtype=float)
    return out


def plot_replication(replicates: pd.DataFrame, combined: pd.DataFrame, dataset: str,
                     path: Path) -> Path | None:
    """Draw :func:`replication_rows` to ``path`` (PNG): a diamond at each Δ, its interval a
    line with caps, coloured by verdict; combined rows bold on a grey band; a dashed line at 0.
    None without replicates of ``dataset``."""
    rows = replication_rows(replicates, combined, dataset)
    if rows.empty:
        return None
    metric = str(replicates.loc[replicates["dataset"] == dataset, "metric"].iloc[0])
    unit = plotting.metric_unit(metric)
    with plotting.figure(path, figsize=(8.0, 1.6 + 0.32 * len(rows))) as (fig, axes):
        ax = axes[0, 0]
        ax.axvline(0, color="black", linewidth=1, linestyle="--")
        for _, r in rows.iterrows():
            colour = VERDICT_COLORS.get(r["verdict"], FEW_COLOUR)
            if r["combined"]:
                ax.axhspan(r["y"] - 0.45, r["y"] + 0.45, color="0.92", zorder=0, linewidth=0)
            if np.isfinite(r["low"]) and np.isfinite(r["high"]):
                ax.errorbar(r["mean_diff"], r["y"], fmt="none", ecolor=colour,
                            elinewidth=2.4 if r["combined"] else 1.3, capsize=4, zorder=2,
                            xerr=[[r["mean_diff"] - r["low"]], [r["high"] - r["mean_diff"]]])
            if np.isfinite(r["mean_diff"]):
                ax.plot(r["mean_diff"], r["y"], marker="D", color=colour, markersize=8 if
                        r["combined"] else 6, markeredgecolor="white", zorder=3)
        ax.set_yticks(rows["y"], rows["label"])
        for tick, combined_row in zip(ax.get_yticklabels(), rows["combined"]):
            tick.set_fontweight("bold" if combined_row else "normal")
        ax.set_ylim(len(rows) - 0.5, -0.5)
        ax.set_xlabel(f"Δ {METRICS[metric][0]} (variant − baseline)"
                      f"{', ' + unit if unit else ''}; < 0 = better")
        ax.set_title(f"{dataset}: Δ per replicate (Holm-adjusted interval)\nand combined "
                     "(bold, shaded: its interval counts the tuning draw)", fontsize=10)
        verdicts = list(dict.fromkeys(rows["verdict"]))
        fig.legend([Line2D([], [], color=VERDICT_COLORS.get(v, FEW_COLOUR), marker="D",
                           markeredgecolor="white", linestyle="none") for v in verdicts],
                   verdicts, loc="outside lower center", ncol=min(4, len(verdicts)),
                   fontsize=8, title="verdict", title_fontsize=8)
    return Path(path)
