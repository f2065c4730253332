"""The report's section "How the effects change with compute" for a scaling study (a dataset with
two or more budgets in ``train.budget_flops``): its tables (:func:`scaling_tables`, written as
``scaling_*.csv`` by :func:`scaling_csvs`), its figures (:func:`draw_scaling_figures`) and its
text (:func:`scaling_section`), every number and sentence computed from the tables.

Units: compute in training FLOPs; losses in nats/char (the answer loss per answer character);
slopes in the loss's unit per decade (a factor of 10) of compute.
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
from lmablate.report.text.mdtable import interval, join_names, num, verdict_cell

# Seed 000's run (conf/profile/seed-scale.yaml's budget: 5,000 steps of 16 x 128 tokens at d_model
# 96, the posts' scale): the larger budget the fitted curves are extrapolated to
SEED_SCALE_FLOPS = 6.1023e13


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
    return {
        "scaling_fits": ("scaling_fits.csv", tables.fits, sc.FIT_COLUMNS),
        "scaling_effects": ("scaling_effects.csv", tables.effects,
                            ["budget_flops", *COMPARISON_COLUMNS]),
        "scaling_trends": ("scaling_trends.csv", tables.trends, sc.TREND_COLUMNS),
        "scaling_extrapolation": ("scaling_extrapolation.csv", tables.extrapolation,
                                  sc.EXTRAPOLATION_COLUMNS),
        "scaling_isoflop": ("scaling_isoflop.csv", tables.isoflop, iso.ISOFLOP_COLUMNS),
        "scaling_optimal_width": ("scaling_optimal_width.csv", tables.optimal,
                                  iso.OPTIMAL_COLUMNS),
    }


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


def _flops(x: float) -> str:
    return budget_label(x)


def _fit_rows(fits: pd.DataFrame, dataset: str) -> Rows:
    def with_interval(row: pd.Series, name: str, digits: int) -> str:
        if not np.isfinite(row[name]):
            return "–"
        cell = f"{row[name]:.{digits}g}"
        if np.isfinite(row[f"{name}_low"]):
            cell += f" [{row[f'{name}_low']:.{digits}g}, {row[f'{name}_high']:.{digits}g}]"
        return cell

    def e_cell(row: pd.Series) -> str:
        if row["form"] != sc.SATURATING:
            return "–"
        return "0 (at its bound)" if row["note"].startswith("E at its") else with_interval(
            row, "E", 3)

    rows = [{"variant": r["variant"], "fitted law": r["form"] or "–", "E": e_cell(r),
             "A": with_interval(r, "A", 3), "α": with_interval(r, "alpha", 3),
             "bootstrap fits": int(r["n_bootstrap"])}
            for _, r in fits[fits["dataset"] == dataset].iterrows()]
    return rows


def _trend_rows(effects: pd.DataFrame, trends: pd.DataFrame, dataset: str,
                 budgets: Sequence[float]) -> Rows:
    rows = []
    for _, t in trends[trends["dataset"] == dataset].iterrows():
        row = {"variant": t["variant"]}
        for b in budgets:
            c = effects[(effects["dataset"] == dataset) & (effects["variant"] == t["variant"])
                        & np.isclose(effects["budget_flops"].astype(float), b)]
            row[f"Δ at {_flops(b)}"] = (
                f"{num(c.iloc[0]['mean_diff'])} {interval(c.iloc[0], 3, 'ci_holm')}"
                + (f" {verdict_cell(c.iloc[0]['verdict'])}"
                   if c.iloc[0]["verdict"] in ("better", "worse") else "")) if len(c) else "–"
        row["slope per decade"] = f"{num(t['slope'])} {interval(t, 3, 'slope_holm')}"
        row["trend"] = (f"**{t['trend']}**" if t["trend"] in (sc.TREND_GROWS, sc.TREND_SHRINKS)
                        else t["trend"])
        row["curves cross at"] = (f"{_flops(t['crossing_flops'])} FLOPs"
                                  if np.isfinite(t["crossing_flops"]) else "–")
        rows.append(row)
    return rows


def _trend_sentences(trends: pd.DataFrame, dataset: str) -> list[str]:
    t = trends[trends["dataset"] == dataset]
    parts = []
    for label, meaning in ((sc.TREND_GROWS, "the difference to the baseline falls as compute "
                            "grows"),
                           (sc.TREND_SHRINKS, "the difference to the baseline rises as compute "
                            "grows"),
                           (sc.TREND_NONE, "no slope distinguishable from 0")):
        names = list(t[t["trend"] == label]["variant"].astype(str))
        if names:
            parts.append(f"{label}: {join_names(names)} ({meaning})")
    crossings = [f"{r['variant']} at about {_flops(r['crossing_flops'])} FLOPs"
                 for _, r in t.iterrows() if np.isfinite(r["crossing_flops"])]
    lines = [f"Trend of each effect: {'; '.join(parts)}." if parts else ""]
    if crossings:
        lines.append(f"The mean difference changes sign once, between two budgets, so the "
                     f"curves cross within the measured range: {join_names(crossings)}.")
    return [x for x in lines if x]


def _optimal_rows(optimal: pd.DataFrame, dataset: str, budgets: Sequence[float],
                   order: Sequence[str]) -> Rows:
    rows = []
    d = optimal[optimal["dataset"] == dataset]
    for variant in [v for v in order if (d["variant"] == v).any()]:
        row = {"variant": variant}
        for b in budgets:
            o = d[(d["variant"] == variant) & np.isclose(d["budget_flops"].astype(float), b)]
            if not len(o):
                row[f"{_flops(b)}"] = "–"
                continue
            o = o.iloc[0]
            mark = "" if o["method"] == iso.PARABOLA else "*"
            tuned = "–" if pd.isna(o["tuned_d_model"]) else int(o["tuned_d_model"])
            row[f"{_flops(b)}"] = f"{o['optimal_d_model']:.0f}{mark} (tuned {tuned})"
        rows.append(row)
    return rows


def _extrapolation_rows(extrapolation: pd.DataFrame, dataset: str) -> Rows:
    rows = [{"variant": r["variant"],
             "predicted loss": f"{num(r['predicted'])} [{num(r['predicted_low'])}, "
                               f"{num(r['predicted_high'])}]",
             f"Δ vs {BASELINE}": "–" if not np.isfinite(r["delta"]) else
             f"{num(r['delta'])}" + (f" [{num(r['delta_low'])}, {num(r['delta_high'])}]"
                                     if np.isfinite(r["delta_low"]) else "")}
            for _, r in extrapolation[extrapolation["dataset"] == dataset].iterrows()]
    return rows


@dataclass(frozen=True)
class ScalingDataset:
    """One dataset's part of the section: its headline metric's label and unit, whether the
    saturating law was fitted (else the log-log line, on ``n_budgets`` budgets), the rows of
    the fits and of the effects with their trends, and the sentences on the trends."""

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
    """The section "How the effects change with compute" as data: the opening sentence, each
    dataset's fits and trends, the compute-optimal widths (dataset -> rows), the extrapolation
    (dataset -> its paragraph and rows) and the figures' paths relative to the report (None:
    not drawn). The template (``report/templates/_scaling.md.j2``) writes the headings,
    captions and fixed paragraphs."""

    intro: str
    datasets: list[ScalingDataset]
    optimal: dict[str, Rows]
    extrapolation: dict[str, tuple[str, Rows]]
    curves_figure: str | None = None
    effects_figure: str | None = None
    isoflop_figure: str | None = None
    min_budgets_saturating: int = sc.MIN_BUDGETS_SATURATING


def scaling_section(tables: ScalingTables, runs: RunOutputs, figures: Mapping[str, Path],
                    out_dir: Path) -> ScalingSection | None:
    """The section's content (None without a scaling dataset); ``figures`` (name -> path,
    :func:`draw_scaling_figures`) linked relative to ``out_dir``."""
    if not tables.budgets:
        return None
    n_seeds = runs.scaling["seed"].nunique()
    described = "; ".join(f"{ds}: {len(b)} budgets, {join_names([_flops(x) for x in b])} FLOPs"
                          for ds, b in tables.budgets.items())
    intro = (f"Every variant was tuned (learning rate and width) and trained on {n_seeds} "
             f"seeds at each budget ({described}); the verdicts above are those of the "
             "largest. Below, per dataset, the fitted curve of each variant, the difference "
             "to the baseline at every budget (Holm-adjusted intervals, as above), the slope "
             "of that difference per decade of compute (the seeds' slopes, Holm-corrected "
             "over the variants) and what it says.")
    datasets = []
    for ds, budgets in tables.budgets.items():
        metric = tables.metric_of[ds]
        forms = set(tables.fits[tables.fits["dataset"] == ds]["form"])
        datasets.append(ScalingDataset(
            ds, METRICS[metric][0], METRICS[metric][1], sc.SATURATING in forms, len(budgets),
            _fit_rows(tables.fits, ds), _trend_rows(tables.effects, tables.trends, ds, budgets),
            _trend_sentences(tables.trends, ds)))
    optimal = ({} if tables.optimal.empty else
               {ds: _optimal_rows(tables.optimal, ds, budgets, present(runs.scaling["variant"]))
                for ds, budgets in tables.budgets.items()})
    extrapolation = {}
    for ds in (present(tables.extrapolation["dataset"]) if len(tables.extrapolation) else []):
        ex = tables.extrapolation[tables.extrapolation["dataset"] == ds]
        target = float(ex["target_flops"].iloc[0])
        factor = target / tables.budgets[ds][-1]
        caveat = ("" if (ex["form"] == sc.SATURATING).all() else
                  " A log-log line has no floor, so it predicts lower losses, and larger "
                  "gaps, than a saturating law would.")
        fits = tables.fits[(tables.fits["dataset"] == ds) & (tables.fits["form"] != "")]
        floorless = list(fits[fits["note"].str.startswith("E at its")]["variant"])
        floored = [v for v in fits["variant"] if v not in floorless]
        if floorless and floored:
            caveat += (f" The fits of {join_names(floorless)} found no floor (E at 0) and "
                       f"keep falling, while those of {join_names(floored)} level off at "
                       "their E: a predicted difference between the two groups comes from "
                       f"that difference of form, fitted on {len(tables.budgets[ds])} "
                       "budgets, more than from the data.")
        extrapolation[ds] = (
            f"The fitted curves of {ds} at {target:.3g} FLOPs (the seed scale, "
            f"{factor:,.0f}x the largest budget measured), with the 95% interval of "
            "the bootstrap over seeds (paired across variants for Δ). Nothing was "
            f"trained at this budget in this study: these numbers assume the law "
            f"holds {math.log10(factor):.1f} decades past the data, the model shape "
            f"and the rest of the setup unchanged.{caveat}",
            _extrapolation_rows(tables.extrapolation, ds))

    def link(name: str) -> str | None:
        return figures[name].relative_to(out_dir).as_posix() if name in figures else None

    return ScalingSection(intro, datasets, optimal, extrapolation, link("curves"),
                          link("effects"), link("isoflop"))


def scaling_metrics(tables: ScalingTables, runs: RunOutputs,
                    docs: Mapping[str, dict]) -> dict[str, dict]:
    """The DVC metrics files of a scaling study (``docs``:
    :func:`lmablate.report.headline.metrics_files`, relative path -> document): each
    ``<dataset>/<variant>.json`` of a scaling dataset with its ``budget_flops`` (the headline
    budget) and the ``trend`` of its effect, and a ``<dataset>/<variant>@<budget label>.json``
    per smaller budget: ``seeds``, ``budget_flops``, the mean ``test_loss`` (and headline
    loss), ``delta_<headline>`` and ``verdict`` at that budget. ``docs`` unchanged where no
    dataset has two budgets."""
    out = {name: dict(doc) for name, doc in docs.items()}
    for ds, budgets in tables.budgets.items():
        metric = tables.metric_of[ds]
        frame = runs.scaling[runs.scaling["dataset"] == ds]
        for variant in present(frame["variant"]):
            trend = tables.trends[(tables.trends["dataset"] == ds)
                                  & (tables.trends["variant"] == variant)]
            for budget in budgets:
                v = frame[(frame["variant"] == variant)
                          & np.isclose(frame["budget_flops"].astype(float), budget)]
                c = tables.effects[(tables.effects["dataset"] == ds)
                                   & (tables.effects["variant"] == variant)
                                   & np.isclose(tables.effects["budget_flops"].astype(float),
                                                budget)]
                if budget == budgets[-1]:
                    doc = out.setdefault(f"{ds}/{variant}.json", {})
                    doc["budget_flops"] = budget
                    if variant != BASELINE:
                        doc["trend"] = str(trend["trend"].iloc[0]) if len(trend) else "–"
                    continue
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
