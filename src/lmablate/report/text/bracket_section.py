"""The report's sub-section on each variant's full-budget learning-rate bracket: a table of what
it chose. What the bracket is: the template ``_tuning.md.j2``; its figure:
:mod:`lmablate.report.figures.bracket_figure`.
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


def bracket_lines(tuned: pd.DataFrame, dataset: str, order: Sequence[str]) -> list[str]:
    """The sub-section on the full-budget bracket below its heading and above its figure (both
    the report template's): a pointer to its definition (``_tuning.md.j2``) and the table; no
    lines when no variant of ``dataset`` has a bracket."""
    table = bracket_table(tuned, dataset, order)
    if not table:
        return []
    text = ("Each variant's full-budget bracket ([defined once](#how-the-learning-rate-was-"
            "chosen)); losses in the tuning objective.")
    return [text, "", table, ""]
