"""A figure's caption as data: its macro in ``report/templates/_captions.md.j2`` and the fields
it fills in; the text layer renders it (:func:`lmablate.report.text.templating.caption_text`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Caption:
    """Macro ``name`` of ``_captions.md.j2`` with keyword ``fields``, as (key, value) pairs."""

    name: str
    fields: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, macro: str, /, **fields: Any) -> Caption:
        """``Caption.of("bracket", ds="arithmetic")``: macro ``macro`` with ``fields``."""
        return cls(macro, tuple(fields.items()))
