"""The replication forest plot: per variant of a dataset, one row per replicate of the study
(its Δ against the baseline with its Holm-adjusted interval, coloured by that replicate's
verdict) and one row for the replicates combined (the interval that counts the tuning draw,
:func:`lmablate.report.stats.replication.combine_replicates`). Δ in the headline loss's unit.
"""

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


def replication_rows(replicates: pd.DataFrame, combined: pd.DataFrame,
                     dataset: str) -> pd.DataFrame:
    """The forest plot's rows of ``dataset``, top to bottom: each variant's replicates in order,
    then its combined row. Columns ``variant, label, mean_diff, low, high, verdict, combined,
    y``; ``low``/``high`` the Holm-adjusted interval."""
    rows = []
    for variant in dict.fromkeys(replicates.loc[replicates["dataset"] == dataset, "variant"]):
        rep = replicates[(replicates["dataset"] == dataset) & (replicates["variant"] == variant)]
        for _, r in rep.sort_values("replicate").iterrows():
            rows.append({"variant": variant, "label": f"{variant}, replicate {r['replicate']}",
                         "mean_diff": r["mean_diff"], "low": r["ci_holm_low"],
                         "high": r["ci_holm_high"], "verdict": r["verdict"],
                         "combined": False})
        c = combined[(combined["dataset"] == dataset) & (combined["variant"] == variant)]
        for _, r in c.iterrows():
            rows.append({"variant": variant, "label": f"{variant}, {COMBINED_LABEL}",
                         "mean_diff": r["mean_diff"], "low": r["ci_holm_low"],
                         "high": r["ci_holm_high"], "verdict": r["verdict"], "combined": True})
    out = pd.DataFrame(rows, columns=["variant", "label", "mean_diff", "low", "high", "verdict",
                                      "combined"])
    out["y"] = np.arange(len(out), dtype=float)
    return out


def plot_replication(replicates: pd.DataFrame, combined: pd.DataFrame, dataset: str,
                     path: Path) -> Path | None:
    """Draw :func:`replication_rows` of ``dataset`` to ``path`` (PNG): a diamond at each Δ
    and its Holm-adjusted interval as a line with caps, coloured by the verdict; the combined
    rows bold and on a grey band; a dashed line at 0. Returns ``path``, or None without
    replicates of ``dataset``."""
    rows = replication_rows(replicates, combined, dataset)
    if rows.empty:
        return None
    metric = str(replicates.loc[replicates["dataset"] == dataset, "metric"].iloc[0])
    label, _, _ = METRICS[metric]
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
        ax.set_xlabel(f"Δ {label} (variant − baseline){', ' + unit if unit else ''}; "
                      "< 0 = better")
        ax.set_title(f"{dataset}: Δ per replicate (Holm-adjusted interval)\nand combined "
                     "(bold, shaded: its interval counts the tuning draw)", fontsize=10)
        verdicts = list(dict.fromkeys(rows["verdict"]))
        handles = [Line2D([], [], color=VERDICT_COLORS.get(v, FEW_COLOUR), marker="D",
                          markeredgecolor="white", linestyle="none") for v in verdicts]
        fig.legend(handles, verdicts,
                   loc="outside lower center", ncol=min(4, len(verdicts)), fontsize=8,
                   title="verdict", title_fontsize=8)
    return Path(path)
