"""Stage ``report``: the study's tables, statistics, figures and ``report.md``.

Reads what the train/evaluate/tune stages wrote under ``runs/<dataset>/<variant>/`` (and the
first-seed checkpoints and the tokenized test splits, for the model figures) and writes, under
``out_dir`` (normally ``reports/``):

* ``ablation.csv``   one row per dataset x variant x seed
  (:data:`~lmablate.analysis.collect.ABLATION_COLUMNS`).
* ``summary.csv``    *long* format, one row per dataset x variant x metric
  (:data:`~lmablate.analysis.statistics.SUMMARY_COLUMNS`): number of seeds, mean, sample SD and
  a two-sided 95% Student-t interval of the mean. Long rather than wide so every metric has the
  same five statistics, a metric that does not apply (exact match on Shakespeare) simply has no
  row, and the file is one ``pivot`` away from any wide table.
* ``comparisons.csv`` every variant against ``baseline``, paired by seed
  (:data:`~lmablate.analysis.statistics.COMPARISON_COLUMNS`): paired t-test and Holm's
  step-down correction within each dataset x metric.
* ``problem_comparisons.csv`` arithmetic variants against the baseline problem by problem
  (:data:`~lmablate.analysis.problems.PROBLEM_COLUMNS`): counts solved, sign-flip test, Holm.
* ``detectable_effects.csv`` per dataset x metric, the smallest difference the study could
  detect (:data:`~lmablate.analysis.statistics.DETECTABLE_COLUMNS`).
* ``references.csv`` reference points computed from the data (:data:`REFERENCE_COLUMNS`):
  n-gram cross-entropies of the test split, and constant answers to the arithmetic problems.
* ``tuned.csv`` what tuning chose per dataset x variant, with its range-edge flags
  (:data:`~lmablate.analysis.collect.TUNED_COLUMNS`).
* ``lr_sensitivity.csv`` per dataset x variant, the learning-rate sensitivity of its tuning's
  shared design (:data:`~lmablate.analysis.sensitivity.SENSITIVITY_COLUMNS`, Wortsman et al.
  2023), with the loss at initialisation it uses (:func:`uniform_losses`).
* ``metrics/<dataset>/<variant>.json`` the study-level DVC metrics, and ``metrics/<dataset>.json``
  each dataset's verdicts, both in the dataset's headline loss (:mod:`lmablate.analysis.headline`:
  ``study_metrics``, ``dataset_verdicts``; the answer loss on arithmetic).
* ``curves/<dataset>.csv`` each variant's mean validation curve (:func:`mean_curves`), the data
  of ``dvc plots show``.
* ``tuning_variation.csv`` the re-tunings (``runs/<dataset>/<variant>/replicate_<N>/``)
  against their variant, paired by seed
  (:data:`~lmablate.analysis.statistics.TUNING_VARIATION_COLUMNS`): how much a result owes to
  the tuner's sampler seed.
* ``extrapolation.csv``, ``extrapolation_comparisons.csv``, ``extrapolation_positions.csv``
  length extrapolation (:mod:`lmablate.analysis.extrapolation`): the test loss at each multiple
  of the context, its comparison with ``rope``, and the loss by position bucket.
* ``length_generalisation.csv``, ``length_generalisation_comparisons.csv`` arithmetic exact
  match by operand length and its comparison with the baseline at each length
  (:mod:`lmablate.analysis.arithmetic`).
* ``figures/*.png``  the seaborn figures of :mod:`lmablate.analysis.figures`,
  :mod:`~lmablate.analysis.tuning_figure` and :mod:`~lmablate.analysis.arithmetic_figures`,
  plus the last layer's attention maps and a PCA of the token embeddings drawn from the
  checkpoints (:mod:`~lmablate.analysis.model_figures`).
* ``report.md``      the human-readable report (:mod:`lmablate.analysis.markdown`).

Rows of every table follow the study order (datasets as configured, baseline first, then the
configured variants), set once by :func:`lmablate.analysis.collect.restrict_to_study`. The
report and the tables are then logged as artifacts of an MLflow summary run.

Units: losses are natural-log cross-entropy per character token (nats/char), the answer loss
per answer character; bits per char = loss / ln 2; perplexity = exp(loss); accuracies are
fractions in [0, 1]; times in seconds.
"""

from __future__ import annotations

import argparse
import os
import platform
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from lmablate import fileio
from lmablate.analysis import figures as plots
from lmablate.analysis.model_figures import draw_model_figures
from lmablate.analysis.tuning_figure import plot_lr_response, search_bounds
from lmablate.analysis.collect import (ABLATION_COLUMNS, BASELINE, TUNED_COLUMNS, RunOutputs,
                                       collect, present, restrict_to_study, variant_order)
from lmablate.analysis import arithmetic as arith
from lmablate.analysis import arithmetic_figures as arith_figs
from lmablate.analysis import extrapolation as ex
from lmablate.analysis import findings as fi
from lmablate.analysis.curves import CURVE_COLUMNS, mean_curves
from lmablate.analysis.families import hex_colours, study_palette
from lmablate.analysis.headline import dataset_verdicts, headline_loss, study_metrics
from lmablate.analysis.limits import tuning_luck
from lmablate.analysis.markdown import render_markdown
from lmablate.analysis.sensitivity import SENSITIVITY_COLUMNS, lr_sensitivity
from lmablate.analysis.problems import PROBLEM_COLUMNS, compare_problems
from lmablate.analysis.statistics import (DETECTABLE_COLUMNS, METRICS,
                                          TUNING_VARIATION_COLUMNS, compare,
                                          detectable_effects, summarise, tuning_variation)
from lmablate import references as refs
from lmablate.config import StudyConfig
from lmablate.tokenizer import load_split, load_tokenizer
from lmablate.tracking import NullTracker, make_tracker

REFERENCE_COLUMNS = ["dataset", "reference", "metric", "value", "detail"]


def reference_table(cfg: StudyConfig, tokens_dir: Path, runs: RunOutputs) -> pd.DataFrame:
    """Reference points computed from the data, one row per dataset x reference x metric.

    * Every dataset: the unigram, bigram and trigram cross-entropy (nats/char) of its test
      split under counts of its train split (:func:`lmablate.references.ngram_references`,
      smoothing :data:`lmablate.references.NGRAM_SMOOTHING`), metric ``test_loss``.
    * Arithmetic: answers that ignore the question, scored on the decoded test problems (the
      baseline's first seed's targets, the same for every variant)
      (:func:`lmablate.analysis.arithmetic.answer_references`): all zeros, the best constant
      answer for character accuracy (the per-position mode) and for exact match (the most
      frequent answer), metrics ``char_accuracy`` and ``exact_match`` as fractions, ``detail``
      the answer as written (reversed, as the model writes it); and the answer-position floor
      from the train split's answers, metric ``answer_loss`` in nats per answer character.

    Returns:
        Columns :data:`REFERENCE_COLUMNS`.

    Raises:
        FileNotFoundError / TokenizerError: a dataset's tokens are missing under ``tokens_dir``.
        DataError: an arithmetic train split does not cut into problems of its ``line_length``.
    """
    rows = []
    for dataset, ds in cfg.datasets.items():
        tok = load_tokenizer(tokens_dir / dataset)
        train = np.asarray(load_split(tokens_dir / dataset, "train"))
        test = np.asarray(load_split(tokens_dir / dataset, "test"))
        for name, value in refs.ngram_references(train, test, tok.vocab_size).items():
            rows.append({"dataset": dataset, "reference": name, "metric": "test_loss",
                         "value": value, "detail": refs.NGRAM_SMOOTHING})
        by_seed = runs.predictions.get((dataset, BASELINE)) or {}
        first = next((v for v in by_seed.values() if v), None)
        if ds.kind == "arithmetic" and first:
            rows += arith.answer_references(dataset, tokens_dir / dataset,
                                            [str(p["target"]) for p in first])
    return pd.DataFrame(rows, columns=REFERENCE_COLUMNS)


def uniform_losses(cfg: StudyConfig, tokens_dir: Path | None) -> dict[str, float]:
    """dataset -> the loss of the uniform prediction over its vocabulary, ``ln(vocab_size)``
    in nats/char (:func:`lmablate.references.uniform_cross_entropy`), the vocabulary read from
    the tokenizer under ``tokens_dir`` as :func:`reference_table` reads it; empty when
    ``tokens_dir`` is None.

    Raises:
        FileNotFoundError / TokenizerError: a dataset's tokenizer is missing under
            ``tokens_dir``.
    """
    if tokens_dir is None:
        return {}
    return {ds: refs.uniform_cross_entropy(load_tokenizer(Path(tokens_dir) / ds).vocab_size)
            for ds in cfg.datasets}


def environment() -> dict:
    """Hardware and software the study ran on, for the methodology paragraph."""
    gpu = f", GPU {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ", no GPU"
    return {"hardware": f"{os.cpu_count()} CPU cores ({platform.machine()}){gpu}",
            "torch": torch.__version__, "python": platform.python_version(),
            "platform": platform.platform(terse=True)}


def _drawn(entries: Sequence[tuple[str | None, str, Path | None]], note: str | None = None
           ) -> list[tuple[str | None, str, Path | None]]:
    """The ``(dataset, caption, path)`` of the figures of ``entries`` that were drawn (path not
    None); for one not drawn, ``(dataset, note, None)`` when a ``note`` says why (the report
    prints the sentence where the figure would be), else nothing."""
    return [(ds, cap, p) if p is not None else (ds, note, None)
            for ds, cap, p in entries if p is not None or note]


def build_report(cfg: StudyConfig, runs_dir: Path, out_dir: Path,
                 environment: dict | None = None,
                 extra_figures: Sequence[tuple[str | None, str, Path]] = (),
                 tokens_dir: Path | None = None) -> dict:
    """Collect the runs, compute statistics, draw figures and write the report.

    Args:
        cfg: the study config; its datasets, variants and seeds select the runs (others under
            ``runs_dir`` are ignored and listed in the report) and its settings are written into
            the methodology paragraph.
        runs_dir: the ``runs/`` tree (``<dataset>/<variant>/metrics.json`` etc.).
        out_dir: where to write (created if needed); existing files are replaced atomically.
        environment: free-form facts for the methodology paragraph, e.g. ``{"hardware": "1x
            H100", "torch": "2.13.0", "python": "3.11.9", "wall_seconds": {"tune": 812.0}}``;
            the keys ``hardware``/``device`` and ``torch``/``torch_version`` are used in the
            prose, every key is listed.
        extra_figures: ``(dataset or None, caption, path under out_dir)`` of figures drawn
            elsewhere (from checkpoints: attention maps, embeddings) to embed in the report.
        tokens_dir: the tokenized datasets (``<tokens_dir>/<dataset>/``), for the reference
            points (:func:`reference_table`) and the loss at initialisation of the
            learning-rate sensitivity (:func:`uniform_losses`); None leaves them out (empty
            references.csv, no sensitivity).

    Returns:
        ``{"report", "ablation", "summary", "comparisons", "problem_comparisons",
        "detectable_effects", "references", "tuned", "lr_sensitivity", "tuning_variation",
        "extrapolation", "extrapolation_comparisons", "extrapolation_positions",
        "length_generalisation", "length_generalisation_comparisons", "metrics", "curves":
        Path, "figures": [Path, ...]}``.

    Raises:
        FileNotFoundError: no ``metrics.json`` of the configured study under ``runs_dir``.
    """
    runs_dir, out_dir = Path(runs_dir), Path(out_dir)
    runs, notes = restrict_to_study(cfg, collect(runs_dir))
    ablation = runs.ablation
    if ablation.empty:
        raise FileNotFoundError(
            f"report: no results of the configured study under {runs_dir} (expected "
            f"<dataset>/<variant>/metrics.json for datasets {', '.join(cfg.datasets)})")
    summary = summarise(ablation)
    comparisons = compare(ablation, baseline=BASELINE)
    problems = compare_problems(runs.predictions, baseline=BASELINE,
                                variants=present(ablation["variant"]))
    detectable = detectable_effects(comparisons)
    variation = tuning_variation(ablation, runs.replicates)
    references = (reference_table(cfg, tokens_dir, runs) if tokens_dir is not None
                  else pd.DataFrame(columns=REFERENCE_COLUMNS))
    extrapolation = (ex.extrapolation_table(runs.extrapolation),
                     ex.extrapolation_comparisons(runs.extrapolation))
    position_curves = {ds: ex.position_curves(runs.position_loss, ds)
                       for ds in present(ablation["dataset"])}
    sensitivity = lr_sensitivity(runs.trials, uniform_losses(cfg, tokens_dir))
    length = (arith.length_table(runs.by_operand_digits),
              arith.length_comparisons(runs.by_operand_digits))
    # in study order, as every other table (the stacked files come in path order)
    convergence, gradients = (
        t.sort_values(["dataset", "variant"], kind="stable", key=lambda c: c.map(
            {v: i for i, v in enumerate(present(ablation[c.name]))}))
        for t in (fi.convergence_table(runs.history), fi.gradient_table(runs.grad)))

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "ablation": fileio.write_csv(out_dir / "ablation.csv", ablation, ABLATION_COLUMNS),
        "summary": fileio.write_csv(out_dir / "summary.csv", summary),
        "comparisons": fileio.write_csv(out_dir / "comparisons.csv", comparisons),
        "problem_comparisons": fileio.write_csv(out_dir / "problem_comparisons.csv", problems,
                                                PROBLEM_COLUMNS),
        "detectable_effects": fileio.write_csv(out_dir / "detectable_effects.csv", detectable,
                                               DETECTABLE_COLUMNS),
        "references": fileio.write_csv(out_dir / "references.csv", references,
                                       REFERENCE_COLUMNS),
        "tuned": fileio.write_csv(out_dir / "tuned.csv", runs.tuned, TUNED_COLUMNS),
        "lr_sensitivity": fileio.write_csv(out_dir / "lr_sensitivity.csv", sensitivity,
                                           SENSITIVITY_COLUMNS),
        "tuning_variation": fileio.write_csv(out_dir / "tuning_variation.csv", variation,
                                             TUNING_VARIATION_COLUMNS),
        "extrapolation": fileio.write_csv(out_dir / "extrapolation.csv", extrapolation[0],
                                          ex.TABLE_COLUMNS),
        "extrapolation_comparisons": fileio.write_csv(
            out_dir / "extrapolation_comparisons.csv", extrapolation[1]),
        # the numbers behind the loss-by-position figures, every dataset in one table
        "extrapolation_positions": fileio.write_csv(
            out_dir / "extrapolation_positions.csv",
            pd.concat([c.assign(dataset=ds) for ds, c in position_curves.items()],
                      ignore_index=True),
            ["dataset", *ex.CURVE_COLUMNS]),
        "convergence": fileio.write_csv(out_dir / "convergence.csv", convergence,
                                        fi.CONVERGENCE_COLUMNS),
        "grad_flow": fileio.write_csv(out_dir / "grad_flow.csv", gradients, fi.GRAD_COLUMNS),
        "length_generalisation": fileio.write_csv(out_dir / "length_generalisation.csv",
                                                  length[0], arith.LENGTH_COLUMNS),
        "length_generalisation_comparisons": fileio.write_csv(
            out_dir / "length_generalisation_comparisons.csv", length[1],
            arith.LENGTH_COMPARISON_COLUMNS),
    }
    # a DVC metrics directory: one file per dataset (the verdicts) and per dataset x variant
    metrics_dir = out_dir / "metrics"
    docs = {metrics_dir / f"{ds}.json": doc
            for ds, doc in dataset_verdicts(summary, comparisons).items()}
    docs.update({metrics_dir / ds / f"{var}.json": doc
                 for (ds, var), doc in study_metrics(summary, comparisons,
                                                     extrapolation[0]).items()})
    for path, doc in docs.items():
        fileio.write_json(path, doc)
    stale = set(metrics_dir.glob("*.json")) | set(metrics_dir.glob("*/*.json"))
    for path in stale - set(docs):  # a variant or dataset no longer studied
        path.unlink()
    paths["metrics"] = metrics_dir
    palette = study_palette(cfg.variants, variant_order(cfg.study_variants, cfg.study_variants))
    curves_dir = out_dir / "curves"
    for ds in present(ablation["dataset"]):  # in the figures' colours (analysis/curves.py)
        fileio.write_csv(curves_dir / f"{ds}.csv", mean_curves(runs.history, ds, palette),
                         CURVE_COLUMNS)
    paths["curves"] = curves_dir

    fig_dir = out_dir / "figures"
    per_op = runs.per_op
    op_datasets = set(present(per_op["dataset"]))
    figures: list[tuple[str | None, str, Path | None]] = []  # path None: a note, no figure
    lr_figures: dict[str, tuple[str, Path]] = {}  # shown in the report's learning-rate section
    arithmetic: dict[str, list[str]] = {}  # the lines that open an arithmetic dataset's section
    length_figures: list[Path] = []
    for ds in present(ablation["dataset"]):
        r = references[(references["dataset"] == ds) & (references["metric"] == "test_loss")]
        loss = headline_loss(comparisons, ds)  # the forest plot's: its band is in this loss
        lines = {f"{x.reference} ({refs.NGRAM_SHORT})": x.value for x in r.itertuples()}
        figures += _drawn([
            (ds, f"{ds}: validation loss vs step (mean ± 1 SD over seeds; grey lines: n-gram "
                 "references of the test split)",
             plots.plot_val_loss_curves(runs.history, ds, fig_dir / f"val_loss_curves_{ds}.png",
                                        palette=palette, references=lines)),
            (ds, f"{ds}: test loss per variant (dots: seeds; diamond: mean ± 95% t-interval; "
                 "grey lines: n-gram references)",
             plots.plot_test_loss(ablation, ds, fig_dir / f"test_loss_{ds}.png",
                                  references=lines)),
            (ds, f"{ds}: {METRICS[loss][0]} difference to baseline, the loss of this "
                 "dataset's verdicts (paired by seed: raw 95% t-interval and Holm-adjusted "
                 "interval" + ("; shaded band: tuning luck, the change when the baseline was "
                              "tuned again with another sampler seed)"
                              if tuning_luck(variation, ds, loss) is not None else ")"),
             plots.plot_forest(comparisons, ds, fig_dir / f"forest_{ds}.png", loss,
                               variation=variation)),
            (ds, f"{ds}: test loss by token position, past the training context (mean over "
                 "seeds; length extrapolation)",
             plots.plot_position_loss(
                 position_curves[ds], ds, cfg.model.context_length,
                 fig_dir / f"extrapolation_{ds}.png", palette=palette,
                 positions={v: cfg.model_config(v, vocab_size=1).position
                            for v in present(ablation["variant"])})),
        ])
        if cfg.datasets[ds].kind == "arithmetic":
            digits = arith.training_digits(cfg.datasets[ds], runs.by_operand_digits, ds)
            path = arith_figs.plot_length_generalisation(
                runs.by_operand_digits, ds, digits,
                fig_dir / f"length_generalisation_{ds}.png", palette=palette)
            left_out = arith.unreachable(runs.by_operand_digits, ds)
            caption = (f"{ds}: exact match by operand length (mean ± 95% t-interval over "
                       "seeds; shaded: longer than any training problem)"
                       + (f"; left out: {'; '.join(left_out)}" if left_out else ""))
            length_figures += [path] if path is not None else []
            arithmetic[ds] = arith.headline_lines(summary, comparisons, references, ds,
                                                  present(ablation["variant"]))
            arithmetic[ds] += arith.breakdown_lines(runs.per_op, runs.by_answer_digits, ds,
                                                    present(ablation["variant"]))
            arithmetic[ds] += arith.length_lines(
                *length, ds, digits, present(ablation["variant"]),
                (caption, path.relative_to(out_dir).as_posix()) if path else None)
        if ds in op_datasets:
            single = len(op_datasets) == 1  # one arithmetic dataset: no suffix in the name
            for metric in ("exact_match", "char_accuracy"):
                name = f"{metric}_by_op.png" if single else f"{metric}_by_op_{ds}.png"
                path = arith_figs.plot_by_op(per_op, ds, fig_dir / name, metric,
                                             palette=palette, references=references)
                floor = ((references["dataset"] == ds) & (references["metric"] == metric)
                         & (references["reference"] == arith.FLOORS[metric])).any()
                figures += _drawn([(ds, f"{ds}: {METRICS[metric][0]} by operation and "
                                    "variant (mean ± 95% t-interval over seeds, dots: seeds"
                                    + ("; dashed: the floor, the best answer ignoring the "
                                       "question, over all operations)" if floor else ")"),
                                    path)],
                                  arith_figs.nothing_solved(per_op, ds, metric))
        path = plot_lr_response(runs.trials, runs.tuned, ds, fig_dir / f"tuning_{ds}.png",
                                palette=palette)
        if path is not None:
            lr_figures[ds] = (
                f"{ds}: how each variant responds to the learning rate (one seed, first rung "
                "of the tuning). Left: validation loss against learning rate, lines through "
                "the shared design, faint dots the other first-rung trials, stars the tuned "
                "configurations (equal ones fanned out sideways). Right: the best loss per "
                "width at equal compute, diamonds the last rung's trials"
                + (". Shaded: outside the learning rates and widths the tuner searched"
                   if search_bounds(runs.tuned, ds) != (None, None, []) else ""), path)
        path = plots.plot_params_vs_loss(ablation, ds, fig_dir / f"params_vs_loss_{ds}.png",
                                         palette=palette)
        figures += _drawn([(ds, f"{ds}: non-embedding parameters vs test loss", path)],
                          plots.params_too_narrow(ablation, ds))
        figures += _drawn([(ds, f"{ds}: fraction of near-zero gradients per parameter group",
                            plots.plot_grad_flow(runs.grad, ds,
                                                 fig_dir / f"grad_flow_{ds}.png"))])
    figures += [(ds, cap, Path(p)) for ds, cap, p in extra_figures]
    written = [(ds, cap, p) for ds, cap, p in figures if p is not None]
    datasets = present(ablation["dataset"])
    findings = fi.findings_section(
        comparisons, datasets=datasets, order=present(ablation["variant"]), variation=variation,
        convergence=convergence, gradients=gradients, extrapolation=extrapolation[0],
        length=length[0], positions={v: cfg.model_config(v, vocab_size=1).position
                                     for v in present(ablation["variant"])},
        figures={ds: f"figures/forest_{ds}.png" for ds in datasets
                 if (fig_dir / f"forest_{ds}.png") in {p for _, _, p in written}})
    md = render_markdown(
        cfg, runs, summary, comparisons,
        [(ds, cap, p.relative_to(out_dir).as_posix() if p is not None else None)
         for ds, cap, p in figures],
        environment, notes, variation, problems=problems, detectable=detectable,
        references=references, tuned=runs.tuned, extrapolation=extrapolation,
        sensitivity=sensitivity, arithmetic=arithmetic,
        lr_figures={ds: (cap, p.relative_to(out_dir).as_posix())
                    for ds, (cap, p) in lr_figures.items()}, findings=findings)
    paths["report"] = out_dir / "report.md"
    fileio.write_text(paths["report"], md)
    paths["figures"] = ([p for _, _, p in written] + [p for _, p in lr_figures.values()]
                        + length_figures)
    return paths


def run(cfg: StudyConfig, runs_dir: Path, tokens_dir: Path, out_dir: Path,
        tracker: NullTracker) -> dict:
    """Write the report under ``out_dir`` and log it to an MLflow summary run.

    Draws the model figures from the checkpoints first, then :func:`build_report` with this
    machine's :func:`environment`; logs ``report.md``, the tables (artifact folder
    ``tables``) and ``figures/`` to a run named ``study-summary``.

    Returns:
        :func:`build_report`'s paths.

    Raises:
        FileNotFoundError: no results of the configured study under ``runs_dir``, or a
            dataset's tokenizer or test split is missing under ``tokens_dir``.
    """
    runs_dir, tokens_dir, out_dir = Path(runs_dir), Path(tokens_dir), Path(out_dir)
    figures_dir = out_dir / "figures"
    figures_dir.mkdir(parents=True, exist_ok=True)
    extra = draw_model_figures(cfg, runs_dir, tokens_dir, figures_dir)
    result = build_report(cfg, runs_dir, out_dir, environment(), extra_figures=extra,
                          tokens_dir=tokens_dir)
    with tracker.run("study-summary", {"stage": "report"}):
        tracker.log_artifact(out_dir / "report.md")
        for name in ("ablation.csv", "summary.csv", "comparisons.csv", "problem_comparisons.csv",
                     "detectable_effects.csv", "references.csv", "tuned.csv",
                     "lr_sensitivity.csv", "tuning_variation.csv",
                     "length_generalisation.csv", "length_generalisation_comparisons.csv"):
            tracker.log_artifact(out_dir / name, "tables")
        tracker.log_artifact(figures_dir, "figures")
    return result


def where_to_look(cfg: StudyConfig, paths: dict, runs_view_url: str | None = None,
                  chart_urls: dict[str, str] | None = None) -> str:
    """The lines the report stage ends with: where the report is, and the command that opens
    the MLflow UI on this study's runs (when tracking is on), with the URL of the saved runs
    view (``runs_view_url``, :meth:`lmablate.tracking.MlflowStore.runs_view_url`) if known, then
    that of each dataset's chart view (``chart_urls``: dataset -> URL part,
    :meth:`lmablate.tracking.MlflowStore.save_views`)."""
    lines = [f"report: {paths['report']} ({len(paths['figures'])} figures, tables next to it)"]
    if cfg.tracking.enabled:
        uri = cfg.tracking.tracking_uri
        if uri.startswith(("http://", "https://")):
            address = uri.rstrip("/")
            lines.append(f"MLflow UI: {address}/{runs_view_url or ''}")
        else:
            address = "http://127.0.0.1:5000"
            lines.append(f"MLflow UI: mlflow ui --backend-store-uri {uri}")
            lines.append(f"  then open {address}/{runs_view_url or ''}")
        lines += [f"  validation loss, {ds}: {address}/{url}"
                  for ds, url in (chart_urls or {}).items()]
    return "\n".join(lines)


def variant_colours(cfg: StudyConfig) -> dict[str, str]:
    """Each studied variant's colour in the figures (:func:`family_palette`, variants in the
    report's order: baseline first), as ``"#rrggbb"`` for MLflow's run colours."""
    return hex_colours(study_palette(cfg.variants,
                                     variant_order(cfg.study_variants, cfg.study_variants)))


def main(cfg: StudyConfig, args: argparse.Namespace) -> None:
    """``lmablate report --runs DIR --tokens DIR --out DIR``; writes the study's MLflow views
    (:meth:`lmablate.tracking.MlflowStore.save_views`) and ends by printing
    :func:`where_to_look`."""
    tracker = make_tracker(cfg.tracking)
    paths = run(cfg, args.runs, args.tokens, args.out, tracker)
    colours = variant_colours(cfg)
    urls = tracker.save_views(list(cfg.datasets), list(colours), colours)
    print(where_to_look(cfg, paths, urls.pop("runs", None) or tracker.runs_view_url(), urls),
          flush=True)
    # the answer last, where a terminal's scroll stops: read back from the CSV the report wrote
    comparisons = pd.read_csv(paths["comparisons"])
    print("findings (paired by seed, Holm-corrected; Δ and its adjusted interval):",
          *(f"  {line}" for line in fi.verdict_lines(comparisons, list(cfg.datasets))),
          sep="\n", flush=True)
