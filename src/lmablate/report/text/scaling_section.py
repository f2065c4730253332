"""The section "How the effects change with compute" of a scaling study (a dataset with two or
more budgets in ``train.budget_flops``): its tables, CSVs, figures and content. Compute in
training FLOPs; losses in nats/char; slopes in the loss's unit per decade of compute.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from lmablate.config.study import StudyConfig, budget_label
from lmablate.report.collect import BASELINE, RunOutputs, present
from lmablate.report.figures import scaling_figures as figs
from lmablate.report.headline import headline_loss
from lmablate.report.stats import isoflop as iso
from lmablate.report.stats import scaling as sc
from lmablate.report.stats.statistics import COMPARISON_COLUMNS, METRICS
from lmablate.report.text.dataset_tables import Rows
from lmablate.report.text.templating import macro_text

# Seed 000's run (conf/profile/seed-scale.yaml's budget: 5,000 steps of 16 x 128 tokens at d_model
# 96, the posts' scale): the larger budget the fitted curves are extrapolated to
SEED_SCALE_FLOPS = 6.1023e13
SCALING = "_scaling.md.j2"  # the section, and its sentences as macros


@dataclass(frozen=True, eq=False)
class ScalingTables:
    """A scaling study's tables (:mod:`lmablate.report.stats.scaling`, :mod:`~lmablate.report.
    stats.isoflop`); empty frames where no dataset has two budgets. ``resamples``: the bootstrap's
    ``(E, A, alpha)`` per (dataset, variant)."""

    fits: pd.DataFrame
    resamples: dict[tuple[str, str], np.ndarray]
    effects: pd.DataFrame
    trends: pd.DataFrame
    extrapolation: pd.DataFrame
    isoflop: pd.DataFrame
    optimal: pd.DataFrame
    metric_of: dict[str, str]
    budgets: dict[str, list[float]]


def scaling_tables(cfg: StudyConfig, runs: RunOutputs) -> ScalingTables:
    """The tables of every dataset of ``runs.scaling`` with two or more budgets, on its
    headline loss (:func:`lmablate.report.headline.headline_loss`), extrapolated to
    :data:`SEED_SCALE_FLOPS` where that lies beyond its largest budget."""
    scaling = runs.scaling
    budgets = {ds: sorted(float(b) for b in scaling[scaling["dataset"] == ds]["budget_flops"]
                          .dropna().unique()) for ds in present(scaling["dataset"])}
    multi = [ds for ds, b in budgets.items() if len(b) >= 2]
    frame = scaling[scaling["dataset"].isin(multi)]
    metric_of = {ds: headline_loss(runs.ablation, ds) for ds in multi}
    fits, resamples = sc.fit_curves(frame, metric_of)
    targets = {ds: SEED_SCALE_FLOPS for ds in multi if SEED_SCALE_FLOPS > budgets[ds][-1]}
    trials = runs.scaling_trials
    trials = trials[trials["dataset"].isin(multi)] if not trials.empty else trials
    points = iso.isoflop_points(trials)
    return ScalingTables(
        fits=fits, resamples=resamples, effects=sc.effects_by_budget(frame, metric_of),
        trends=sc.effect_trends(frame, metric_of),
        extrapolation=sc.extrapolate(fits, resamples, targets), isoflop=points,
        optimal=iso.optimal_widths(points, runs.scaling_tuned), metric_of=metric_of,
        budgets={ds: budgets[ds] for ds in multi})


def scaling_csvs(tables: ScalingTables) -> dict[str, tuple[str, pd.DataFrame, list[str]]]:
    """``name -> (file, frame, columns)`` of the section's CSVs, written whatever the study
    (empty, with their header, without a scaling dataset)."""
    return {name: (f"{name}.csv", frame, columns) for name, frame, columns in (
        ("scaling_fits", tables.fits, sc.FIT_COLUMNS),
        ("scaling_effects", tables.effects, ["budget_flops", *COMPARISON_COLUMNS]),
        ("scaling_trends", tables.trends, sc.TREND_COLUMNS),
        ("scaling_extrapolation", tables.extrapolation, sc.EXTRAPOLATION_COLUMNS),
        ("scaling_isoflop", tables.isoflop, iso.ISOFLOP_COLUMNS),
        ("scaling_optimal_width", tables.optimal, iso.OPTIMAL_COLUMNS))}


def draw_scaling_figures(tables: ScalingTables, runs: RunOutputs, fig_dir: Path,
                         palette: Mapping[str, Any]) -> dict[str, Path]:
    """Draw the section's figures under ``fig_dir``: ``{"curves", "effects", "isoflop"}`` ->
    path, for those drawn (none without a scaling dataset)."""
    if not tables.budgets:
        return {}
    scaling = runs.scaling[runs.scaling["dataset"].isin(list(tables.budgets))]
    drawn = {
        "curves": figs.plot_scaling_curves(fig_dir / "scaling_curves.png", scaling,
                                           tables.fits, tables.resamples, tables.metric_of,
                                           palette),
        "effects": figs.plot_effect_trends(fig_dir / "scaling_effects.png", tables.effects,
                                           palette),
        "isoflop": figs.plot_isoflop(fig_dir / "scaling_isoflop.png", tables.isoflop,
                                     tables.optimal, present(scaling["variant"])),
    }
    return {k: p for k, p in drawn.items() if p is not None}


def _at(frame: pd.DataFrame, budget: float) -> pd.DataFrame:
    return frame[np.isclose(frame["budget_flops"].astype(float), budget)]


def _by_budget(frame: pd.DataFrame, budgets: Sequence[float]) -> list[tuple[str, dict | None]]:
    """(budget label, ``frame``'s first row at that budget, or None) for each budget."""
    return [(budget_label(b), at.iloc[0].to_dict() if len(at := _at(frame, b)) else None)
            for b in budgets]


def _trend_rows(effects: pd.DataFrame, trends: pd.DataFrame, budgets: Sequence[float]) -> Rows:
    """Each trend's row, with ``effects``: the variant's comparison at each budget."""
    return [dict(t, effects=_by_budget(effects[effects["variant"] == t["variant"]], budgets),
                 marked=t["trend"] in (sc.TREND_GROWS, sc.TREND_SHRINKS),
                 crossing=budget_label(t["crossing_flops"])
                 if np.isfinite(t["crossing_flops"]) else None)
            for t in trends.to_dict("records")]


def _trend_sentences(t: pd.DataFrame) -> list[str]:
    groups = [(label, list(t[t["trend"] == label]["variant"].astype(str)), key)
              for label, key in ((sc.TREND_GROWS, "falls"), (sc.TREND_SHRINKS, "rises"),
                                 (sc.TREND_NONE, None))]
    crossings = [(r["variant"], budget_label(r["crossing_flops"]))
                 for _, r in t.iterrows() if np.isfinite(r["crossing_flops"])]
    text = macro_text(SCALING, "trend_sentences", groups=[g for g in groups if g[1]],
                      crossings=crossings)
    return [x for x in text.split("\n") if x]


def _optimal_rows(d: pd.DataFrame, budgets: Sequence[float], order: Sequence[str]) -> Rows:
    """A row per variant: ``cells``, its optimal width's row at each budget (or None)."""
    d = d.assign(vertex=d["method"] == iso.PARABOLA)
    return [{"variant": v, "cells": _by_budget(d[d["variant"] == v], budgets)}
            for v in order if (d["variant"] == v).any()]


@dataclass(frozen=True)
class ScalingDataset:
    """One dataset's part of the section: its headline metric's label and unit, whether the
    saturating law was fitted (else the log-log line, on ``n_budgets`` budgets), the rows of
    ``scaling_fits.csv`` (and whether each is ``saturating`` and has E ``at_bound``) and of
    ``scaling_trends.csv`` (:func:`_trend_rows`), and the sentences on the trends."""

    name: str
    metric_label: str
    unit: str
    saturating: bool
    n_budgets: int
    fits: Rows
    trends: Rows
    trend_sentences: list[str]


@dataclass(frozen=True)
class ScalingSection:
    """The section as data: the opening sentence, each dataset's fits and trends, the
    compute-optimal widths (dataset -> :func:`_optimal_rows`), the extrapolation (dataset -> its
    paragraph and rows of ``scaling_extrapolation.csv``) and the figures' paths relative to the
    report (None: not drawn); ``_scaling.md.j2`` writes the headings, tables and fixed
    paragraphs."""

    intro: str
    datasets: list[ScalingDataset]
    optimal: dict[str, Rows]
    extrapolation: dict[str, tuple[str, Rows]]
    curves_figure: str | None = None
    effects_figure: str | None = None
    isoflop_figure: str | None = None
    min_budgets_saturating: int = sc.MIN_BUDGETS_SATURATING


def _extrapolation(tables: ScalingTables, ds: str) -> tuple[str, Rows]:
    """The paragraph and rows of ``ds``'s extrapolation to the seed scale."""
    ex = tables.extrapolation[tables.extrapolation["dataset"] == ds]
    target = float(ex["target_flops"].iloc[0])
    factor = target / tables.budgets[ds][-1]
    fits = tables.fits[(tables.fits["dataset"] == ds) & (tables.fits["form"] != "")]
    floorless = list(fits[fits["note"].str.startswith("E at its")]["variant"])
    return macro_text(
        SCALING, "extrapolation", ds=ds, target=target, factor=factor,
        decades=math.log10(factor), loglog=not (ex["form"] == sc.SATURATING).all(),
        floorless=floorless, floored=[v for v in fits["variant"] if v not in floorless],
        n_budgets=len(tables.budgets[ds])), ex.to_dict("records")


def scaling_section(tables: ScalingTables, runs: RunOutputs, figures: Mapping[str, Path],
                    out_dir: Path) -> ScalingSection | None:
    """The section's content (None without a scaling dataset); ``figures`` (name -> path,
    :func:`draw_scaling_figures`) linked relative to ``out_dir``."""
    if not tables.budgets:
        return None
    intro = macro_text(SCALING, "intro", n_seeds=runs.scaling["seed"].nunique(), budgets=[
        (ds, [budget_label(x) for x in b]) for ds, b in tables.budgets.items()])
    datasets = []
    for ds, budgets in tables.budgets.items():
        label, unit, _ = METRICS[tables.metric_of[ds]]
        fits = tables.fits[tables.fits["dataset"] == ds]
        trends = tables.trends[tables.trends["dataset"] == ds]
        datasets.append(ScalingDataset(
            ds, label, unit, sc.SATURATING in set(fits["form"]), len(budgets),
            [dict(r, saturating=r["form"] == sc.SATURATING, at_bound=r["note"].startswith(
                "E at its")) for r in fits.to_dict("records")],
            _trend_rows(tables.effects[tables.effects["dataset"] == ds], trends, budgets),
            _trend_sentences(trends)))
    order = present(runs.scaling["variant"])
    optimal = {ds: _optimal_rows(tables.optimal[tables.optimal["dataset"] == ds], b, order)
               for ds, b in tables.budgets.items()} if len(tables.optimal) else {}
    extrapolation = {ds: _extrapolation(tables, ds) for ds in
                     (present(tables.extrapolation["dataset"]) if len(tables.extrapolation)
                      else [])}

    def link(name: str) -> str | None:
        return figures[name].relative_to(out_dir).as_posix() if name in figures else None

    return ScalingSection(intro, datasets, optimal, extrapolation, link("curves"),
                          link("effects"), link("isoflop"))


def scaling_metrics(tables: ScalingTables, runs: RunOutputs,
                    docs: Mapping[str, dict]) -> dict[str, dict]:
    """The DVC metrics files (``docs``: :func:`lmablate.report.headline.metrics_files`, path ->
    document) with a scaling dataset's budgets: each ``<dataset>/<variant>.json`` gets its
    ``budget_flops`` and its effect's ``trend``, and each smaller budget a
    ``<dataset>/<variant>@<budget label>.json`` (``seeds``, ``budget_flops``, mean
    ``test_loss`` and headline loss, ``delta_<headline>``, ``verdict``)."""
    out = {name: dict(doc) for name, doc in docs.items()}
    for ds, budgets in tables.budgets.items():
        metric = tables.metric_of[ds]
        frame = runs.scaling[runs.scaling["dataset"] == ds]
        for variant in present(frame["variant"]):
            trend = tables.trends[(tables.trends["dataset"] == ds)
                                  & (tables.trends["variant"] == variant)]
            doc = out.setdefault(f"{ds}/{variant}.json", {})
            doc["budget_flops"] = budgets[-1]
            if variant != BASELINE:
                doc["trend"] = str(trend["trend"].iloc[0]) if len(trend) else "–"
            effects = tables.effects[(tables.effects["dataset"] == ds)
                                     & (tables.effects["variant"] == variant)]
            for budget in budgets[:-1]:
                v, c = _at(frame[frame["variant"] == variant], budget), _at(effects, budget)
                doc = {"seeds": int(v["seed"].nunique()), "budget_flops": budget,
                       "test_loss": float(v["test_loss"].mean())}
                if metric != "test_loss":
                    doc[metric] = float(v[metric].mean())
                doc.update({f"delta_{metric}": 0.0, "verdict": "baseline"}
                           if variant == BASELINE else
                           {f"delta_{metric}": float(c["mean_diff"].iloc[0]),
                            "verdict": str(c["verdict"].iloc[0])} if len(c) else {})
                out[f"{ds}/{variant}@{budget_label(budget)}.json"] = doc
    return out
