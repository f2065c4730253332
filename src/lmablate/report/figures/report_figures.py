"""The report's figures, drawn from its tables, each with the caption report.md gives it.

:func:`draw_report_figures` draws, per dataset in the study order, the figures of
:mod:`~lmablate.report.figures.losses` (validation curves, test loss, forest plot, loss by position,
parameters against loss, gradient flow), :mod:`~lmablate.report.figures.arithmetic_figures` (length
generalisation, scores per operation) and :mod:`~lmablate.report.figures.tuning_figure` (the
response to the learning rate), as PNG files under one folder. A figure that cannot be drawn (too
few points, nothing solved) is left out, or stands as the sentence saying why.

Each figure comes with its :class:`~lmablate.report.captions.Caption`, the name of its sentence
in ``report/templates/_captions.md.j2`` and the names that fill it; the text layer renders it.
Units in the captions: losses in nats/char (the answer loss per answer character), scores as
fractions in [0, 1].
"""

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
from lmablate.report.stats.statistics import TEXT_LOSS
from lmablate.report.stats import reference_models as refs
from lmablate.report.stats.statistics import METRICS
from lmablate.report.tables import ReportTables
from lmablate.report.stats import arithmetic_tables as arith

# (dataset or None, caption, path); path None: a figure not drawn, its caption the sentence why
Figure = tuple[str | None, Caption | str, Path | None]
CURVE_METRIC = {v: k for k, v in VALIDATION_TWIN.items()}  # val_loss -> test_loss, ...


@dataclass
class ReportFigures:
    """What :func:`draw_report_figures` drew, in the order report.md shows it."""

    # every dataset's figures, then those drawn elsewhere; path None: a figure not drawn, its
    # caption the sentence saying why
    figures: list[Figure] = field(default_factory=list)
    # dataset -> (caption, path): shown in the report's learning-rate section
    lr_figures: dict[str, tuple[Caption, Path]] = field(default_factory=dict)
    # dataset -> (caption, path): the full-budget bracket, shown in the same section
    bracket_figures: dict[str, tuple[Caption, Path]] = field(default_factory=dict)
    # arithmetic dataset -> (caption, path or None): shown in its length-generalisation lines
    length_figures: dict[str, tuple[Caption, Path | None]] = field(default_factory=dict)
    # dataset -> (caption, path): with replicates, shown in the Replication section
    replication_figures: dict[str, tuple[Caption, Path]] = field(default_factory=dict)

    def written(self) -> list[Path]:
        """The files drawn: the figures, then the learning-rate and the length figures."""
        return ([p for _, _, p in self.figures if p is not None]
                + [p for _, p in self.lr_figures.values()]
                + [p for _, p in self.bracket_figures.values()]
                + [p for _, p in self.length_figures.values() if p is not None]
                + [p for _, p in self.replication_figures.values()])


def drawn(entries: Sequence[Figure], note: str | None = None) -> list[Figure]:
    """The ``(dataset, caption, path)`` of the figures of ``entries`` that were drawn (path not
    None); for one not drawn, ``(dataset, note, None)`` when a ``note`` says why (the report
    prints the sentence where the figure would be), else nothing."""
    return [(ds, cap, p) if p is not None else (ds, note, None)
            for ds, cap, p in entries if p is not None or note]


def _dataset_figures(cfg: StudyConfig, runs: RunOutputs, tables: ReportTables, ds: str,
                     fig_dir: Path, palette: Mapping[str, tuple[float, float, float]],
                     out: ReportFigures) -> None:
    """Draw dataset ``ds``'s figures into ``fig_dir``, adding them to ``out``."""
    out.figures += _loss_figures(cfg, runs, tables, ds, fig_dir, palette)
    if cfg.datasets[ds].kind == "arithmetic":
        _arithmetic_figures(cfg, runs, tables, ds, fig_dir, palette, out)
    out.figures += _op_figures(runs, tables.references, ds, fig_dir, palette)
    _tuning_figures(runs, ds, fig_dir, palette, out)
    path = plots.plot_params_vs_loss(runs.ablation, ds, fig_dir / f"params_vs_loss_{ds}.png",
                                     palette=palette)
    out.figures += drawn([(ds, Caption.of("params_vs_loss", ds=ds), path)],
                         plots.params_too_narrow(runs.ablation, ds))


def _loss_figures(cfg: StudyConfig, runs: RunOutputs, tables: ReportTables, ds: str,
                  fig_dir: Path, palette: Mapping[str, tuple[float, float, float]]
                  ) -> list[Figure]:
    """``ds``'s figures of its headline loss: the validation curves on the compute axis, the
    loss per variant, the forest plot; and the loss by position past the context."""
    ablation, references, comparisons = runs.ablation, tables.references, tables.comparisons
    loss = headline_loss(comparisons, ds)  # the forest plot's: its band is in this loss
    h = runs.history
    # the headline's validation twin, or the validation loss of runs that did not record it
    curve = VALIDATION_TWIN[loss]
    if curve not in h or h.loc[h["dataset"] == ds, curve].isna().all():
        curve = VALIDATION_TWIN[TEXT_LOSS]
    a = ablation[ablation["dataset"] == ds]
    fpt = {str(v): float(f) for v, f in a.groupby("variant", observed=True)["flops_per_token"]
           .max().items() if pd.notna(f)} if "flops_per_token" in a else None
    name = METRICS[loss][0]
    return drawn([
        (ds, Caption.of("val_loss_curves", ds=ds, curve=plots.curve_label(curve)[0]),
         plots.plot_val_loss_curves(h, ds, fig_dir / f"val_loss_curves_{ds}.png",
                                    palette=palette,
                                    references=_references(references, ds, CURVE_METRIC[curve]),
                                    metric=curve, flops_per_token=fpt)),
        (ds, Caption.of("per_variant", ds=ds, name=name),
         plots.plot_test_loss(ablation, ds, fig_dir / f"{loss}_{ds}.png",
                              references=_references(references, ds, loss), metric=loss)),
        (ds, Caption.of("forest", ds=ds, name=name,
                        tuning_box=_has_tuning_uncertainty(comparisons, ds, loss)),
         plots.plot_forest(comparisons, ds, fig_dir / f"forest_{ds}.png", loss)),
        (ds, Caption.of("extrapolation", ds=ds),
         plots.plot_position_loss(
             tables.positions[ds], ds, cfg.for_dataset(ds).model.context_length,
             fig_dir / f"extrapolation_{ds}.png", palette=palette,
             positions={v: cfg.model_config(v, vocab_size=1).position
                        for v in present(ablation["variant"])})),
    ])


def _arithmetic_figures(cfg: StudyConfig, runs: RunOutputs, tables: ReportTables, ds: str,
                        fig_dir: Path, palette: Mapping[str, tuple[float, float, float]],
                        out: ReportFigures) -> None:
    """An arithmetic dataset's learning speed (into ``out.figures``) and length
    generalisation (``out.length_figures``: its caption, and the path or None)."""
    digits = arith.training_digits(cfg.datasets[ds], runs.by_operand_digits, ds)
    path = arith_figs.plot_length_generalisation(
        runs.by_operand_digits, ds, digits, fig_dir / f"length_generalisation_{ds}.png",
        palette=palette) if arith.has_length_split(runs.by_operand_digits, ds) else None
    out.figures += drawn([(ds, Caption.of("learning_speed", ds=ds),
                           arith_figs.plot_learning_speed(
                               tables.speed, ds, fig_dir / f"learning_speed_{ds}.png",
                               palette=palette))])
    left_out = arith.unreachable(runs.by_operand_digits, ds)
    out.length_figures[ds] = (Caption.of("length", ds=ds, left_out=tuple(left_out)), path)


def _op_figures(runs: RunOutputs, references: pd.DataFrame, ds: str, fig_dir: Path,
                palette: Mapping[str, tuple[float, float, float]]) -> list[Figure]:
    """``ds``'s exact match and character accuracy per operation, where it has them."""
    op_datasets = set(present(runs.per_op["dataset"]))
    if ds not in op_datasets:
        return []
    single = len(op_datasets) == 1  # one arithmetic dataset: no suffix in the name
    out: list[Figure] = []
    for metric in ("exact_match", "char_accuracy"):
        name = f"{metric}_by_op.png" if single else f"{metric}_by_op_{ds}.png"
        path = arith_figs.plot_by_op(runs.per_op, ds, fig_dir / name, metric,
                                     palette=palette, references=references)
        floor = ((references["dataset"] == ds) & (references["metric"] == metric)
                 & (references["reference"] == arith.FLOORS[metric])).any()
        out += drawn([(ds, Caption.of("by_op", ds=ds, name=METRICS[metric][0],
                                      floor=bool(floor)), path)],
                     arith_figs.nothing_solved(runs.per_op, ds, metric))
    return out


def _tuning_figures(runs: RunOutputs, ds: str, fig_dir: Path,
                    palette: Mapping[str, tuple[float, float, float]],
                    out: ReportFigures) -> None:
    """``ds``'s response to the learning rate (``out.lr_figures``) and full-budget bracket
    (``out.bracket_figures``), where its trials allow them."""
    path = plot_lr_response(runs.trials, runs.tuned, ds, fig_dir / f"tuning_{ds}.png",
                            palette=palette)
    if path is not None:
        out.lr_figures[ds] = (Caption.of(
            "lr_response", ds=ds, shaded=search_bounds(runs.tuned, ds) != (None, None, [])),
            path)
    path = plot_bracket(runs.trials, runs.tuned, ds, fig_dir / f"lr_bracket_{ds}.png",
                        palette=palette, order=present(runs.ablation["variant"]))
    if path is not None:
        out.bracket_figures[ds] = (Caption.of("bracket", ds=ds), path)


def draw_report_figures(cfg: StudyConfig, runs: RunOutputs, tables: ReportTables,
                        fig_dir: Path, palette: Mapping[str, tuple[float, float, float]],
                        extra: Sequence[Figure] = ()) -> ReportFigures:
    """Draw every dataset's figures as PNG files under ``fig_dir`` (replaced atomically), in
    the study's colours (``palette``: variant -> RGB in [0, 1],
    :func:`~lmablate.report.families.variant_palette`), then add ``extra``: ``(dataset or
    None, caption, path)`` of figures drawn elsewhere (attention maps, embeddings,
    :mod:`~lmablate.report.figures.model_figures`)."""
    out = ReportFigures()
    for ds in present(runs.ablation["dataset"]):
        _dataset_figures(cfg, runs, tables, ds, fig_dir, palette, out)
        path = plot_replication(tables.replicates, tables.replication, ds,
                                fig_dir / f"replication_{ds}.png")
        if path is not None:
            out.replication_figures[ds] = (Caption.of(
                "replication", ds=ds, name=METRICS[headline_loss(tables.comparisons, ds)][0]),
                path)
    out.figures += [(ds, cap, Path(p)) for ds, cap, p in extra]
    return out


def _references(references: pd.DataFrame, dataset: str, metric: str) -> dict[str, float]:
    """``label -> value`` of ``dataset``'s references in ``metric`` (``references.csv``): the
    n-gram models' test loss, the answer loss of an answer that ignores the question."""
    r = references[(references["dataset"] == dataset) & (references["metric"] == metric)]
    return {(f"{x.reference} ({refs.NGRAM_SHORT})" if metric == "test_loss" else str(x.reference)):
            float(x.value) for x in r.itertuples()}


def _has_tuning_uncertainty(comparisons: pd.DataFrame, dataset: str, metric: str) -> bool:
    """Whether a row of ``dataset`` in ``metric`` carries a tuning uncertainty (the forest
    plot then draws its dotted box)."""
    if "tuning_uncertainty" not in comparisons:
        return False
    rows = comparisons[(comparisons["dataset"] == dataset) & (comparisons["metric"] == metric)]
    return bool(pd.to_numeric(rows["tuning_uncertainty"], errors="coerce").notna().any())
