"""The report's Jinja2 environment: its templates (``report/templates``), the filters that format
every number (most of them :mod:`lmablate.report.text.mdtable`'s, so that a number reads the same
in every section) and :func:`macro_text`, through which a section's module says its sentences.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import jinja2
import pandas as pd

from lmablate.report.captions import Caption
from lmablate.report.stats.scaling import SCALING_TITLE
from lmablate.report.text import mdtable

CAPTIONS = "_captions.md.j2"  # every figure's caption, a macro each


def million_tokens(x: float) -> str:
    """Tokens in millions (``1.13M``), ``∞`` for an infinite bound, ``n/a`` for none."""
    if x is None or math.isnan(x):
        return "n/a"
    return "∞" if math.isinf(x) else f"{x / 1e6:.2f}M"


# name -> function: every filter of the templates, each formatting in one place
FILTERS = {
    "num": mdtable.num,  # fixed-point, "–" for None/NaN/inf
    "integer": mdtable.integer,  # thousands separators, "–" for None/NaN
    "p_value": mdtable.p_value,  # "<0.001" or three decimals, "–" for None/NaN
    "interval": mdtable.interval,
    "verdict": mdtable.verdict_cell,
    "delta": mdtable.delta_cell,
    "fence": mdtable.fence,
    "code_span": mdtable.code_span,
    "text": mdtable.text,  # a table cell, "–" for None/NaN/""
    "cell": mdtable.cell,  # a table cell as str() writes it
    "missing": mdtable.missing,
    "finite": lambda x: x is not None and math.isfinite(x),
    "digits": mdtable.digits,  # a metric's decimals
    "metric_label": mdtable.metric_label,
    "join_names": mdtable.join_names,
    "md_table": lambda rows: mdtable.md_table(rows if isinstance(rows, pd.DataFrame)
                                              else pd.DataFrame(rows)),
    "lines": "\n".join,  # Markdown lines, no final newline
    "plural": lambda n, noun: f"{n} {noun}{'' if n == 1 else 's'}",  # 1 seed, 5 seeds
    "g": lambda x: f"{x:g}",  # shortest float: 0.125, 1e-05
    "tuning_seeds": mdtable.tuning_seeds,
    "percent": lambda x: f"{x:.0%}",  # a fraction as a whole percentage: 0.95 -> 95%
    "fixed": lambda x, digits=3: f"{float(x):.{digits}f}",  # as Python writes it, nan too
    "signed": lambda x, digits=3: f"{float(x):+.{digits}f}",  # +0.062 / -0.126
    "share": lambda x: f"{x:+.1%}",  # a difference as a share of the baseline: +4.9%
    "tokens": million_tokens,
    "g2": lambda x: f"{x:.2g}",  # two significant digits: 0.0015, 0.11
    "fmt": format,  # any format spec: x|fmt(",.0f")
    "exp": math.exp,
}


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The report's Jinja2 environment: the package's templates, :data:`FILTERS`, a missing
    field an error (``StrictUndefined``), no escaping (Markdown), ``SCALING_TITLE`` a global."""
    env = jinja2.Environment(loader=jinja2.PackageLoader("lmablate.report", "templates"),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             trim_blocks=True, lstrip_blocks=True, autoescape=False)
    env.filters.update(FILTERS)
    env.globals["SCALING_TITLE"] = SCALING_TITLE
    return env


def caption_text(caption: Caption | str) -> str:
    """A figure's caption: :data:`CAPTIONS`' macro ``caption.name`` with its fields; a string
    (a figure not drawn, and why) as it is.

    Raises:
        jinja2.UndefinedError: the template has no such macro, or it misses a field.
    """
    return caption if isinstance(caption, str) else macro_text(CAPTIONS, caption.name,
                                                               **dict(caption.fields))


def macro_text(template: str, macro: str, /, **fields: Any) -> str:
    """The text of macro ``macro`` of the package's ``template`` called with ``fields``.

    Raises:
        jinja2.UndefinedError: the template has no such macro, or it misses a field.
    """
    return str(getattr(environment().get_template(template).module, macro)(**fields))
