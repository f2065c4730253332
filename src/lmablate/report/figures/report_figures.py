"""Every figure of the report, each with its :class:`~lmablate.report.captions.Caption`; a
figure that cannot be drawn is left out or stands as the sentence saying why."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import pandas as pd

from lmablate.config.study import StudyConfig
from lmablate.report.captions import Caption
from lmablate.report.collect import RunOutputs, present
from lmablate.report.figures import arithmetic_figures as arith_figs
from lmablate.report.figures import losses as plots
from lmablate.report.figures.bracket_figure import plot_bracket
from lmablate.report.figures.replication_figure import plot_replication
from lmablate.report.figures.tuning_figure import plot_lr_response, search_bounds
from lmablate.report.headline import VALIDATION_TWIN, headline_loss
from lmablate.report.stats import arithmetic_tables as arith
from lmablate.report.stats import reference_models as refs
from lmablate.report.stats.statistics import METRICS, TEXT_LOSS
from lmablate.report.tables import ReportTables

# (dataset or None, caption, path); path None: a figure not drawn, its caption the sentence why
Figure = tuple[str | None, Caption | str, Path | None]
Palette = Mapping[str, tuple[float, float, float]]
CURVE_METRIC = {v: k for k, v in VALIDATION_TWIN.items()}  # val_loss -> test_loss, ...


@dataclass
class ReportFigures:
    """What :func:`draw_report_figures` drew, in report.md's order; each ``dataset ->
    (caption, path)`` dict is shown in its own section (a length figure's path may be None)."""

    figures: list[Figure] = field(default_factory=list)  # every dataset's, then the extra ones
    lr_figures: dict[str, tuple[Caption, Path]] = field(default_factory=dict)
    bracket_figures: dict[str, tuple[Caption, Path]] = field(default_factory=dict)
    length_figures: dict[str, tuple[Caption, Path | None]] = field(default_factory=dict)
    replication_figures: dict[str, tuple[Caption, Path]] = field(default_factory=dict)

    def written(self) -> list[Path]:
        """The files drawn: the figures, then the lr, bracket, length and replication ones."""
        return ([p for _, _, p in self.figures if p is not None]
                + [p for d in (self.lr_figures, self.bracket_figures, self.length_figures,
                               self.replication_figures) for _, p in d.values() if p is not None])


def drawn(entries: Sequence[Figure], note: str | None = None) -> list[Figure]:
    """The ``entries`` drawn (path not None); one not drawn becomes ``(dataset, note, None)``
    when a ``note`` says why, else is left out."""
    return [(ds, cap, p) if p is not None else (ds, note, None)
            for ds, cap, p in entries if p is not None or note]


def _loss_figures(cfg: StudyConfig, runs: RunOutputs, tables: ReportTables, ds: str,
                  fig_dir: Path, palette: Palette) -> list[Figure]:
    """The validation curves (on the compute axis), the headline loss per variant, the forest
    plot and the loss by position."""
    ablation, references, comparisons = runs.ablation, tables.references, tables.comparisons
    loss = headline_loss(comparisons, ds)
    h = runs.history
    # the headline's validation twin, or the validation loss of runs that did not record it
    curve = VALIDATION_TWIN[loss]
    if curve not in h or h.loc[h["dataset"] == ds, curve].isna().all():
        curve = VALIDATION_TWIN[TEXT_LOSS]
    a = ablation[ablation["dataset"] == ds]
    fpt = {str(v): float(f) for v, f in a.groupby("variant", observed=True)["flops_per_token"]
           .max().items() if pd.notna(f)} if "flops_per_token" in a else None
    name = METRICS[loss][0]
    rows = comparisons[(comparisons["dataset"] == ds) & (comparisons["metric"] == loss)]
    box = "tuning_uncertainty" in comparisons and bool(
        pd.to_numeric(rows["tuning_uncertainty"], errors="coerce").notna().any())
    return drawn([
        (ds, Caption.of("val_loss_curves", ds=ds, curve=plots.curve_label(curve)[0]),
         plots.plot_val_loss_curves(h, ds, fig_dir / f"val_loss_curves_{ds}.png",
                                    palette=palette,
                                    references=_references(references, ds, CURVE_METRIC[curve]),
                                    metric=curve, flops_per_token=fpt)),
        (ds, Caption.of("per_variant", ds=ds, name=name),
         plots.plot_test_loss(ablation, ds, fig_dir / f"{loss}_{ds}.png",
                              references=_references(references, ds, loss), metric=loss)),
        (ds, Caption.of("forest", ds=ds, name=name, tuning_box=box),
         plots.plot_forest(comparisons, ds, fig_dir / f"forest_{ds}.png", loss)),
        (ds, Caption.of("extrapolation", ds=ds),
         plots.plot_position_loss(
             tables.positions[ds], ds, cfg.for_dataset(ds).model.context_length,
             fig_dir / f"extrapolation_{ds}.png", palette=palette,
             positions={v: cfg.model_config(v, vocab_size=1).position
                        for v in present(ablation["variant"])})),
    ])


def _op_figures(runs: RunOutputs, references: pd.DataFrame, ds: str, fig_dir: Path,
                palette: Palette) -> list[Figure]:
    """Exact match and character accuracy per operation, where ``ds`` has them."""
    op_datasets = set(present(runs.per_op["dataset"]))
    if ds not in op_datasets:
        return []
    out: list[Figure] = []
    for metric in ("exact_match", "char_accuracy"):
        # one arithmetic dataset: no suffix in the name
        name = f"{metric}_by_op.png" if len(op_datasets) == 1 else f"{metric}_by_op_{ds}.png"
        path = arith_figs.plot_by_op(runs.per_op, ds, fig_dir / name, metric,
                                     palette=palette, references=references)
        floor = ((references["dataset"] == ds) & (references["metric"] == metric)
                 & (references["reference"] == arith.FLOORS[metric])).any()
        out += drawn([(ds, Caption.of("by_op", ds=ds, name=METRICS[metric][0],
                                      floor=bool(floor)), path)],
                     arith_figs.nothing_solved(runs.per_op, ds, metric))
    return out


def draw_report_figures(cfg: StudyConfig, runs: RunOutputs, tables: ReportTables, fig_dir: Path,
                        palette: Palette, extra: Sequence[Figure] = ()) -> ReportFigures:
    """Draw every dataset's figures as PNG files under ``fig_dir`` in the study's colours
    (``palette``: variant -> RGB in [0, 1], :func:`~lmablate.report.families.variant_palette`),
    then add ``extra``, the ``(dataset or None, caption, path)`` of figures drawn elsewhere
    (:mod:`~lmablate.report.figures.model_figures`)."""
    out = ReportFigures()
    for ds in present(runs.ablation["dataset"]):
        out.figures += _loss_figures(cfg, runs, tables, ds, fig_dir, palette)
        if cfg.datasets[ds].kind == "arithmetic":
            by_digits = runs.by_operand_digits
            digits = arith.training_digits(cfg.datasets[ds], by_digits, ds)
            path = arith_figs.plot_length_generalisation(
                by_digits, ds, digits, fig_dir / f"length_generalisation_{ds}.png",
                palette=palette) if arith.has_length_split(by_digits, ds) else None
            out.figures += drawn([(ds, Caption.of("learning_speed", ds=ds),
                                   arith_figs.plot_learning_speed(
                                       tables.speed, ds, fig_dir / f"learning_speed_{ds}.png",
                                       palette=palette))])
            left_out = tuple(arith.unreachable(by_digits, ds))
            out.length_figures[ds] = (Caption.of("length", ds=ds, left_out=left_out), path)
        out.figures += _op_figures(runs, tables.references, ds, fig_dir, palette)
        if (path := plot_lr_response(runs.trials, runs.tuned, ds, fig_dir / f"tuning_{ds}.png",
                                     palette=palette)) is not None:
            shaded = search_bounds(runs.tuned, ds) != (None, None, [])
            out.lr_figures[ds] = (Caption.of("lr_response", ds=ds, shaded=shaded), path)
        if (path := plot_bracket(runs.trials, runs.tuned, ds, fig_dir / f"lr_bracket_{ds}.png",
                                 palette=palette, order=present(runs.ablation["variant"]))):
            out.bracket_figures[ds] = (Caption.of("bracket", ds=ds), path)
        path = plots.plot_params_vs_loss(runs.ablation, ds, fig_dir / f"params_vs_loss_{ds}.png",
                                         palette=palette)
        out.figures += drawn([(ds, Caption.of("params_vs_loss", ds=ds), path)],
                             plots.params_too_narrow(runs.ablation, ds))
        if (path := plot_replication(tables.replicates, tables.replication, ds,
                                     fig_dir / f"replication_{ds}.png")) is not None:
            name = METRICS[headline_loss(tables.comparisons, ds)][0]
            out.replication_figures[ds] = (Caption.of("replication", ds=ds, name=name), path)
    out.figures += [(ds, cap, Path(p)) for ds, cap, p in extra]
    return out


def _references(references: pd.DataFrame, dataset: str, metric: str) -> dict[str, float]:
    """``label -> value`` of ``dataset``'s references in ``metric`` (``references.csv``)."""
    r = references[(references["dataset"] == dataset) & (references["metric"] == metric)]
    return {(f"{x.reference} ({refs.NGRAM_SHORT})" if metric == "test_loss" else str(x.reference)):
            float(x.value) for x in r.itertuples()}
