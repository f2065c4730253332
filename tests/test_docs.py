"""The README as the front page: its findings block is what docs/update_readme.py writes, its
commands block is what .ci/run reads, and its links into the handbook lead to pages."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _load(name: str):
    return load_script(ROOT / "docs" / f"{name}.py")


@pytest.fixture(scope="module")
def gen():
    return _load("update_readme")


def test_the_readme_findings_block_round_trips_through_the_generator(gen):
    block = gen.block_of(README)
    rows = gen.parse(block)
    assert rows, "the findings block has no rows"
    assert gen.render(rows) == block
    for dataset in {r.dataset for r in rows}:
        of = [r for r in rows if r.dataset == dataset]
        assert of[0].variant == gen.BASELINE and all(r.verdict for r in of[1:]), dataset
    assert (ROOT / gen.FIGURE).is_file()
    assert (ROOT / gen.FIGURE).stat().st_size < 300_000


def _write(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def test_the_generator_reads_a_study_and_writes_the_block(gen, tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir()
    summary, comparisons, sensitivity, tuned = [], [], [], []
    for ds, metric in (("text", "test_loss"), ("sums", "answer_loss")):
        for i, variant in enumerate(("baseline", "rope")):
            for m in {metric, "test_loss"} | ({"exact_match"} if ds == "sums" else set()):
                summary.append({"dataset": ds, "variant": variant, "metric": m, "n": 5,
                                "mean": 2.0 - 0.1 * i, "std": 0.01, "ci95_low": 1.99 - 0.1 * i,
                                "ci95_high": 2.01 - 0.1 * i})
            sensitivity.append({"dataset": ds, "variant": variant, "lr_sensitivity": 0.25 + i})
            tuned.append({"dataset": ds, "variant": variant, "tuning_uncertainty": 0.01 + i / 100,
                          "lr_sensitivity_full": 0.003 * (1 + i)})
        comparisons.append({"dataset": ds, "metric": metric, "variant": "rope",
                            "mean_diff": -0.1, "ci_holm_low": -0.12, "ci_holm_high": -0.08,
                            "p_holm": 0.0004, "verdict": "better"})
    _write(reports / "summary.csv", summary)
    _write(reports / "comparisons.csv", comparisons)
    _write(reports / "lr_sensitivity.csv", sensitivity)
    _write(reports / "tuned.csv", tuned)
    rows = gen.collect(tmp_path)
    assert [(r.dataset, r.variant, r.metric) for r in rows] == [
        ("text", "baseline", "test_loss"), ("text", "rope", "test_loss"),
        ("sums", "baseline", "answer_loss"), ("sums", "rope", "answer_loss")]
    block = gen.render(rows)
    assert "| text | `rope` | 5 | test loss, nats/char | 1.900 ± 0.010 | −0.100 [−0.120, −0.080] " \
           "| <0.001 | ▲ better | – | 0.020 | 1.250 | 0.006 |" in block
    assert "**sums**: better than the baseline: rope" in block
    assert gen.render(gen.parse(block)) == block
    readme = f"before\n{gen.START}\nold\n{gen.END}\nafter\n"
    assert gen.replace_block(readme, block) == f"before\n{block}\nafter\n"


def test_the_readme_is_a_front_page_with_the_commands_ci_reads():
    assert len(README.splitlines()) <= 150
    # .ci/run reads the two lines after <!-- commands -->: the install and study, then the tests
    block = README.split("<!-- commands -->\n", 1)[1].split("```\n", 2)[1].splitlines()
    assert block[0].endswith(" && dvc repro") and block[1].endswith("pytest"), block
    assert "TIME_PLACEHOLDER" not in README


def test_the_readme_links_into_the_handbook_lead_to_pages():
    links = re.findall(r"\]\((?!https?:|#)([^)#\s]+)(?:#[^)]*)?\)", README)
    assert any(link.startswith("docs/") for link in links)
    for link in links:
        assert (ROOT / link).exists(), link


def test_every_handbook_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = [p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").glob("*.md")]
    assert pages and all(page in nav for page in pages), pages
