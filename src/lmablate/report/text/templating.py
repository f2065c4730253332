"""The report's Jinja2 environment: its templates, the filters that format every number, and
the call of one macro (:func:`macro_text`), through which each section's module says its
sentences; the sentences themselves live in ``report/templates``. Cells are formatted by the
filters below, most of them :mod:`lmablate.report.text.mdtable`'s functions, so that a number
reads the same in every section.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any, Iterable, Mapping, Sequence

import jinja2
import pandas as pd

from lmablate.report.captions import Caption
from lmablate.report.stats.scaling import SCALING_TITLE
from lmablate.report.text import mdtable

CAPTIONS = "_captions.md.j2"  # every figure's caption, a macro each


def lines(items: Iterable[str]) -> str:
    """Markdown lines, one per item, joined by ``\\n`` (no final newline)."""
    return "\n".join(items)


def table(rows: Sequence[Mapping[str, Any]] | pd.DataFrame) -> str:
    """Rows (column -> cell dicts, the columns of the first row) as a Markdown table
    (:func:`~lmablate.report.text.mdtable.md_table`)."""
    return mdtable.md_table(rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows))


def plural(n: int, noun: str) -> str:
    """``1 seed``, ``5 seeds``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def percent(x: float) -> str:
    """A fraction as a whole percentage: ``0.95`` -> ``95%``."""
    return f"{x:.0%}"


def fixed(x: float, digits: int = 3) -> str:
    """Fixed-point with ``digits`` decimals, as Python writes it (``nan``, ``inf`` too)."""
    return f"{float(x):.{digits}f}"


def signed(x: float, digits: int = 3) -> str:
    """``+0.062`` / ``-0.126``: an effect with its sign always shown."""
    return f"{float(x):+.{digits}f}"


def million_tokens(x: float) -> str:
    """Tokens in millions (``1.13M``), ``∞`` for an infinite bound, ``n/a`` for none."""
    if x is None or math.isnan(x):
        return "n/a"
    return "∞" if math.isinf(x) else f"{x / 1e6:.2f}M"


# name -> function: every filter of the template, each formatting in one place
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
    "join_names": mdtable.join_names,
    "md_table": table,
    "lines": lines,
    "plural": plural,
    "g": lambda x: f"{x:g}",  # shortest float: 0.125, 1e-05
    "tuning_seeds": mdtable.tuning_seeds,
    "percent": percent,
    "fixed": fixed,
    "signed": signed,
    "share": lambda x: f"{x:+.1%}",  # a difference as a share of the baseline: +4.9%
    "tokens": million_tokens,
    "g2": lambda x: f"{x:.2g}",  # two significant digits: 0.0015, 0.11
    "fmt": format,  # any format spec: x|fmt(",.0f")
    "exp": math.exp,
}


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The report's Jinja2 environment: templates from the package's ``report/templates``,
    :data:`FILTERS` registered, a missing field an error (``StrictUndefined``), no escaping
    (the output is Markdown, not HTML). ``SCALING_TITLE`` is a global: the sentences that
    point to that section name it too."""
    env = jinja2.Environment(loader=jinja2.PackageLoader("lmablate.report", "templates"),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             trim_blocks=True, lstrip_blocks=True, autoescape=False)
    env.filters.update(FILTERS)
    env.globals["SCALING_TITLE"] = SCALING_TITLE
    return env


def caption_text(caption: Caption | str) -> str:
    """A figure's caption as the report prints it: :data:`CAPTIONS`' macro
    ``caption.name`` called with its fields; a string (a figure not drawn, and the sentence
    saying why) as it is.

    Raises:
        jinja2.UndefinedError: the template has no such macro, or it misses a field.
    """
    if isinstance(caption, str):
        return caption
    return macro_text(CAPTIONS, caption.name, **dict(caption.fields))


def macro_text(template: str, macro: str, /, **fields: Any) -> str:
    """The text of macro ``macro`` of ``template`` (one of the package's templates) called with
    ``fields``: a sentence whose words live in the template, its numbers formatted by
    :data:`FILTERS`.

    Raises:
        jinja2.UndefinedError: the template has no such macro, or it misses a field.
    """
    macros = environment().get_template(template).module
    return str(getattr(macros, macro)(**fields))
