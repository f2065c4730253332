"""The text of ``report.md`` from the report's tables and figures.

:func:`report_markdown` gathers what :func:`~lmablate.report.text.markdown.render_markdown` lays
out: the "Findings" that open the report (:func:`~lmablate.report.text.findings.findings_section`),
the lines that open each arithmetic dataset's section (:func:`arithmetic_lines`), and every
figure linked relative to the report's folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

from lmablate.report.text import arithmetic_section as arith
from lmablate.report.text import findings as fi
from lmablate.report.collect import RunOutputs, present
from lmablate.report.text.markdown import render_markdown
from lmablate.report.figures.report_figures import ReportFigures
from lmablate.report.tables import ReportTables
from lmablate.config.study import StudyConfig


def arithmetic_lines(cfg: StudyConfig, runs: RunOutputs, tables: ReportTables,
                     figures: ReportFigures, out_dir: Path) -> dict[str, list[str]]:
    """Arithmetic dataset -> the lines that open its section: the headline against its floors,
    the answer loss by operation and answer length, and length generalisation with its figure
    (linked relative to ``out_dir``) (:mod:`lmablate.report.text.arithmetic_section`)."""
    variants = present(runs.ablation["variant"])
    lines: dict[str, list[str]] = {}
    for ds in present(runs.ablation["dataset"]):
        if cfg.datasets[ds].kind != "arithmetic":
            continue
        digits = arith.training_digits(cfg.datasets[ds], runs.by_operand_digits, ds)
        caption, path = figures.length_figures[ds]
        lines[ds] = arith.headline_lines(tables.summary, tables.comparisons, tables.references,
                                         ds, variants)
        lines[ds] += arith.breakdown_lines(runs.per_op, runs.by_answer_digits, ds, variants)
        lines[ds] += arith.length_lines(
            tables.length, tables.length_comparisons, ds, digits, variants,
            (caption, path.relative_to(out_dir).as_posix()) if path else None)
    return lines


def report_markdown(cfg: StudyConfig, runs: RunOutputs, notes: Sequence[str],
                    tables: ReportTables, figures: ReportFigures, out_dir: Path,
                    environment: Mapping[str, Any] | None = None,
                    scaling: Sequence[str] = (), trends: pd.DataFrame | None = None) -> str:
    """The text of ``report.md`` (:func:`~lmablate.report.text.markdown.render_markdown`), to be
    written in ``out_dir``: figures are linked relative to it, and a dataset's findings point
    to its forest plot (``figures/forest_<dataset>.png``) where one was drawn. ``notes``: the
    lines of the data section about runs missing or ignored
    (:func:`~lmablate.report.collect.restrict_to_study`); ``environment``: the machine and
    versions for the methodology paragraph; ``scaling``: the lines of a scaling study's section
    (:func:`~lmablate.report.text.scaling_section.scaling_section`) and ``trends`` its trend
    table, summed up in the findings."""
    ablation = runs.ablation
    datasets = present(ablation["dataset"])
    written = {p for _, _, p in figures.figures if p is not None}
    fig_dir = out_dir / "figures"
    findings = fi.findings_section(
        tables.comparisons, datasets=datasets, variation=tables.variation,
        references=tables.references, convergence=tables.convergence,
        extrapolation=tables.extrapolation, length=tables.length,
        positions={v: cfg.model_config(v, vocab_size=1).position
                   for v in present(ablation["variant"])},
        figures={ds: f"figures/forest_{ds}.png" for ds in datasets
                 if (fig_dir / f"forest_{ds}.png") in written}, trends=trends,
        success=tables.success, speed=(tables.speed_summary, tables.speed_comparisons))
    return render_markdown(
        cfg, runs, tables.summary, tables.comparisons,
        [(ds, cap, p.relative_to(out_dir).as_posix() if p is not None else None)
         for ds, cap, p in figures.figures],
        environment, notes, tables.variation, problems=tables.problems,
        references=tables.references, tuned=runs.tuned,
        extrapolation=(tables.extrapolation, tables.extrapolation_comparisons),
        sensitivity=tables.sensitivity, arithmetic=arithmetic_lines(cfg, runs, tables,
                                                                    figures, out_dir),
        lr_figures={ds: (cap, p.relative_to(out_dir).as_posix())
                    for ds, (cap, p) in figures.lr_figures.items()},
        bracket_figures={ds: (cap, p.relative_to(out_dir).as_posix())
                         for ds, (cap, p) in figures.bracket_figures.items()}, findings=findings,
        scaling=scaling)
