"""What ``report.md`` says, as data: the content model that the template (``report.md.j2``)
lays out, gathered by :func:`report_content` from the report's tables, figures, runs and config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

from lmablate.config.study import StudyConfig
from lmablate.config.tune_config import TuneConfig
from lmablate.report.captions import Caption
from lmablate.report.collect import RunOutputs, present
from lmablate.report.text.bracket_section import bracket_lines
from lmablate.report.figures.report_figures import ReportFigures
from lmablate.report.headline import headline_loss
from lmablate.report.stats.statistics import (ALPHA, CONFIDENCE, METRICS, MIN_SEEDS_FOR_TEST,
                                              POWER, VERDICT_BETTER, VERDICT_FEW, VERDICT_WORSE)
from lmablate.report.tables import ReportTables
from lmablate.report.stats import arithmetic_tables
from lmablate.report.text import arithmetic_section as arith
from lmablate.report.text import dataset_tables as dt
from lmablate.report.text import findings as fi
from lmablate.report.text import samples as sm
from lmablate.report.text.limits import limits_bullets
from lmablate.report.text.lr_section import lr_section
from lmablate.report.text.methods import methods_section
from lmablate.report.text.templating import caption_text
from lmablate.report.text.scaling_section import ScalingSection


@dataclass(frozen=True)
class Figure:
    """A figure's caption and path relative to the report (None: not drawn, the caption says
    why)."""

    caption: str
    path: str | None

    @property
    def stem(self) -> str:
        """The file name without its suffix: the image's alt text."""
        return Path(self.path).stem if self.path else ""


@dataclass(frozen=True)
class DatasetFindings:
    """A dataset's part of "Findings": its lines, headline metric's label and forest plot."""

    name: str
    lines: list[str]
    metric_label: str
    forest: str | None


@dataclass(frozen=True)
class Arithmetic:
    """The lines that open an arithmetic dataset's section
    (:mod:`lmablate.report.text.arithmetic_section`)."""

    headline: list[str]
    breakdown: list[str]
    length: list[str]
    length_figure: Figure | None


@dataclass(frozen=True)
class DatasetContent:
    """One dataset's section, in the template's order: rows (column -> cell dicts, or a frame's
    records for ``_tables.md.j2``) and the Markdown lines of sub-sections, without headings."""

    name: str
    arithmetic: Arithmetic | None  # the opening blocks of an arithmetic dataset
    summary: dt.Rows
    single_seed: bool  # some cell rests on a single seed
    comparisons: dt.Rows
    compared: bool  # the dataset has comparison rows (else the better/worse line is left out)
    too_few: list[str]  # variants with too few paired seeds for a test
    better: list[str]  # "variant (metric label)"
    worse: list[str]
    problems: dt.ProblemDiagnostic | None
    tuned: dt.Rows
    lr: list[str]  # below "How each variant responds to the learning rate"
    lr_figure: Figure | None
    bracket: list[str]  # below "At the full budget: each variant's learning rate bracketed"
    bracket_figure: Figure | None
    figures: list[Figure]
    has_samples: bool
    samples: list[sm.Shown]
    has_predictions: bool
    predictions: list[sm.Shown]


@dataclass(frozen=True)
class Replication:
    """A dataset's part of "Replication" (:mod:`lmablate.report.stats.replication`)."""

    name: str
    metric_label: str
    unit: str
    replicates: int
    per_replicate: dt.Rows
    combined: dt.Rows
    spread: dt.Rows
    figure: Figure | None
    speed: dt.Rows = field(default_factory=list)


@dataclass(frozen=True)
class ReportContent:
    """Everything ``report.md`` shows (see :func:`report_content`)."""

    n_runs: int
    n_datasets: int
    n_variants: int
    n_seeds: int
    profile: str
    findings: list[DatasetFindings]
    csv_files: list[str]  # the CSV tables written next to the report, in write order
    limits: dict[str, list[str]]  # dataset -> its bullets of "What this study can and cannot say"
    scaling: ScalingSection | None  # a scaling study's "How the effects change with compute"
    methods: list[str]
    notes: list[str]
    datasets: list[DatasetContent]
    other_figures: list[Figure]
    replication: list["Replication"] = field(default_factory=list)  # with replicates
    environments: list[str] = field(default_factory=list)  # with mixed environments
    verdicts: list[str] = field(default_factory=list)  # findings.verdict_table
    tune: TuneConfig | None = None  # None: no lr or bracket sub-section to define
    confidence: float = CONFIDENCE
    alpha: float = ALPHA
    power: float = POWER  # of the minimum detectable effect
    min_seeds_for_test: int = MIN_SEEDS_FOR_TEST
    max_sample_chars: int = sm.MAX_CHARS
    n_predictions: int = sm.N_PREDICTIONS


def arithmetic(cfg: StudyConfig, runs: RunOutputs, tables: ReportTables,
               figures: ReportFigures, out_dir: Path, dataset: str) -> Arithmetic | None:
    """The blocks that open ``dataset``'s section if it is arithmetic, else None."""
    if cfg.datasets[dataset].kind != "arithmetic":
        return None
    variants = present(runs.ablation["variant"])
    digits = arithmetic_tables.training_digits(cfg.datasets[dataset], runs.by_operand_digits,
                                               dataset)
    length = figures.length_figures[dataset]
    return Arithmetic(
        headline=arith.headline_lines(tables.summary, tables.comparisons, tables.references,
                                      dataset, variants),
        breakdown=arith.breakdown_lines(runs.per_op, runs.by_answer_digits, dataset, variants),
        length=arith.length_lines(tables.length, tables.length_comparisons, dataset, digits,
                                  variants)
        if arithmetic_tables.has_length_split(runs.by_operand_digits, dataset) else [],
        length_figure=_figure(length, out_dir) if length[1] else None)


def dataset_content(cfg: StudyConfig, runs: RunOutputs, tables: ReportTables,
                    figures: ReportFigures, out_dir: Path, dataset: str) -> DatasetContent:
    """The section of ``dataset``, its figures linked relative to ``out_dir``."""
    ablation, tuned = runs.ablation, runs.tuned
    order = present(ablation["variant"])
    s = tables.summary[tables.summary["dataset"] == dataset]
    c = tables.comparisons[tables.comparisons["dataset"] == dataset]
    listing = {v: [f"{r.variant} ({METRICS[r.metric][0]})"
                   for r in c[c["verdict"] == v].itertuples()]
               for v in (VERDICT_BETTER, VERDICT_WORSE)}
    lr_figure = figures.lr_figures.get(dataset)
    return DatasetContent(
        name=dataset, arithmetic=arithmetic(cfg, runs, tables, figures, out_dir, dataset),
        summary=dt.summary_rows(
            tables.summary, dataset, order, tables.references,
            shown=(arith.headline_metrics(tables.summary, dataset)
                   if cfg.datasets[dataset].kind == "arithmetic" else ())),
        single_seed=bool(len(s) and int(s["n"].min()) < 2),
        comparisons=dt.records(tables.comparisons, dataset), compared=bool(len(c)),
        too_few=list(pd.unique(c.loc[c["verdict"] == VERDICT_FEW, "variant"])),
        better=listing[VERDICT_BETTER], worse=listing[VERDICT_WORSE],
        problems=dt.problem_diagnostic(tables.problems, dataset),
        tuned=dt.tuned_rows(ablation, dataset, order),
        lr=lr_section(cfg, tables.sensitivity, tuned, runs.trials, dataset, order,
                      has_figure=lr_figure is not None),
        lr_figure=_figure(lr_figure, out_dir),
        bracket=(bracket_lines(tuned, dataset, order)
                 if tuned is not None and "bracket_state" in tuned else []),
        bracket_figure=_figure(figures.bracket_figures.get(dataset), out_dir),
        figures=[_figure((cap, p), out_dir) for d, cap, p in figures.figures
                 if d == dataset],
        has_samples=sm.has_samples(runs, dataset, order),
        samples=sm.samples(runs, dataset, order, cfg.seeds),
        has_predictions=sm.has_predictions(runs, dataset, order),
        predictions=sm.predictions(runs, dataset, order, cfg.seeds))


def _figure(drawn: tuple[Caption | str, Path | None] | None, out_dir: Path) -> Figure | None:
    """A (caption, path) as a :class:`Figure` (path None: not drawn); None for None."""
    if drawn is None:
        return None
    caption, path = drawn
    return Figure(caption_text(caption), path and path.relative_to(out_dir).as_posix())


def dataset_findings(cfg: StudyConfig, runs: RunOutputs, tables: ReportTables,
                     figures: ReportFigures, out_dir: Path, dataset: str,
                     trends: pd.DataFrame | None) -> DatasetFindings:
    """``dataset``'s block of "Findings", with its forest plot where one was drawn."""
    order = present(runs.ablation["variant"])
    written = {p for _, _, p in figures.figures if p is not None}
    lines = fi.findings_section(
        tables.comparisons, datasets=[dataset], replication=tables.replication,
        speed_replication=tables.speed_replication, references=tables.references,
        convergence=tables.convergence, extrapolation=tables.extrapolation,
        length=tables.length,
        positions={v: cfg.model_config(v, vocab_size=1).position for v in order},
        trends=trends, success=tables.success,
        speed=(tables.speed_summary, tables.speed_comparisons), variants=order,
        ablation=runs.ablation)
    forest = out_dir / "figures" / f"forest_{dataset}.png"
    return DatasetFindings(dataset, lines, METRICS[headline_loss(tables.comparisons, dataset)][0],
                           f"figures/forest_{dataset}.png" if forest in written else None)


def report_content(cfg: StudyConfig, runs: RunOutputs, notes: Sequence[str],
                   tables: ReportTables, figures: ReportFigures, out_dir: Path,
                   environment: Mapping[str, Any] | None = None,
                   scaling: ScalingSection | None = None,
                   trends: pd.DataFrame | None = None,
                   csv_files: Sequence[str] = (),
                   environments: Sequence[str] = ()) -> ReportContent:
    """The content of ``report.md``, to be written in ``out_dir`` (figures are linked relative
    to it). ``runs``: :func:`~lmablate.report.collect.restrict_to_study`'s, their categorical
    order giving sections and rows; ``notes``: lines on runs missing or ignored; ``tables``:
    :func:`~lmablate.report.tables.compute_tables`; ``figures``: what
    :func:`~lmablate.report.figures.report_figures.draw_report_figures` drew; ``environment``:
    machine and versions; ``scaling`` and ``trends``: a scaling study's section
    (:func:`~lmablate.report.text.scaling_section.scaling_section`) and trend table;
    ``csv_files``: the CSVs written, in order; ``environments``: with
    ``study.mixed_environments``, each environment with its runs.

    Raises:
        ValueError: a figure path not under ``out_dir``.
    """
    ablation = runs.ablation
    datasets = present(ablation["dataset"])
    order = present(ablation["variant"])
    findings = [dataset_findings(cfg, runs, tables, figures, out_dir, ds, trends)
                for ds in datasets]
    sections = [dataset_content(cfg, runs, tables, figures, out_dir, ds) for ds in datasets]
    return ReportContent(
        n_runs=len(ablation), n_datasets=len(datasets),
        n_variants=ablation["variant"].nunique(), n_seeds=ablation["seed"].nunique(),
        profile=cfg.profile, findings=findings, csv_files=list(csv_files),
        verdicts=fi.verdict_table(tables.comparisons, datasets, tables.references,
                                  tables.success),
        limits=limits_bullets({d: cfg.budgets(d) for d in cfg.datasets}, ablation,
                              tables.summary, tables.comparisons, tables.problems,
                              tables.references, runs.tuned),
        scaling=scaling,
        methods=methods_section(cfg, ablation, environment, datasets, order),
        notes=list(notes),
        datasets=sections,
        other_figures=[_figure((cap, p), out_dir) for d, cap, p in figures.figures
                       if d is None],
        replication=[replication(tables, figures, out_dir, ds) for ds in datasets
                     if (tables.replication["dataset"] == ds).any()],
        environments=list(environments),
        tune=cfg.tune if any(d.lr or d.bracket for d in sections) else None)


def replication(tables: ReportTables, figures: ReportFigures, out_dir: Path,
                dataset: str) -> Replication:
    """``dataset``'s part of "Replication", its figure linked relative to ``out_dir``."""
    label, unit, _ = METRICS[headline_loss(tables.comparisons, dataset)]
    figure = figures.replication_figures.get(dataset)
    c = tables.replication[tables.replication["dataset"] == dataset]
    return Replication(
        name=dataset, metric_label=label, unit=unit, replicates=int(c["replicates"].max()),
        per_replicate=dt.records(tables.replicates, dataset),
        combined=dt.records(tables.replication, dataset),
        spread=dt.records(tables.tuning_spread, dataset),
        figure=_figure(figure, out_dir),
        speed=dt.records(tables.speed_replication, dataset))
