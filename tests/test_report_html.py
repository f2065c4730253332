"""lmablate.report.text.html: report.md as one HTML page with its figures inline."""

from __future__ import annotations

import base64
import re

from lmablate.report.text.html import report_html

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(40))


def test_a_linked_png_is_embedded_byte_for_byte_and_tables_render(tmp_path):
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "a.png").write_bytes(PNG)
    md = ("# Findings\n\n| variant | Δ |\n|---|---|\n| rope | −0.112 |\n\n"
          "![forest](figures/a.png)\n")
    page = report_html(md, tmp_path, "t")
    assert page.startswith("<!DOCTYPE html>") and "<title>t</title>" in page
    assert "<h1>Findings</h1>" in page and "<td>rope</td>" in page and "<th>Δ</th>" in page
    data, = re.findall(r'<img src="data:image/png;base64,([^"]+)"', page)
    assert base64.b64decode(data) == PNG


def test_a_missing_image_or_one_outside_the_folder_keeps_its_link(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "secret.png").write_bytes(PNG)
    page = report_html("![a](figures/none.png) ![b](../secret.png) ![c](https://x/y.png)",
                       tmp_path / "out")
    assert 'src="figures/none.png"' in page and 'src="../secret.png"' in page
    assert 'src="https://x/y.png"' in page and "base64" not in page


def test_markup_in_the_text_is_escaped_not_run(tmp_path):
    page = report_html("a <script>alert(1)</script> b", tmp_path)
    assert "<script>" not in page
