"""lmablate.report.text.render: the template's filters (mdtable's cell formats), the order of the
sections of report.md, and StrictUndefined (a field the content lacks is an error)."""

from __future__ import annotations

import dataclasses
import math
import tomllib
from importlib import resources
from pathlib import Path

import jinja2
import pytest

from lmablate.report.text import dataset_tables as dt
from lmablate.report.text import samples as sm
from lmablate.report.text.content import (Arithmetic, DatasetContent, DatasetFindings, Figure,
                                          Replication, ReportContent)
from lmablate.report.text.render import render_appendix, render_report
from lmablate.report.text.templating import FILTERS, environment
from lmablate.report.text.scaling_section import ScalingDataset, ScalingSection

ROOT = Path(__file__).resolve().parents[1]


def _filter(expression: str, **values) -> str:
    """``expression`` rendered by the report's environment, e.g. ``x|num``."""
    return environment().from_string("{{ " + expression + " }}").render(**values)


@pytest.mark.parametrize("expression, value, expected", [
    ("x|num", 1.23456, "1.235"), ("x|num", -0.0005, "-0.001"), ("x|num(1)", 2.25, "2.2"),
    ("x|num(4)", 0.12, "0.1200"), ("x|num", 3, "3.000"), ("x|num", None, "–"),
    ("x|num", math.nan, "–"), ("x|num", math.inf, "–"), ("x|num", -math.inf, "–"),
    ("x|integer", 1234567.4, "1,234,567"), ("x|integer", 2.5, "2"), ("x|integer", None, "–"),
    ("x|integer", math.nan, "–"),
    ("x|p_value", 0.0004, "<0.001"), ("x|p_value", 0.001, "0.001"),
    ("x|p_value", 0.04567, "0.046"), ("x|p_value", None, "–"), ("x|p_value", math.nan, "–"),
    ("x|verdict", "better", "**▲ better**"), ("x|verdict", "worse", "**▼ worse**"),
    ("x|verdict", "no significant difference", "no significant difference"),
    ("x|code_span", "1+2=", "`1+2=`"), ("x|code_span", "a`b\nc", "`` a`b\\nc ``"),
    ("x|join_names", [], ""), ("x|join_names", ["a"], "a"), ("x|join_names", ["a", "b"], "a and b"),
    ("x|join_names", ["a", "b", "c"], "a, b and c"),
    ("x|plural('seed')", 1, "1 seed"), ("x|plural('seed')", 3, "3 seeds"),
    ("x|percent", 0.95, "95%"),
    ("x|lines", ["a", "", "b"], "a\n\nb"),
])
def test_each_filter_formats_as_mdtable_does(expression, value, expected):
    assert _filter(expression, x=value) == expected


def test_interval_and_delta_filters_take_a_table_row():
    row = {"mean_diff": -0.04412, "ci95_low": -0.0591, "ci95_high": -0.0293,
           "ci_holm_low": -0.07, "ci_holm_high": -0.01, "verdict": "better"}
    assert _filter("r|interval(3)", r=row) == "[-0.059, -0.029]"
    assert _filter("r|interval(2, 'ci_holm')", r=row) == "[-0.07, -0.01]"
    assert _filter("r|interval(3)", r={**row, "ci95_low": math.nan}) == "–"
    assert _filter("r|delta", r=row) == "-0.044 [-0.059, -0.029] **▲ better**"


def test_fence_and_md_table_filters():
    assert _filter("x|fence", x="a ``` b") == "````text\na ``` b\n````"
    assert _filter("x|fence", x="plain") == "```text\nplain\n```"
    rows = [{"variant": "baseline", "p": "a|b"}, {"variant": "rope", "p": "two\nlines"}]
    assert _filter("x|md_table", x=rows) == ("| variant | p |\n|---|---|\n"
                                             "| baseline | a\\|b |\n| rope | two lines |")


def test_every_filter_is_registered():
    assert set(FILTERS) <= set(environment().filters)
    assert environment().undefined is jinja2.StrictUndefined


# rows of the frames as the template's tables take them (dataset_tables.records)
COMPARISON = {"metric": "test_loss", "variant": "rope", "n_pairs": 3, "mean_diff": -0.05,
              "ci95_low": -0.08, "ci95_high": -0.02, "ci_holm_low": -0.09, "ci_holm_high": -0.01,
              "p_holm": 0.01, "mde": 0.03, "verdict": "better"}
PROBLEM = {"metric": "exact_match", "variant": "rope", "baseline_count": 2000,
           "variant_count": 2600, "total": 5000, "mean_diff": 0.12, "ci_holm_low": 0.09,
           "ci_holm_high": 0.15, "n_differing": 300, "n_problems": 1000, "p_holm": 2e-4}
REPLICATE = {"metric": "answer_loss", "variant": "rope", "replicate": 0, "lr": 0.002,
             "d_model": 64, "baseline_lr": 0.003, "baseline_d_model": 64, "n_pairs": 3,
             "mean_diff": -0.05, "ci_holm_low": -0.09, "ci_holm_high": -0.01, "verdict": "better"}
COMBINED = {"metric": "answer_loss", "variant": "rope", "verdicts": "better / better",
            "agree": True, "mean_diff": -0.05, "sd_between": 0.01, "sd_tuning_draw": 0.005,
            "df": 1, "ci_holm_low": -0.1, "ci_holm_high": 0.0, "p_holm": 0.02, "verdict": "better"}
SPEED = {"variant": "rope", "ratios": "1.60 / 1.20", "verdicts": "better / better",
         "agree": True, "ratio": 1.39, "df": 1, "ratio_holm_low": 1.1, "ratio_holm_high": 1.75,
         "p_holm": 0.02, "verdict": "better"}
SPREAD = {"variant": "rope", "tuned_lr": "0.002 / 0.003", "tuned_d_model": "64 / 64",
          "tuned_loss": "1.10 / 1.12", "final_mean": "1.00 / 1.02", "final_sd_between": 0.014,
          "seed_se": 0.01, "sd_tuning_draw": 0.01, "tuning_uncertainty": 0.02, "covered": True}


def _dataset(name: str = "sums") -> DatasetContent:
    """A dataset section with every optional block present."""
    return DatasetContent(
        name=name, arithmetic=Arithmetic(
            ["Arithmetic headline.", ""], ["Breakdown.", ""], ["Length.", ""],
            Figure("Length caption", "figures/l.png")),
        summary=[{"variant": "baseline", "seeds": 3}], single_seed=True,
        comparisons=[COMPARISON], compared=True,
        too_few=["gelu"], better=["rope (test loss)"], worse=[],
        problems=dt.ProblemDiagnostic(1000, 3, [PROBLEM]),
        tuned=[{"variant": "baseline", "lr": "0.002"}],
        lr=["Sensitivity.", ""], lr_figure=Figure("LR caption", "figures/lr.png"),
        bracket=["Bracket.", ""], bracket_figure=None,
        figures=[Figure("A caption", "figures/a.png"), Figure("Not drawn: why.", None)],
        has_samples=True, samples=[sm.Shown("baseline", "seed_0", text="ROMEO:")],
        has_predictions=True,
        predictions=[sm.Shown("rope", "seed_0", "learned", rows=[{"prompt": "`1+1=`"}])])


FIT = {"variant": "rope", "form": "log-log line", "saturating": False, "at_bound": False,
       "E": math.nan, "A": 79.4, "A_low": 52.1, "A_high": 100.0, "alpha": 0.218,
       "alpha_low": math.nan, "alpha_high": math.nan, "n_bootstrap": 1000}
TREND = {"variant": "rope", "effects": [("1e6", None), ("3e6", {
    "mean_diff": 0.546, "ci_holm_low": 0.432, "ci_holm_high": 0.66, "verdict": "worse"})],
    "slope": 0.024, "slope_holm_low": -0.154, "slope_holm_high": 0.201,
    "trend": "no detectable trend", "marked": False, "crossing": "2e6"}
OPTIMAL = {"variant": "rope", "cells": [("1e6", {"optimal_d_model": 16.0, "vertex": False,
                                                 "tuned_d_model": 16}), ("3e6", None)]}
EXTRAPOLATED = {"variant": "rope", "predicted": 0.078, "predicted_low": 0.065,
                "predicted_high": 0.114, "delta": -0.748, "delta_low": -0.812,
                "delta_high": -0.675}
TRENDS_TABLE = ("| variant | Δ at 1e6 | Δ at 3e6 | slope per decade | trend | curves cross at |\n"
                "|---|---|---|---|---|---|\n| rope | – | 0.546 [0.432, 0.660] **▼ worse** | "
                "0.024 [-0.154, 0.201] | no detectable trend | 2e6 FLOPs |")


def _scaling(sentences: tuple[str, ...] = ("Trend.",)) -> ScalingSection:
    return ScalingSection(
        "Scaling.", [ScalingDataset("sums", "answer loss", "nats/answer char", False, 2,
                                    [FIT], [TREND], list(sentences))],
        {"sums": [OPTIMAL]}, {"sums": ("At the seed scale.", [EXTRAPOLATED])},
        curves_figure="figures/c.png", effects_figure=None, isoflop_figure="figures/i.png")


def _content(**changes) -> ReportContent:
    content = ReportContent(
        n_runs=6, n_datasets=1, n_variants=2, n_seeds=3, profile="default",
        findings=[DatasetFindings("sums", ["**sums**: verdicts.", ""], "answer loss", None)],
        csv_files=["ablation.csv", "summary.csv", "comparisons.csv"],
        limits={"sums": ["A limit.", "Another."]}, scaling=_scaling(),
        methods=["Methods.", ""], notes=["sums/old is ignored"],
        datasets=[_dataset()], other_figures=[Figure("Other caption", "figures/o.png")],
        replication=[Replication("sums", "answer loss", "nats/answer char", 3, [REPLICATE],
                                 [COMBINED], [SPREAD],
                                 Figure("Replication caption", "figures/r.png"), [SPEED])])
    return dataclasses.replace(content, **changes)


# the order of report.md's sections (docs/report.md, "The sections")
SECTIONS = ["# Ablation study report", "## Findings", "### How to read this report",
            "## Replication", "The whole study was run 3 times",
            "### sums: answer loss (nats/answer char)",
            "| rope | 0 | 0.002, 64 | 0.003, 64 | 3 | -0.050 | [-0.090, -0.010] | better |",
            "| rope | better / better | yes | -0.050 | 0.010 | 0.005 | 1 | [-0.100, 0.000] | 0.020 "
            "| better |",
            "**Replication caption**", "How far tuning moved between replicates",
            "## What this study can and cannot say", "## How the effects change with compute",
            "## Methodology", "Data notes:", "## sums", "### Headline", "Arithmetic headline.",
            "Breakdown.", "### Length generalisation", "Length.", "**Length caption**",
            "### Summary (mean ± 95% CI half-width over seeds)",
            "Some cells rest on a single seed", "### Comparison with the baseline",
            "Too few seeds to conclude for gelu", "Significantly better than the baseline: "
            "rope (test loss). Significantly worse: none.",
            "### Problem by problem (a diagnostic, not a verdict)",
            "### Tuned hyper-parameters, size and throughput",
            "In the [appendix](appendix.md#sums): how each variant responds to the learning "
            "rate, each variant's full-budget bracket, samples, predictions.", "### Figures",
            "## Other figures"]
# appendix.md: the detail report.md links to, in this order
APPENDIX_SECTIONS = ["# Appendix to the ablation study report", "## sums",
                     "### How each variant responds to the learning rate",
                     "#### At the full budget: each variant's learning rate bracketed",
                     "### Samples", "### Predictions"]


def test_the_template_renders_the_sections_in_the_documented_order():
    md = render_report(_content())
    at = [md.index(f"\n{s}") if i else md.index(s) for i, s in enumerate(SECTIONS)]
    assert at == sorted(at) and at[0] == 0
    assert md.endswith("![o](figures/o.png)\n") and "\n\n\n" not in md
    assert ("Every table is also one of the 3 CSV files beside this report (`summary.csv` in "
            "long format, one row per dataset x variant x metric); the handbook's [The files]"
            "(../docs/report.md#the-files) describes each.\n") in md
    assert "- sums/old is ignored\n\n## sums\n" in md
    assert ("### Problem by problem (a diagnostic, not a verdict)\n\nWhich of the same 1,000 "
            "test problems each variant gets right on its 3 seeds, paired problem by problem") in md
    assert "**A caption**\n\n![a](figures/a.png)\n\nNot drawn: why.\n\n## Other figures" in md
    assert ("## What this study can and cannot say\n\n**sums**\n\n- A limit.\n- Another.\n\n"
            "## How the effects change with compute\n\nScaling.\n\n![Loss against compute]"
            "(figures/c.png)\n\n*Headline loss against training FLOPs") in md
    assert ("### sums: answer loss against compute\n\nWith 2 budgets only the straight line "
            "log L = log A - α log C is fitted (no irreducible loss E: a saturating law has "
            "three parameters and needs at least 4 budgets)") in md
    assert ("three parameters and needs at least 4 budgets), with the 95% interval of a bootstrap "
            "over seeds:\n\n| variant | fitted law | E | A | α | bootstrap fits |\n|---|---|---|---"
            "|---|---|\n| rope | log-log line | – | 79.4 [52.1, 100] | 0.218 | 1000 |\n\n") in md
    assert (f"its trend per decade of compute:\n\n{TRENDS_TABLE}\n\nTrend.\n\n"
            "### Compute-optimal width\n\nAt each budget,") in md
    # no trend sentence: the table's blank line and the block's, as the section always had
    md = render_report(_content(scaling=_scaling(sentences=())))
    assert (f"its trend per decade of compute:\n\n{TRENDS_TABLE}\n\n\n"
            "### Compute-optimal width\n\nAt each budget,") in md
    assert "Effects against compute" not in md
    assert ("| variant | 1e6 | 3e6 |\n|---|---|---|\n| rope | 16* (tuned 16) | – |\n\n"
            "![IsoFLOP profiles](figures/i.png)\n\n### An extrapolation, not a measurement\n\n"
            "At the seed scale.\n\n| variant | predicted loss | Δ vs baseline |\n|---|---|---|\n"
            "| rope | 0.078 [0.065, 0.114] | -0.748 [-0.812, -0.675] |\n\n"
            "## Methodology\n\nMethods.\n\nData notes:") in md
    assert md.startswith("# Ablation study report\n\n6 runs: 1 dataset x 2 variants x 3 seeds, "
                         "of the default profile (`study.profile`).")
    assert "\n\n## Findings\n\n**sums**: verdicts.\n\n### How to read this report" in md
    # an arithmetic dataset's learning speed over the replicates: after the forest plot, before
    # the tuning spread
    assert ("![r](figures/r.png)\n\nLearning speed: the ratio of training tokens until the "
            "probe's exact match reached 0.5") in md
    assert ("| variant | ratio by replicate | verdicts by replicate | agree | combined ratio | df "
            "| CI (Holm-adjusted) | p (Holm) | combined verdict |\n|---|---|---|---|---|---|---|"
            "---|---|\n| rope | 1.60 / 1.20 | better / better | yes | 1.39 | 1 | [1.10, 1.75] | "
            "0.020 | better |\n\nHow far tuning moved between replicates") in md
    assert ("| metric | variant | paired seeds | Δ (variant − baseline) | 95% CI of Δ (raw) | CI "
            "of Δ (Holm-adjusted) | p (Holm) | MDE (80% power) | verdict |\n|---|---|---|---|---|"
            "---|---|---|---|\n| test loss (lower is better) | rope | 3 | -0.050 | [-0.080, -0.020]"
            " | [-0.090, -0.010] | 0.010 | 0.030 | **▲ better** |\n\n") in md
    assert ("| rope | 0.002 / 0.003 | 64 / 64 | 1.10 / 1.12 | 1.00 / 1.02 | 0.0140 | 0.0100 | "
            "0.0100 | 0.0200 | yes |\n\n") in md


def test_the_appendix_holds_the_tuning_detail_samples_and_predictions_the_report_links_to():
    content = _content()
    app = render_appendix(content)
    at = [app.index(f"\n{s}") if i else app.index(s) for i, s in enumerate(APPENDIX_SECTIONS)]
    assert at == sorted(at) and at[0] == 0 and "\n\n\n" not in app
    assert ("### How each variant responds to the learning rate\n\nSensitivity.\n\n"
            "**LR caption**\n\n![lr](figures/lr.png)\n\n#### At the full budget: each "
            "variant's learning rate bracketed\n\nBracket.\n\n### Samples\n") in app
    assert "**baseline** (seed_0):\n\n```text\nROMEO:\n```\n" in app
    assert "**rope** (seed_0, learned):\n\n| prompt |\n|---|\n| `1+1=` |\n" in app
    assert "(truncated to 300 characters)" in app and "Up to 3 greedy-decoded" in app
    md = render_report(content)
    for moved in APPENDIX_SECTIONS[2:]:
        assert f"\n{moved}\n" not in md
    # the report links to the dataset's part of the appendix; with nothing there, no link
    bare = dataclasses.replace(_dataset(), lr=[], lr_figure=None, bracket=[],
                               bracket_figure=None, has_samples=False, has_predictions=False)
    assert "appendix.md" not in render_report(_content(datasets=[bare]))


def test_optional_blocks_are_left_out_without_blank_lines():
    bare = dataclasses.replace(
        _dataset(), arithmetic=None, summary=[], single_seed=False, comparisons=[],
        compared=False, too_few=[], problems=None, tuned=[],
        lr=[], lr_figure=None, bracket=[], bracket_figure=None, figures=[], has_samples=False,
        samples=[], has_predictions=False, predictions=[])
    md = render_report(_content(findings=[], limits={}, scaling=None, notes=[], datasets=[bare],
                                other_figures=[], replication=[]))
    assert "\n\n\n" not in md and "### Figures" not in md and "Data notes" not in md
    assert "Replication" not in md
    assert "How the effects change with compute" not in md and "learning rate" not in md
    assert "### Headline" not in md and "### Length generalisation" not in md
    assert ("## Findings\n\n### How to read" in md
            and "## What this study can and cannot say\n\n## Methodology\n\nMethods." in md)
    assert ("## sums\n\n### Summary (mean ± 95% CI half-width over seeds)\n\n_No results._\n\n"
            "### Comparison with the baseline\n\n_No comparisons: they need runs of the "
            "baseline and of at least one other variant on this dataset._\n\n"
            "### Tuned hyper-parameters, size and throughput\n\n_No runs._\n") in md
    assert md.endswith("_No runs._\n")


def test_a_field_the_content_lacks_is_an_error():
    fields = {f.name: getattr(_content(), f.name) for f in dataclasses.fields(ReportContent)}
    template = environment().get_template("report.md.j2")
    template.render(report=fields)  # a mapping with every field renders
    del fields["profile"]
    with pytest.raises(jinja2.UndefinedError, match="profile"):
        template.render(report=fields)
    with pytest.raises(jinja2.UndefinedError):
        environment().from_string("{{ report.nothing|num }}").render(report=_content())


def test_the_templates_are_package_data():
    templates = resources.files("lmablate.report") / "templates"
    assert (templates / "report.md.j2").is_file()
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-data"]["lmablate"] == ["report/templates/*.j2"]
    shipped = {p.name for p in (ROOT / "src/lmablate/report/templates").glob("*.j2")}
    assert {"report.md.j2", "_dataset.md.j2", "_figures.md.j2"} <= shipped
