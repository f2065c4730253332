"""Each variant's full-budget learning-rate bracket: its trials, the quadratic in ln lr fitted
(:mod:`lmablate.tune.lr_minimum`) and the chosen lr; losses in the tuning objective's unit."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from lmablate.report.figures import plotting
from lmablate.report.figures.plotting import objective_label
from lmablate.report.stats.pooled_uncertainty import full_budget_trials


def plot_bracket(trials: pd.DataFrame, tuned: pd.DataFrame, dataset: str, path: Path, *,
                 palette: Mapping[str, Any], order: Sequence[str]) -> Path | None:
    """A panel per variant (in ``order``): the loss of its full-budget trials against the lr
    (log; small dots: tuning seeds, large: their mean, ``x``: diverged), the quadratic of
    ``tuned``'s ``fit_a/b/c`` and the chosen lr. None when no variant has a bracket."""
    t = full_budget_trials(trials, dataset)
    tu = tuned[tuned["dataset"] == dataset] if len(tuned) else tuned
    variants = [v for v in order if (t["variant"] == v).any() and (
        tu["variant"] == v).any() and pd.notna(tu[tu["variant"] == v]["bracket_state"].iloc[0])]
    if not variants:
        return None
    finite = t[pd.to_numeric(t["value"], errors="coerce").notna()]
    means = finite.groupby(["variant", "params_lr"], observed=True)["value"].mean()
    top = float(means.max()) if len(means) else 1.0
    objective = str(tu["objective"].iloc[0]) if "objective" in tu else "val_loss"
    with plotting.figure(path, figsize=(3.3 * len(variants), 3.6), ncols=len(variants),
                         sharey=True) as (fig, axes):
        for ax, variant in zip(axes[0], variants):
            _draw_variant(ax, t, tu[tu["variant"] == variant].iloc[0], variant,
                          palette[variant], top)
        axes[0][0].set_ylabel(objective_label(objective, "at the full budget"))
        fig.suptitle(f"{dataset}: learning rate at the full budget (dots: tuning seeds; large: "
                     "their mean; line: fitted quadratic in ln lr; dashed: chosen lr)",
                     fontsize=9)
    return Path(path)


def _draw_variant(ax: Any, t: pd.DataFrame, r: pd.Series, variant: str, colour: Any,
                  top: float) -> None:
    """``variant``'s panel: its trials ``t``, and its fit and chosen lr (``r``, from best.json)."""
    other = t[(t["variant"] == variant) & (t["params_d_model"] != r["d_model"])]
    v = t[(t["variant"] == variant) & (t["params_d_model"] == r["d_model"])]
    for d, o in other.groupby("params_d_model"):  # the width the first batch set aside
        ax.scatter(o["params_lr"], pd.to_numeric(o["value"], errors="coerce"), s=30,
                   facecolors="none", edgecolors=colour, zorder=3,
                   label=f"d_model {int(d)} (not kept)")
        ax.legend(fontsize=8, loc="best")
    loss = pd.to_numeric(v["value"], errors="coerce")
    ax.scatter(v["params_lr"][loss.notna()], loss[loss.notna()], s=10, color=colour,
               alpha=0.5, linewidths=0)
    m = v.assign(value=loss).groupby("params_lr")["value"].agg(["mean", "count", "size"])
    ok = m["count"] == m["size"]
    ax.scatter(m.index[ok], m["mean"][ok], s=36, color=colour, zorder=3)
    for lr in m.index[~ok]:
        ax.scatter([lr], [top], marker="x", color=colour, zorder=3)
    if pd.notna(r.get("fit_a")) and len(m.index[ok]):
        grid = np.geomspace(m.index[ok].min(), m.index[ok].max(), 100)
        ax.plot(grid, np.polyval([r["fit_a"], r["fit_b"], r["fit_c"]], np.log(grid)),
                color=colour, linewidth=1.2)
    ax.axvline(float(r["lr"]), color="0.3", linestyle="--", linewidth=0.9)
    ax.set_xscale("log")
    # a tick at each lr trained: log axes' own labels collide over one octave
    ax.xaxis.set_major_locator(FixedLocator(sorted(set(v["params_lr"]))))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:.2g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.tick_params(axis="x", labelrotation=45, labelsize=9)
    u = r.get("tuning_uncertainty")
    ax.set_title(f"{variant}: lr {float(r['lr']):.3g}, d_model {int(r['d_model'])}\n"
                 + ("tuning uncertainty not measured" if pd.isna(u) else
                    f"regret {float(r['regret']):.4f}, 95% bound {float(u):.4f}"), fontsize=9)
    ax.set_xlabel("learning rate (peak)")
