"""A griffe extension for the API pages: the docstrings' reStructuredText roles
(:class:`~lmablate.config.study.StudyConfig`) and double backticks rendered as Markdown code
spans."""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:class|func|meth|attr|data|mod|exc|obj):`(~?)([^`]+)`")


def plain(text: str) -> str:
    text = ROLE.sub(lambda m: f"`{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}`",
                    text)
    return text.replace("``", "`")


class Roles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain(obj.docstring.value)
