"""The sub-section on each variant's full-budget learning-rate bracket: a table of what it chose
(the words and table are ``_lr.md.j2``'s; the bracket is defined in ``_tuning.md.j2``, drawn by
:mod:`lmablate.report.figures.bracket_figure`). Losses in the tuning objective's unit: nats/char,
or nats per answer character on arithmetic.
"""

from __future__ import annotations

from typing import Sequence

import pandas as pd

from lmablate.report.text.templating import macro_text


def bracket_lines(tuned: pd.DataFrame, dataset: str, order: Sequence[str]) -> list[str]:
    """The lines below the bracket's heading: a pointer to its definition and a row per
    bracketed variant of ``dataset`` (width and the widths its first batch compared, points and
    how the bracket ended, chosen lr and how it was taken, the fitted loss there, the seed
    spread, regret, tuning uncertainty (95%) and excess at 2x or 1/2 the lr); none without."""
    tu = tuned[(tuned["dataset"] == dataset) & tuned["bracket_state"].notna()] \
        if len(tuned) else tuned
    rows = [{"widths_compared": None, **tu[tu["variant"] == v].iloc[0].to_dict()}
            for v in order if (tu["variant"] == v).any()]
    return macro_text("_lr.md.j2", "bracket", rows=rows).split("\n") if rows else []
