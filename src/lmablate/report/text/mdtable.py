"""Markdown cells and tables of the report: numbers, p-values, intervals, verdicts and lists of
names as text, the same in every section; "–" stands for a missing value everywhere.
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from lmablate.report.stats.statistics import METRICS, VERDICT_BETTER, VERDICT_WORSE

VERDICT_MARKS = {VERDICT_BETTER: "▲", VERDICT_WORSE: "▼"}


def md_table(df: pd.DataFrame) -> str:
    """A GitHub-flavoured Markdown table (kept local so the report needs no ``tabulate``)."""
    return "\n".join(["| " + " | ".join(map(cell, df.columns)) + " |",
                      "|" + "|".join("---" for _ in df.columns) + "|",
                      *("| " + " | ".join(map(cell, row)) + " |"
                        for row in df.itertuples(index=False, name=None))])


def missing(x: Any) -> bool:
    """None, NaN or an empty string."""
    return not x if x is None or isinstance(x, str) else bool(pd.isna(x))


def text(x: Any) -> str:
    """``x`` as a table cell (``|`` escaped, newlines as spaces), "–" where :func:`missing`."""
    return "–" if missing(x) else cell(x)


def num(x: Any, digits: int = 3) -> str:
    """Fixed-point with ``digits`` decimals, "–" for missing or infinite."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)) or pd.isna(x):
        return "–"
    return f"{float(x):.{digits}f}"


def integer(x: Any) -> str:
    return "–" if x is None or pd.isna(x) else f"{int(round(float(x))):,}"


def p_value(x: Any) -> str:
    return "–" if x is None or pd.isna(x) else "<0.001" if x < 0.001 else f"{x:.3f}"


def metric_label(metric: str) -> str:
    """``test loss (lower is better)``: the metric's label and direction."""
    label, _, higher = METRICS[metric]
    return f"{label} ({'higher' if higher else 'lower'} is better)"


def cell(v: Any) -> str:
    """``v`` as a table cell: its ``str``, ``|`` escaped, newlines as spaces."""
    return str(v).replace("|", "\\|").replace("\n", " ")


def digits(metric: str) -> int:
    return {"perplexity": 2, "train_seconds": 1, "tokens_per_second": 0}.get(metric, 3)


def fence(text: str) -> str:
    """A code block whose fence is longer than any backtick run inside ``text``."""
    fence = "`" * max(3, max(map(len, re.findall(r"`+", text)), default=0) + 1)
    return f"{fence}text\n{text}\n{fence}"


def join_names(items: Sequence[Any]) -> str:
    """``a``, ``a and b``, ``a, b and c`` (each item as its ``str``); "" for no items."""
    items = [str(i) for i in items]
    return " and ".join(items) if len(items) <= 2 else ", ".join(items[:-1]) + " and " + items[-1]


def code_span(text: str) -> str:
    text = str(text).replace("\n", "\\n")
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def verdict_cell(verdict: str) -> str:
    """A verdict as shown: bold with its mark when better or worse."""
    mark = VERDICT_MARKS.get(verdict, "")
    return f"**{mark} {verdict}**" if mark else verdict


def delta_cell(c: Mapping[str, Any]) -> str:
    """A comparison row as one cell: mean difference, raw interval and verdict."""
    return f"{num(c['mean_diff'])} {interval(c, 3)} {verdict_cell(c['verdict'])}"


def interval(row: Mapping[str, Any], digits: int, prefix: str = "ci95") -> str:
    """``[<prefix>_low, <prefix>_high]`` of a table row, or "–" where there is no interval."""
    if not np.isfinite(row[f"{prefix}_low"]):
        return "–"
    return f"[{num(row[f'{prefix}_low'], digits)}, {num(row[f'{prefix}_high'], digits)}]"


def tuning_seeds(tune: Any) -> str:
    """A ``TuneConfig``'s bracket seeds: ``tuning seed 1000`` or ``tuning seeds 1000, 1001``."""
    seeds = [tune.seed + k for k in range(tune.bracket_seeds)]
    return f"tuning seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"
