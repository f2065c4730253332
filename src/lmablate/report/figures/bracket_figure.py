"""The full-budget bracket of each variant's learning rate, as a figure and a table: the points
trained at the full budget (one dot per tuning seed, their mean), the quadratic in ln lr fitted
through them (:mod:`lmablate.tune.lr_minimum`), the chosen learning rate, its regret and the
uncertainty of the tuned loss. Losses in the tuning objective's unit: the validation loss in
nats/char, or an arithmetic dataset's answer loss in nats per answer character.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from lmablate.report.text.mdtable import md_table, num



def full_budget_trials(trials: pd.DataFrame, dataset: str) -> pd.DataFrame:
    """``dataset``'s trials at the full budget (``budget_fraction`` 1) of a study whose last
    rung is a bracket (trials carry a ``seed``); empty otherwise."""
    if trials is None or trials.empty or "seed" not in trials:
        return pd.DataFrame(columns=getattr(trials, "columns", []))
    t = trials[(trials["dataset"] == dataset)
               & np.isclose(trials["budget_fraction"].astype(float), 1.0)]
    return t.sort_values(["variant", "params_lr", "seed"], kind="stable")


def plot_bracket(trials: pd.DataFrame, tuned: pd.DataFrame, dataset: str, path: Path, *,
                 palette: Mapping[str, Any], order: Sequence[str]) -> Path | None:
    """One panel per variant of ``dataset`` (in ``order``): validation loss against the
    learning rate (log axis) of its full-budget trials (small dots: one tuning seed each; large
    dots: their mean; an ``x`` at the top for a point with a diverged seed; hollow: the other
    width its first batch compared, not kept), the fitted
    quadratic (``tuned``'s ``fit_a/b/c``) over the points fitted, and a vertical line at the
    chosen lr; the title gives the regret and the tuning uncertainty. Returns ``path``, or None
    when no variant has a bracket."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    t = full_budget_trials(trials, dataset)
    tu = tuned[tuned["dataset"] == dataset] if len(tuned) else tuned
    variants = [v for v in order if (t["variant"] == v).any() and (
        tu["variant"] == v).any() and pd.notna(tu[tu["variant"] == v]["bracket_state"].iloc[0])]
    if not variants:
        return None
    fig, axes = plt.subplots(1, len(variants), figsize=(3.2 * len(variants), 3.4),
                             sharey=True, squeeze=False, layout="constrained")
    finite = t[pd.to_numeric(t["value"], errors="coerce").notna()]
    means = finite.groupby(["variant", "params_lr"], observed=True)["value"].mean()
    top = float(means.max()) if len(means) else 1.0
    for ax, variant in zip(axes[0], variants):
        colour = palette[variant]
        r = tu[tu["variant"] == variant].iloc[0]
        other = t[(t["variant"] == variant) & (t["params_d_model"] != r["d_model"])]
        v = t[(t["variant"] == variant) & (t["params_d_model"] == r["d_model"])]
        for d, o in other.groupby("params_d_model"):  # the width the first batch set aside
            loss = pd.to_numeric(o["value"], errors="coerce")
            ax.scatter(o["params_lr"], loss, s=30, facecolors="none", edgecolors=colour,
                       zorder=3, label=f"d_model {int(d)} (not kept)")
            ax.legend(fontsize=7, loc="best")
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
        # a tick at each learning rate trained: log axes' own labels collide over one octave
        ax.xaxis.set_major_locator(FixedLocator(sorted(set(v["params_lr"]))))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:.2g}"))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.tick_params(axis="x", labelrotation=45, labelsize=7)
        u = r.get("tuning_uncertainty")
        ax.set_title(f"{variant}: lr {float(r['lr']):.3g}, d_model {int(r['d_model'])}\n"
                     + ("tuning uncertainty not measured" if pd.isna(u) else
                        f"regret {float(r['regret']):.4f}, 95% bound {float(u):.4f}"),
                     fontsize=8)
        ax.set_xlabel("learning rate (peak)")
    answer = "objective" in tu and (tu["objective"] == "val_answer_loss").any()
    axes[0][0].set_ylabel("validation answer loss at the full budget\n(nats/answer char)"
                          if answer else "validation loss at the full budget (nats/char)")
    fig.suptitle(f"{dataset}: learning rate at the full budget (dots: tuning seeds; large: "
                 "their mean; line: fitted quadratic in ln lr; dashed: chosen lr)", fontsize=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return path


def bracket_table(tuned: pd.DataFrame, dataset: str, order: Sequence[str]) -> str:
    """One row per bracketed variant of ``dataset``: width (and the widths its first batch
    compared, with their losses), full-budget points and how the
    bracket ended, the chosen lr and how it was taken, the validation loss there (fitted),
    the seed spread of one trial, the regret at the chosen lr, the tuning uncertainty (95%)
    and the excess loss at 2x or 1/2 the chosen lr; "" when none has a bracket."""
    tu = tuned[tuned["dataset"] == dataset] if len(tuned) else tuned
    rows = []
    for variant in order:
        r = tu[tu["variant"] == variant]
        if r.empty or pd.isna(r["bracket_state"].iloc[0]):
            continue
        r = r.iloc[0]
        rows.append({
            "variant": variant, "d_model": int(r["d_model"]),
            "widths compared (val loss)": "–" if pd.isna(r.get("widths_compared")) or not
            r.get("widths_compared") else str(r["widths_compared"]),
            "full-budget lrs": f"{int(r['n_points'])} ({r['bracket_state']})",
            "chosen lr": f"{float(r['lr']):.3g} ({'fitted minimum' if r['fit_used'] == 'vertex' else 'best point'})",
            "val loss there": num(r["val_loss"], 4),
            "seed spread (SD)": num(r["seed_spread"], 4),
            "regret": num(r["regret"], 4),
            "tuning uncertainty (95%)": num(r["tuning_uncertainty"], 4),
            "excess at 2x lr": num(r["lr_sensitivity_full"], 4),
        })
    return md_table(pd.DataFrame(rows)) if rows else ""


def bracket_lines(cfg, tuned: pd.DataFrame, dataset: str, order: Sequence[str]) -> list[str]:
    """The sub-section on the full-budget bracket below its heading and above its figure (both
    the report template's): what it is and the table; no lines when no variant of
    ``dataset`` has a bracket."""
    table = bracket_table(tuned, dataset, order)
    if not table:
        return []
    tu = cfg.tune
    seeds = ", ".join(str(tu.seed + k) for k in range(tu.bracket_seeds))
    text = (
        f"Each variant's learning rate is chosen at the full budget: {tu.rungs[-1][0]} "
        f"learning rates {tu.bracket_factor:g}x apart, each trained on the tuning "
        f"seed{'s' if tu.bracket_seeds > 1 else ''} {seeds} (not final seeds), at the first rung's best width scaled to the full budget "
        "(d_model ~ C^0.25), the middle one first, at that width and at the first rung's, "
        "and the others at the better of the two. While the best is the lowest or the highest "
        f"learning rate, a further one is trained {tu.bracket_factor:g}x past it (at most "
        f"{tu.bracket_points}, within tune.lr_limits). The chosen lr is the minimum of a quadratic in ln lr fitted "
        "through the best point and up to two neighbours on each side, or the best point "
        "where that curve is not convex. The regret is how far above the minimum of the "
        "curve the chosen lr lies, over 1,000 bootstrap draws of the points' means (each "
        "from a normal with the seed spread pooled over the points); its 95th percentile is "
        "the tuning uncertainty: how much lower the variant's loss could be at a learning "
        "rate the tuner missed. A verdict in test loss is better or worse only when its "
        "Holm-adjusted interval clears 0 by more than the larger of the two variants' "
        "tuning uncertainties; otherwise it reads \"undecided (tuning)\". The excess at 2x "
        "lr is the fitted curve's rise at twice or half the chosen lr: the learning-rate "
        "sensitivity at the full budget.")
    return [text, "", table, ""]
