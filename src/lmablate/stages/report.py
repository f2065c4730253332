"""Stage ``report``: the study's tables, statistics, figures and ``report.md``.

Reads what the train/evaluate/tune stages wrote under ``runs/<dataset>/<variant>/`` (and the
first-seed checkpoints and the tokenized test splits, for the model figures) and writes, under
``out_dir`` (normally ``reports/``), the CSV tables (:mod:`lmablate.report.tables`), the DVC
metrics and curves (:mod:`lmablate.report.headline`, :mod:`lmablate.report.curves`), the figures
(:mod:`lmablate.report.figures`), ``report.md`` and the ``appendix.md`` it links to (rendered by
:mod:`lmablate.report.text.render`); then logs them to an MLflow summary run. Rows follow the
study order (datasets as configured, baseline first), set once by
:func:`lmablate.report.collect.restrict_to_study`. Losses are in nats/char. Every file and its
columns: the handbook's Reading the report, "The files".
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pandas as pd
import torch

from lmablate.config.study import StudyConfig
from lmablate.core import fileio
from lmablate.core.tracker import Tracker
from lmablate.report.collect import (BASELINE, RunOutputs, check_complete, collect, present,
                                     restrict_to_study, run_folder)
from lmablate.report.curves import CURVE_COLUMNS, mean_curves
from lmablate.report.families import variant_colours, variant_palette
from lmablate.report.figures.model_figures import draw_model_figures
from lmablate.report.figures.report_figures import Figure, draw_report_figures
from lmablate.report.headline import metrics_files
from lmablate.report.staging import check_stageable, staged_folder
from lmablate.report.stats.pooled_uncertainty import with_pooled_uncertainty
from lmablate.report.tables import compute_tables, csv_tables
from lmablate.report.text import findings as fi
from lmablate.report.text.content import report_content
from lmablate.report.text.html import report_html
from lmablate.report.text.render import render_appendix, render_report
from lmablate.report.text.scaling_section import (draw_scaling_figures, scaling_csvs,
                                               scaling_metrics, scaling_section,
                                               scaling_tables)
from lmablate.tracking.environment import blas, cpu_model, describe
from lmablate.tracking.mlflow_store import local_artifact_root
from lmablate.tracking.trackers import make_tracker


def environment(cfg: StudyConfig | None = None, runs_dir: Path | None = None) -> dict:
    """Hardware and software the study ran on, for the methodology paragraph: this machine's
    (cores, CPU model, BLAS, torch, Python, OS) and, from the study's ``metrics.json`` files
    under ``runs_dir``, the environments its results were computed with
    (:func:`lmablate.tracking.environment.result_environment`: numerics, torch, Python, lock), one
    entry when every run agrees, else each with the runs that used it."""
    gpu = f", GPU {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ", no GPU"
    out: dict = {"hardware": f"{os.cpu_count()} CPU cores ({platform.machine()}){gpu}",
                 "cpu": cpu_model(), "blas": blas(), "torch": torch.__version__,
                 "python": platform.python_version(), "platform": platform.platform(terse=True)}
    if cfg is None or runs_dir is None:
        return out
    seen: dict[str, list[str]] = {}
    for dataset in cfg.datasets:
        for variant in cfg.study_variants:
            path = runs_dir / dataset / variant / "metrics.json"
            if path.is_file():
                env = fileio.read_json(path).get("environment")
                seen.setdefault(json.dumps(env, sort_keys=True), []).append(
                    f"{dataset}/{variant}")
    envs = {key: json.loads(key) or {"environment": "not recorded"} for key in seen}
    if len(seen) == 1:
        out["results computed with"] = next(iter(envs.values()))
    for i, (key, where) in enumerate(seen.items() if len(seen) > 1 else ()):
        out[f"results computed with ({i + 1} of {len(seen)} environments)"] = {
            **envs[key], "runs": " ".join(where)}
    return out


def result_environments(cfg: StudyConfig, runs_dir: Path) -> dict[str, list[Path]]:
    """The environments the study's results were computed with
    (:func:`lmablate.tracking.environment.describe` of each ``metrics.json``'s
    ``environment``, replicates included), each with its files, in study order; files without
    a recorded environment are left out."""
    out: dict[str, list[Path]] = {}
    for r in range(cfg.replicates):
        for dataset in cfg.datasets:
            for variant in cfg.study_variants:
                path = run_folder(runs_dir, dataset, variant, r) / "metrics.json"
                env = fileio.read_json(path).get("environment") if path.is_file() else None
                if env:
                    out.setdefault(describe(env), []).append(path)
    return out


def check_environments(cfg: StudyConfig, runs_dir: Path) -> list[str]:
    """Refuse results of more than one environment unless ``study.mixed_environments``; then
    return each environment with its runs, for the Findings (empty for one environment).

    Raises:
        ValueError: two files computed with different numerics or torch builds, naming both.
    """
    envs = result_environments(cfg, runs_dir)
    if len(envs) <= 1:
        return []
    (a, first), (b, second) = list(envs.items())[:2]
    if not cfg.mixed_environments:
        raise ValueError(f"{second[0]}: computed with {b}, but {first[0]} with {a}; results "
                         "of two environments are not compared: run the stages of one of them "
                         "again here (dvc repro -f), or set study.mixed_environments: true")
    return [f"{env}: {', '.join(str(p.parent.relative_to(runs_dir)) for p in paths)}"
            for env, paths in envs.items()]


def summary_record(cfg: StudyConfig, metrics_dir: Path) -> tuple[dict, dict, dict]:
    """What the ``study-summary`` MLflow run records of the study, from the DVC metrics files
    under ``metrics_dir`` (:func:`write_metrics`): params (the profile, seeds, datasets,
    variants), metrics (each number of each file, as ``<file path without .json>/<key>``: e.g.
    ``arithmetic/rope/delta_answer_loss``) and tags (each text of each file as
    ``<path>/<key>``: the verdicts). Returns ``(params, metrics, tags)``."""
    params = {"profile": cfg.profile, "seeds": list(cfg.seeds), "datasets": list(cfg.datasets),
              "variants": list(cfg.study_variants), "match_params": cfg.match_params,
              "replicates": cfg.replicates}
    metrics, tags = {}, {}
    for path in sorted(metrics_dir.rglob("*.json")):
        name = path.relative_to(metrics_dir).with_suffix("").as_posix()
        for key, value in json.loads(path.read_text()).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                metrics[f"{name}/{key}"] = float(value)
            else:
                tags[f"{name}/{key}"] = str(value)
    return params, metrics, tags


def verdict_label(doc: Mapping[str, Any], variant: str) -> str:
    """A final run's verdict tag from its DVC metrics ``doc``: the verdict in the dataset's
    headline loss with Δ and its share of the baseline's mean, rounded, e.g. ``better: Δ
    -0.108 (-4.9%)``; the baseline's its mean, e.g. ``baseline: 2.190`` (nats/char, nats per
    answer character on arithmetic); the verdict alone where the file has no Δ."""
    delta = next((k for k in doc if k.startswith("delta_")), None)
    verdict = str(doc.get("verdict", BASELINE if variant == BASELINE else "no comparison"))
    if delta is None or not isinstance(doc.get(delta), (int, float)):
        return verdict
    mean = doc.get(delta.removeprefix("delta_"))
    if variant == BASELINE:
        return f"{verdict}: {mean:.3f}" if isinstance(mean, (int, float)) else verdict
    d, base = float(doc[delta]), (mean - doc[delta] if isinstance(mean, (int, float)) else 0)
    return f"{verdict}: Δ {d:+.3f}" + (f" ({d / abs(base):+.1%})" if base else "")


def run_verdicts(cfg: StudyConfig, metrics_dir: Path) -> dict[str, str]:
    """``"<dataset>/<variant>"`` -> the verdict label (:func:`verdict_label`) its DVC metrics
    file gives in the dataset's headline loss: the tag MLflow's runs view groups the final
    runs by (:meth:`lmablate.tracking.mlflow_store.MlflowStore.save_views`)."""
    return {f"{ds}/{path.stem}": verdict_label(json.loads(path.read_text()), path.stem)
            for ds in cfg.datasets for path in sorted((metrics_dir / ds).glob("*.json"))}


def with_replication(docs: dict[str, dict], replication: pd.DataFrame,
                     speed: pd.DataFrame | None = None) -> dict[str, dict]:
    """The DVC metrics ``docs`` with each compared variant's replication
    (:func:`lmablate.report.stats.replication.combine_replicates`) in its
    ``<dataset>/<variant>.json``: ``replicated`` ("yes" when every replicate gave the same
    verdict, else "no") and ``verdict_combined``; and in each ``<dataset>.json``
    ``replication``: "all replicated", or "not replicated: " and the variants whose verdicts
    differ. ``speed`` (:func:`lmablate.report.stats.replication.combine_speed`) adds
    ``speed_replicated`` and ``speed_verdict_combined``, the same for learning speed, to the
    variants of a probed dataset. ``dvc exp show`` and the MLflow summary run show them.
    Unchanged without replicates."""
    for r in (speed if speed is not None else pd.DataFrame()).itertuples():
        doc = docs.get(f"{r.dataset}/{r.variant}.json")
        if doc is not None:
            doc.update(speed_replicated="yes" if r.agree else "no",
                       speed_verdict_combined=r.verdict)
    for r in replication.itertuples():
        doc = docs.get(f"{r.dataset}/{r.variant}.json")
        if doc is not None:
            doc.update(replicated="yes" if r.agree else "no", verdict_combined=r.verdict)
    for dataset, rows in replication.groupby("dataset", sort=False):
        doc = docs.get(f"{dataset}.json")
        if doc is not None:
            differ = [str(v) for v, agree in zip(rows["variant"], rows["agree"]) if not agree]
            doc["replication"] = ("not replicated: " + ", ".join(differ) if differ
                                  else "all replicated")
    return docs


def write_metrics(metrics_dir: Path, docs: dict[str, dict]) -> Path:
    """Write the DVC metrics directory: ``docs`` (relative path -> JSON document,
    :func:`lmablate.report.headline.metrics_files`) under ``metrics_dir``, and remove the
    files of a variant or dataset no longer studied. Returns ``metrics_dir``."""
    paths = {metrics_dir / name: doc for name, doc in docs.items()}
    for path, doc in paths.items():
        fileio.write_json(path, doc)
    stale = set(metrics_dir.glob("*.json")) | set(metrics_dir.glob("*/*.json"))
    for path in stale - set(paths):
        path.unlink()
    return metrics_dir


def build_report(cfg: StudyConfig, runs_dir: Path, out_dir: Path,
                 environment: dict | None = None,
                 extra_figures: Callable[[Path], Sequence[Figure]]
                 | None = None,
                 tokens_dir: Path | None = None) -> dict:
    """Collect the runs, compute the tables, draw the figures and write the report.

    Every output is written into a staging folder beside ``out_dir`` and moved into place
    only when all of them were written (:func:`lmablate.report.staging.staged_folder`): a
    failure leaves ``out_dir`` as it was.

    The work is the library's: :func:`lmablate.report.tables.compute_tables` (statistics,
    references, sensitivity), :func:`lmablate.report.figures.report_figures.draw_report_figures`
    and :func:`lmablate.report.text.content.report_content`, rendered by
    :func:`lmablate.report.text.render.render_report`; this writes what they return.

    Args:
        cfg: the study config; its datasets, variants and seeds select the runs (others under
            ``runs_dir`` are ignored and listed in the report) and its settings are written into
            the methodology paragraph.
        runs_dir: the ``runs/`` tree (``<dataset>/<variant>/metrics.json`` etc.).
        out_dir: where to write (created if needed); its tables, ``report.md``,
            ``appendix.md`` and the folders ``figures/``, ``curves/`` and ``metrics/`` are replaced as a whole.
        environment: free-form facts for the methodology paragraph, e.g. ``{"hardware": "1x
            H100", "torch": "2.13.0", "python": "3.11.9", "wall_seconds": {"tune": 812.0}}``;
            the keys ``hardware``/``device`` and ``torch``/``torch_version`` are used in the
            prose, every key is listed.
        extra_figures: draws figures from elsewhere (from checkpoints: attention maps,
            embeddings) into the folder it is given (the staged ``figures/``) and returns
            ``(dataset or None, caption, path)`` of each, to embed in the report.
        tokens_dir: the tokenized datasets (``<tokens_dir>/<dataset>/``), for the reference
            points (:func:`lmablate.report.stats.reference_points.reference_table`) and the loss at
            initialisation of the learning-rate sensitivity
            (:func:`lmablate.report.stats.reference_points.uniform_losses`); None leaves them out
            (empty references.csv, no sensitivity).

    Returns:
        ``{"report", "ablation", "summary", "comparisons", "problem_comparisons",
        "detectable_effects", "references", "tuned", "lr_sensitivity", "replicates",
        "replication", "tuning_spread",
        "extrapolation", "extrapolation_comparisons", "extrapolation_positions",
        "length_generalisation", "length_generalisation_comparisons", "scaling_fits",
        "scaling_effects", "scaling_trends", "scaling_extrapolation", "scaling_isoflop",
        "scaling_optimal_width", "metrics", "curves": Path, "figures": [Path, ...]}``.

    Raises:
        FileNotFoundError: no ``metrics.json`` of the configured study under ``runs_dir``.
    """
    runs_dir, out_dir = Path(runs_dir), Path(out_dir)
    mixed = check_environments(cfg, runs_dir)
    runs, notes = restrict_to_study(cfg, collect(runs_dir))
    check_complete(runs, runs_dir)
    # every bracketed variant's uncertainty drawn with its dataset's pooled seed spread
    runs = dataclasses.replace(runs, tuned=with_pooled_uncertainty(runs.tuned, runs.trials,
                                                                   runs.history))
    if runs.ablation.empty:
        raise FileNotFoundError(
            f"report: no results of the configured study under {runs_dir} (expected "
            f"<dataset>/<variant>/metrics.json for datasets {', '.join(cfg.datasets)})")
    tables = compute_tables(cfg, runs, tokens_dir, replicate_runs(cfg, runs_dir, notes))
    with staged_folder(out_dir) as stage:
        extra = extra_figures(stage / "figures") if extra_figures is not None else ()
        paths = _write_report(cfg, runs, notes, tables, stage, environment, extra, mixed)
    return _moved(paths, stage, out_dir)


def _moved(paths: dict, stage: Path, out_dir: Path) -> dict:
    """``paths`` (values: paths under ``stage``, or lists of them) as they lie once moved to
    ``out_dir``."""
    def move(p: Path) -> Path:
        return out_dir / Path(p).relative_to(stage)
    return {k: [move(p) for p in v] if isinstance(v, list) else move(v)
            for k, v in paths.items()}


def _write_report(cfg: StudyConfig, runs: RunOutputs, notes: list[str], tables,
                  out_dir: Path, environment: dict | None,
                  extra_figures: Sequence[Figure],
                  environments: Sequence[str] = ()) -> dict:
    """Write :func:`build_report`'s outputs under ``out_dir`` (the staging folder); returns
    their paths."""
    csvs = csv_tables(runs, tables)
    paths: dict = {name: fileio.write_csv(out_dir / file, frame, columns)
                   for name, (file, frame, columns) in csvs.items()}
    palette = variant_palette(cfg)
    curves_dir = out_dir / "curves"
    for ds in present(runs.ablation["dataset"]):  # in the figures' colours (analysis/curves.py)
        fileio.write_csv(curves_dir / f"{ds}.csv", mean_curves(runs.history, ds, palette),
                         CURVE_COLUMNS)
    paths["curves"] = curves_dir

    scaling = scaling_tables(cfg, runs)
    csvs_scaling = scaling_csvs(scaling)
    paths.update({name: fileio.write_csv(out_dir / file, frame, columns)
                  for name, (file, frame, columns) in csvs_scaling.items()})
    paths["metrics"] = write_metrics(out_dir / "metrics", with_replication(
        scaling_metrics(scaling, runs, metrics_files(tables.summary, tables.comparisons,
                                                     tables.extrapolation,
                                                     tables.speed_summary)),
        tables.replication, tables.speed_replication))

    figures = draw_report_figures(cfg, runs, tables, out_dir / "figures", palette,
                                  extra=extra_figures)
    scaling_figures = draw_scaling_figures(scaling, runs, out_dir / "figures", palette)
    paths["report"] = out_dir / "report.md"
    # "How to read this report" counts the tables as written
    written = [file for file, _, _ in (*csvs.values(), *csvs_scaling.values())]
    content = report_content(
        cfg, runs, notes, tables, figures, out_dir, environment,
        scaling=scaling_section(scaling, runs, scaling_figures, out_dir),
        trends=scaling.trends, csv_files=written, environments=environments)
    fileio.write_text(paths["report"], render_report(content))
    paths["appendix"] = out_dir / "appendix.md"
    fileio.write_text(paths["appendix"], render_appendix(content))
    paths["figures"] = figures.written() + list(scaling_figures.values())
    return paths


def replicate_runs(cfg: StudyConfig, runs_dir: Path, notes: list[str]) -> dict[int, RunOutputs]:
    """The runs of replicates 1 .. ``study.replicates`` - 1 (r -> runs, each restricted to its
    own seeds, :meth:`~lmablate.config.study.StudyConfig.for_replicate`, and its tuning
    uncertainty drawn with its own pooled spread); their missing or ignored runs are added to
    ``notes``, named by replicate."""
    out = {}
    for r in range(1, cfg.replicates):
        runs, missing = restrict_to_study(cfg.for_replicate(r), collect(runs_dir, r))
        check_complete(runs, runs_dir, r)
        notes += [f"Replicate {r}: {note}" for note in missing]
        out[r] = dataclasses.replace(runs, tuned=with_pooled_uncertainty(
            runs.tuned, runs.trials, runs.history))
    return out


def run(cfg: StudyConfig, runs_dir: Path, tokens_dir: Path, out_dir: Path,
        tracker: Tracker) -> dict:
    """Write the report under ``out_dir`` and log it to an MLflow summary run.

    Runs :func:`build_report` with this machine's :func:`environment` and the model figures
    drawn from the checkpoints (:func:`draw_model_figures`); once every output is in place it
    logs the study's verdicts and metrics
    (:func:`summary_record`), ``report.md``, ``appendix.md``, ``report.html`` (report.md with
    its figures inline, :func:`~lmablate.report.text.html.report_html`, for MLflow's viewer),
    the tables (artifact folder ``tables``) and ``figures/`` to a run named ``study-summary``.

    Returns:
        :func:`build_report`'s paths.

    Raises:
        FileNotFoundError: no results of the configured study under ``runs_dir``, or a
            dataset's tokenizer or test split is missing under ``tokens_dir``.
    """
    runs_dir, tokens_dir, out_dir = Path(runs_dir), Path(tokens_dir), Path(out_dir)
    figures_dir = out_dir / "figures"
    result = build_report(
        cfg, runs_dir, out_dir, environment(cfg, runs_dir), tokens_dir=tokens_dir,
        extra_figures=lambda folder: draw_model_figures(cfg, runs_dir, tokens_dir, folder))
    params, metrics, verdicts = summary_record(cfg, out_dir / "metrics")
    with tracker.run("study-summary", {"stage": "report", **verdicts}):
        tracker.log_params(params)
        tracker.log_metrics(metrics)
        tracker.log_artifact(out_dir / "report.md")
        tracker.log_artifact(out_dir / "appendix.md")
        # MLflow shows report.md's figures as links; report.html carries them inline
        with tempfile.TemporaryDirectory() as tmp:
            page = Path(tmp) / "report.html"
            page.write_text(report_html((out_dir / "report.md").read_text(encoding="utf-8"),
                                        out_dir, f"lmablate: {cfg.profile}"), encoding="utf-8")
            tracker.log_artifact(page)
        for path in sorted(out_dir.glob("*.csv")):  # every table the report wrote
            tracker.log_artifact(path, "tables")
        tracker.log_artifact(figures_dir, "figures")
    return result


def where_to_look(cfg: StudyConfig, paths: dict, runs_view_url: str | None = None,
                  chart_urls: dict[str, str] | None = None,
                  tuning_urls: dict[str, str] | None = None) -> str:
    """The lines the report stage ends with: where the report is, and the command that opens
    the MLflow UI on this study's runs (when tracking is on), with the URL of the saved runs
    view (``runs_view_url``, :meth:`lmablate.tracking.mlflow_store.MlflowStore.runs_view_url`) if
    known, then that of each dataset's chart view (``chart_urls``: dataset -> URL part,
    :meth:`lmablate.tracking.mlflow_store.MlflowStore.save_views`) and of its tuning trials'
    parallel coordinates (``tuning_urls``, the same)."""
    lines = [f"report: {paths['report']} ({len(paths['figures'])} figures, tables next to it)"]
    if cfg.tracking.enabled:
        uri = cfg.tracking.tracking_uri
        if uri.startswith(("http://", "https://")):
            address = uri.rstrip("/")
            lines.append(f"MLflow UI: {address}/{runs_view_url or ''}")
        else:
            address = "http://127.0.0.1:5000"
            root = local_artifact_root(uri)
            where = ""
            if root is not None:
                # `mlflow ui` serves the artifacts of the folder it starts in (./mlartifacts):
                # it starts beside the store (a `dvc exp run --temp` computes elsewhere)
                scheme, db = uri.split("///", 1)
                uri = f"{scheme}///{Path(db).name}"
                if root.parent != Path.cwd().absolute():
                    where = f"cd {root.parent} && "
            lines.append(f"MLflow UI: {where}mlflow ui --backend-store-uri {uri}")
            lines.append(f"  then open {address}/{runs_view_url or ''}")
        lines += [f"  validation loss, {ds}: {address}/{url}"
                  for ds, url in (chart_urls or {}).items()]
        lines += [f"  tuning trials, {ds}: {address}/{url}"
                  for ds, url in (tuning_urls or {}).items()]
    return "\n".join(lines)


def main(cfg: StudyConfig, args: argparse.Namespace) -> None:
    """``lmablate report --runs DIR --tokens DIR --out DIR``; writes the study's MLflow views
    (:meth:`lmablate.tracking.mlflow_store.MlflowStore.save_views`) and ends by printing
    :func:`where_to_look`."""
    check_stageable(args.out)  # before MLflow starts or any figure is drawn
    tracker = make_tracker(cfg.tracking)
    paths = run(cfg, args.runs, args.tokens, args.out, tracker)
    colours = variant_colours(cfg)
    urls = tracker.save_views(list(cfg.datasets), list(colours), colours,
                              run_verdicts(cfg, Path(args.out) / "metrics"))
    runs_url, tuning_urls = urls.pop("runs", None), urls.pop("tuning", None)
    print(where_to_look(cfg, paths, runs_url or tracker.runs_view_url(), urls, tuning_urls),
          flush=True)
    # the answer last, where a terminal's scroll stops: read back from the CSV the report wrote
    comparisons = pd.read_csv(paths["comparisons"])
    references = pd.read_csv(paths["references"])
    print("findings (paired by seed, Holm-corrected; Δ and its adjusted interval):",
          *(f"  {line}" for line in fi.verdict_lines(comparisons, list(cfg.datasets),
                                                     references)),
          sep="\n", flush=True)
