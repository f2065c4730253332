"""The report's sub-section on each variant's full-budget learning-rate bracket: what the bracket
is and a table of what it chose (its figure: :mod:`lmablate.report.figures.bracket_figure`).
Losses in the tuning objective's unit: the validation loss in nats/char, or an arithmetic
dataset's answer loss in nats per answer character.
"""

from __future__ import annotations

from typing import Sequence

import pandas as pd

from lmablate.report.text.mdtable import md_table, num


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
