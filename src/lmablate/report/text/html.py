"""``report.md`` as one self-contained HTML page for MLflow's artifact viewer, which cannot
fetch images relative to a Markdown file: the figures are inlined as ``data:`` URIs. Markdown is
rendered by markdown-it-py (CommonMark with GitHub's tables).
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

from markdown_it import MarkdownIt

_IMAGE = re.compile(r'<img src="(?P<src>[^"]+)"')
_STYLE = ("body{font-family:system-ui,sans-serif;max-width:72rem;margin:1.5rem auto;"
          "padding:0 1rem;line-height:1.45;color:#1a1a1a}"
          "table{border-collapse:collapse;margin:0.8rem 0;font-size:0.92rem}"
          "th,td{border:1px solid #ccc;padding:0.2rem 0.5rem;text-align:left}"
          "th{background:#f3f3f3}img{max-width:100%}code{background:#f5f5f5;padding:0 0.2rem}")


def report_html(markdown: str, folder: Path, title: str = "lmablate report") -> str:
    """``markdown`` (a report written in ``folder``) as a complete HTML page whose PNG images,
    linked relative to ``folder``, are embedded as base64 ``data:`` URIs (one missing, or
    outside ``folder``, keeps its link)."""
    # html off: a "<" in a cell (a variant name, a value) is text, never markup
    body = MarkdownIt("commonmark", {"html": False}).enable("table").render(markdown)
    root = folder.resolve()

    def inline(match: re.Match) -> str:
        src = html.unescape(match["src"])
        path = (folder / src).resolve()
        if "://" in src or not path.is_relative_to(root) or not path.is_file() \
                or path.suffix.lower() != ".png":
            return match[0]
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        return f'<img src="data:image/png;base64,{data}"'

    body = _IMAGE.sub(inline, body)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head>\n"
            f"<body>\n{body}</body></html>\n")
