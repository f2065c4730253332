"""The study's report: tables, statistics, figures and ``report.md`` from the per-run outputs.

Reads what the train/evaluate/tune stages wrote under ``runs/<dataset>/<variant>/`` and writes,
under ``out_dir`` (normally ``reports/``):

* ``ablation.csv``   one row per dataset x variant x seed (:data:`ABLATION_COLUMNS`).
* ``summary.csv``    *long* format, one row per dataset x variant x metric
  (:data:`SUMMARY_COLUMNS`): number of seeds, mean, sample SD and a two-sided 95% Student-t
  interval of the mean. Long rather than wide so every metric has the same five statistics, a
  metric that does not apply (exact match on Shakespeare) simply has no row, and the file is one
  ``pivot`` away from any wide table.
* ``comparisons.csv`` every variant against ``baseline``, paired by seed (:data:`COMPARISON_COLUMNS`):
  paired t-test (``scipy.stats.ttest_rel``) and Holm's step-down correction
  (``statsmodels.stats.multitest.multipletests(method="holm")``) within each dataset x metric.
* ``figures/*.png``  seaborn figures (one function each, ``plot_*``).
* ``report.md``      the human-readable report, every number generated from the files and config.

Units: losses are natural-log cross-entropy per character token (nats/token); bits per char =
loss / ln 2; perplexity = exp(loss); accuracies are fractions in [0, 1]; times in seconds.

The module never loads checkpoints: :func:`plot_attention` and :func:`plot_embedding_pca` take
plain arrays, so the caller decides which model and which input to visualise.
"""

from __future__ import annotations

import math
import re
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import (FuncFormatter, LogLocator, NullFormatter,
                               StrMethodFormatter)
from scipy import stats
from statsmodels.stats.multitest import multipletests

from lmablate import fileio
from lmablate.config import StudyConfig

BASELINE = "baseline"
ALPHA = 0.05  # family-wise error rate of the Holm-corrected comparisons
CONFIDENCE = 0.95  # level of every interval in the report
MIN_SEEDS_FOR_TEST = 3  # with 2 pairs a t-test has 1 degree of freedom: no power, no verdict
DPI = 110

ABLATION_COLUMNS = [
    "dataset", "variant", "seed", "n_params", "n_params_non_embedding", "flops_per_token", "lr",
    "d_model", "val_loss", "test_loss", "perplexity", "bits_per_char", "char_accuracy",
    "exact_match", "train_seconds", "tokens_per_second",
]
# Stored as integers when every present value is integral (pandas' nullable Int64, so NaN stays
# possible and the CSV shows 104321 rather than 104321.0).
_INTEGER_COLUMNS = ("seed", "n_params", "n_params_non_embedding", "flops_per_token", "d_model")

SUMMARY_COLUMNS = ["dataset", "variant", "metric", "n", "mean", "std", "ci95_low", "ci95_high"]
COMPARISON_COLUMNS = [
    "dataset", "metric", "higher_is_better", "baseline", "variant", "n_pairs", "baseline_mean",
    "variant_mean", "mean_diff", "ci95_low", "ci95_high", "t_stat", "p_value", "p_holm",
    "reject_holm", "verdict",
]

# metric -> (label, unit, higher_is_better); the order is the order of the summary tables.
METRICS: dict[str, tuple[str, str, bool | None]] = {
    "test_loss": ("test loss", "nats/token", False),
    "val_loss": ("validation loss", "nats/token", False),
    "bits_per_char": ("bits per char", "bits/char", False),
    "perplexity": ("perplexity", "", False),
    "char_accuracy": ("char accuracy", "fraction", True),
    "exact_match": ("exact match", "fraction", True),
    "train_seconds": ("train time", "s", None),
    "tokens_per_second": ("throughput", "tokens/s", None),
}
# Metrics tested against the baseline (when the dataset has them at all).
COMPARED_METRICS = ("test_loss", "exact_match", "char_accuracy")

VERDICT_BETTER = "better"
VERDICT_WORSE = "worse"
VERDICT_NSD = "no significant difference"
VERDICT_FEW = "too few seeds"
VERDICT_COLORS = {
    VERDICT_BETTER: "#1a9850",
    VERDICT_WORSE: "#d73027",
    VERDICT_NSD: "#4d4d4d",
    VERDICT_FEW: "#b0b0b0",
}
VERDICT_MARKS = {VERDICT_BETTER: "▲", VERDICT_WORSE: "▼"}


# --------------------------------------------------------------------------------------------
# Collecting the stage outputs
# --------------------------------------------------------------------------------------------

def _seed_of(key: str, run: Mapping[str, Any]) -> int:
    """The run's seed: its ``seed`` field, else the number in its ``seed_<n>`` key."""
    if run.get("seed") is not None:
        return int(run["seed"])
    return int(str(key).rsplit("_", 1)[-1])


def _maybe_int(series: pd.Series) -> pd.Series:
    values = pd.to_numeric(series, errors="coerce")
    finite = values.dropna()
    if len(finite) and np.all(np.isclose(finite, np.round(finite))):
        return values.round().astype("Int64")
    return values.astype(float)


def _read_csv_tagged(path: Path, dataset: str, variant: str) -> pd.DataFrame | None:
    if not path.is_file():
        return None
    df = pd.read_csv(path)
    df.insert(0, "variant", variant)
    df.insert(0, "dataset", dataset)
    return df


def collect(runs_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame, dict]:
    """Read every ``<runs_dir>/<dataset>/<variant>/`` that holds a ``metrics.json``.

    Returns:
        ``(ablation, history, trials, grad, extras)``:

        * ``ablation``: one row per dataset x variant x seed, columns :data:`ABLATION_COLUMNS`
          (NaN where a metric does not apply, e.g. ``exact_match`` for a text corpus).
        * ``history``: ``history.csv`` files stacked, with ``dataset`` and ``variant`` columns
          prepended (``seed, step, tokens, train_loss, val_loss, lr, elapsed_seconds``).
        * ``trials``: Optuna's ``trials_dataframe()`` CSVs stacked likewise.
        * ``grad``: ``grad_stats.csv`` stacked likewise (empty if no run wrote one).
        * ``extras``: ``{"per_op": DataFrame(dataset, variant, seed, op, char_accuracy,
          exact_match), "samples": {(ds, var): {seed_key: [str]}},
          "predictions": {(ds, var): {seed_key: [{prompt, target, prediction}]}}}``.

    Missing optional files give empty frames / absent keys, never errors.
    """
    runs_dir = Path(runs_dir)
    rows, per_op_rows = [], []
    histories, trials, grads = [], [], []
    samples: dict[tuple[str, str], dict] = {}
    predictions: dict[tuple[str, str], dict] = {}
    for metrics_path in sorted(runs_dir.glob("*/*/metrics.json")):
        run_dir = metrics_path.parent
        doc = fileio.read_json(metrics_path)
        dataset = str(doc.get("dataset") or run_dir.parent.name)
        variant = str(doc.get("variant") or run_dir.name)
        for key, run in (doc.get("runs") or {}).items():
            seed = _seed_of(key, run)
            row = {col: run.get(col) for col in ABLATION_COLUMNS[3:]}
            rows.append({"dataset": dataset, "variant": variant, "seed": seed, **row})
            for op, values in (run.get("per_op") or {}).items():
                per_op_rows.append({
                    "dataset": dataset, "variant": variant, "seed": seed, "op": op,
                    "char_accuracy": (values or {}).get("char_accuracy"),
                    "exact_match": (values or {}).get("exact_match"),
                })
        for name, sink in (("history.csv", histories), ("trials.csv", trials),
                           ("grad_stats.csv", grads)):
            df = _read_csv_tagged(run_dir / name, dataset, variant)
            if df is not None:
                sink.append(df)
        if (run_dir / "examples.json").is_file():
            # Per seed: text samples (strings) or arithmetic predictions (dicts).
            examples = fileio.read_json(run_dir / "examples.json")
            first = next((v[0] for v in examples.values() if v), None)
            sink = predictions if isinstance(first, dict) else samples
            sink[(dataset, variant)] = examples

    ablation = pd.DataFrame(rows, columns=ABLATION_COLUMNS)
    for col in ABLATION_COLUMNS[2:]:
        if col in _INTEGER_COLUMNS:
            ablation[col] = _maybe_int(ablation[col])
        else:
            ablation[col] = pd.to_numeric(ablation[col], errors="coerce").astype(float)
    ablation = ablation.sort_values(["dataset", "variant", "seed"], kind="stable",
                                    ignore_index=True)
    per_op = pd.DataFrame(per_op_rows, columns=["dataset", "variant", "seed", "op",
                                                "char_accuracy", "exact_match"])
    for col in ("char_accuracy", "exact_match"):
        per_op[col] = pd.to_numeric(per_op[col], errors="coerce").astype(float)

    def stack(frames: list[pd.DataFrame]) -> pd.DataFrame:
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    extras = {"per_op": per_op, "samples": samples, "predictions": predictions}
    return ablation, stack(histories), stack(trials), stack(grads), extras


# --------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------

def _t_halfwidth(std: Any, n: Any) -> Any:
    """Half-width of the two-sided :data:`CONFIDENCE` Student-t interval of a mean:
    ``t_{(1+c)/2, n-1} * std / sqrt(n)``; NaN for n < 2 (no spread estimate)."""
    n = np.asarray(n, dtype=float)
    std = np.asarray(std, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        q = stats.t.ppf((1 + CONFIDENCE) / 2, np.where(n > 1, n - 1, np.nan))
        return q * std / np.sqrt(n)


def t_interval(values: Iterable[float]) -> tuple[float, float]:
    """:data:`CONFIDENCE` Student-t interval of the mean of ``values`` (NaNs dropped);
    ``(nan, nan)`` with fewer than two values. Also seaborn's ``errorbar`` callable."""
    x = np.asarray([v for v in values if np.isfinite(v)], dtype=float)
    if len(x) < 2:
        return (math.nan, math.nan)
    mean = float(x.mean())
    half = float(_t_halfwidth(x.std(ddof=1), len(x)))
    return (mean - half, mean + half)


def summarise(df: pd.DataFrame, metrics: Sequence[str] | None = None) -> pd.DataFrame:
    """Mean and 95% Student-t interval of each metric over seeds, per dataset x variant.

    Args:
        df: the ablation table (:func:`collect`).
        metrics: columns to summarise (default: those of :data:`METRICS`).

    Returns:
        Long format, columns :data:`SUMMARY_COLUMNS`, one row per dataset x variant x metric
        with at least one value: ``n`` (seeds with a value), ``mean``, ``std`` (sample SD,
        ddof=1), ``ci95_low``/``ci95_high`` = mean -/+ t_{0.975, n-1} * std / sqrt(n).
        With n = 1, std and the interval are NaN (one seed says nothing about seed variance).
        Rows keep the order of ``df`` (datasets, then variants) and of ``metrics``.
    """
    metrics = [m for m in (metrics or METRICS) if m in df.columns]
    if df.empty or not metrics:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    long = df.melt(id_vars=["dataset", "variant", "seed"], value_vars=metrics,
                   var_name="metric", value_name="value")
    long["value"] = pd.to_numeric(long["value"], errors="coerce").astype(float)
    long = long.dropna(subset=["value"])
    out = (long.groupby(["dataset", "variant", "metric"], sort=False)["value"]
           .agg(n="count", mean="mean", std="std").reset_index())
    half = _t_halfwidth(out["std"], out["n"])
    out["ci95_low"] = out["mean"] - half
    out["ci95_high"] = out["mean"] + half
    # Order: datasets and variants as in df, metrics as requested.
    order = {m: i for i, m in enumerate(metrics)}
    ds_order = {d: i for i, d in enumerate(pd.unique(df["dataset"]))}
    var_order = {v: i for i, v in enumerate(pd.unique(df["variant"]))}
    out = out.assign(_d=out["dataset"].map(ds_order), _v=out["variant"].map(var_order),
                     _m=out["metric"].map(order))
    out = out.sort_values(["_d", "_v", "_m"], kind="stable").drop(columns=["_d", "_v", "_m"])
    out["n"] = out["n"].astype(int)
    return out[SUMMARY_COLUMNS].reset_index(drop=True)


def _paired_test(variant: np.ndarray, base: np.ndarray) -> dict[str, float]:
    """Paired t-test of ``variant - base`` (scipy.stats.ttest_rel) and the t-interval of the
    mean difference. All differences zero gives p = NaN (the test is undefined) and is treated
    as "no significant difference"; constant non-zero differences give p = 0."""
    diff = variant - base
    n = len(diff)
    mean = float(diff.mean())
    half = float(_t_halfwidth(diff.std(ddof=1), n))
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        # zero-variance differences make scipy warn about precision loss / division by zero
        warnings.simplefilter("ignore", RuntimeWarning)
        res = stats.ttest_rel(variant, base)
    return {"mean_diff": mean, "ci95_low": mean - half, "ci95_high": mean + half,
            "t_stat": float(res.statistic), "p_value": float(res.pvalue)}


def compare(df: pd.DataFrame, baseline: str = BASELINE, alpha: float = ALPHA,
            metrics: Sequence[str] = COMPARED_METRICS) -> pd.DataFrame:
    """Every variant against ``baseline``, per dataset and metric, paired by seed.

    Method: for each dataset x metric x variant, keep the seeds on which both the variant and
    the baseline have a value; the difference ``variant - baseline`` per seed is summarised by
    its mean and 95% Student-t interval, and tested with the two-sided paired t-test
    (``scipy.stats.ttest_rel``). Within each dataset x metric the p-values of all variants form
    one family, corrected with Holm's step-down method
    (``statsmodels.stats.multitest.multipletests(method="holm")``) at family-wise ``alpha``.

    Verdict: ``"too few seeds"`` when fewer than :data:`MIN_SEEDS_FOR_TEST` seeds pair up (no
    test, not in the Holm family); else ``"better"``/``"worse"`` when Holm rejects (direction
    from the sign of the mean difference and whether the metric is higher-is-better: test loss
    lower is better, exact match and char accuracy higher is better); else
    ``"no significant difference"``.

    A metric is compared on a dataset only if the baseline has a value for it there (so exact
    match and char accuracy only on arithmetic). A dataset without a baseline gives no rows.

    Returns:
        Columns :data:`COMPARISON_COLUMNS`; ``mean_diff`` and the interval in the metric's unit.
    """
    rows = []
    for dataset, d in df.groupby("dataset", sort=False):
        variants = [v for v in pd.unique(d["variant"]) if v != baseline]
        if baseline not in set(d["variant"]):
            continue
        for metric in metrics:
            if metric not in d.columns:
                continue
            higher = bool(METRICS[metric][2])
            wide = (d.pivot_table(index="seed", columns="variant", values=metric, aggfunc="mean")
                    .reindex(columns=[baseline, *variants]))  # all-NaN columns come back as NaN
            if wide[baseline].notna().sum() == 0:
                continue
            family = []
            for variant in variants:
                pair = wide[[baseline, variant]].dropna()  # seeds both have: the pairing
                n = len(pair)
                row = {
                    "dataset": dataset, "metric": metric, "higher_is_better": higher,
                    "baseline": baseline, "variant": variant, "n_pairs": n,
                    "baseline_mean": float(pair[baseline].mean()) if n else math.nan,
                    "variant_mean": float(pair[variant].mean()) if n else math.nan,
                    "mean_diff": (float((pair[variant] - pair[baseline]).mean()) if n
                                  else math.nan),
                    "ci95_low": math.nan, "ci95_high": math.nan, "t_stat": math.nan,
                    "p_value": math.nan, "p_holm": math.nan, "reject_holm": False,
                    "verdict": VERDICT_FEW,
                }
                if n >= MIN_SEEDS_FOR_TEST:
                    row.update(_paired_test(pair[variant].to_numpy(float),
                                            pair[baseline].to_numpy(float)))
                    row["verdict"] = VERDICT_NSD
                    if np.isfinite(row["p_value"]):
                        family.append(len(rows))
                rows.append(row)
            if family:
                reject, p_holm, _, _ = multipletests([rows[i]["p_value"] for i in family],
                                                     alpha=alpha, method="holm")
                for i, rej, p in zip(family, reject, p_holm):
                    rows[i]["p_holm"] = float(p)
                    rows[i]["reject_holm"] = bool(rej)
                    if rej:
                        improved = (rows[i]["mean_diff"] > 0) == higher
                        rows[i]["verdict"] = VERDICT_BETTER if improved else VERDICT_WORSE
    out = pd.DataFrame(rows, columns=COMPARISON_COLUMNS)
    out["reject_holm"] = out["reject_holm"].astype(bool)
    out["higher_is_better"] = out["higher_is_better"].astype(bool)
    return out


# --------------------------------------------------------------------------------------------
# Writing files atomically
# --------------------------------------------------------------------------------------------

def _write_text(path: Path, text: str) -> Path:
    with fileio.atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def _write_csv(df: pd.DataFrame, path: Path) -> Path:
    with fileio.atomic_path(path) as tmp:
        df.to_csv(tmp, index=False)
    return Path(path)


# --------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------

@contextmanager
def _figure(path: Path, figsize: tuple[float, float] = (7.5, 4.5), nrows: int = 1,
            ncols: int = 1, **subplot_kw: Any) -> Iterator[tuple[Figure, np.ndarray]]:
    """A seaborn-styled figure saved (atomically, PNG, :data:`DPI`) to ``path`` on exit.

    Uses ``matplotlib.figure.Figure`` directly, not pyplot: no global figure registry to leak,
    no GUI backend needed (the PNG is drawn by Agg), and the caller's pyplot state is untouched.
    Style contexts are local for the same reason (``sns.set_theme`` would change global rc).
    """
    with sns.axes_style("whitegrid"), sns.plotting_context("notebook", font_scale=0.85):
        fig = Figure(figsize=figsize, dpi=DPI, layout="constrained")
        axes = fig.subplots(nrows, ncols, squeeze=False, **subplot_kw)
        yield fig, axes
        with fileio.atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", dpi=DPI)


def _palette(order: Sequence[str]) -> dict[str, Any]:
    """One fixed colour per variant, the same in every figure."""
    return dict(zip(order, sns.color_palette("tab10" if len(order) <= 10 else "husl",
                                             len(order))))


def _order(values: Iterable[str], preferred: Sequence[str] | None = None) -> list[str]:
    """Variants in ``preferred`` order (baseline first), then any others alphabetically."""
    present = list(dict.fromkeys(values))
    pref = list(preferred or [])
    if BASELINE in present and BASELINE not in pref:
        pref = [BASELINE] + pref
    ordered = [v for v in pref if v in present]
    return ordered + sorted(v for v in present if v not in ordered)


def _rotate_if_crowded(ax: Any, n: int) -> None:
    if n > 4:
        ax.tick_params(axis="x", labelrotation=30)
        for label in ax.get_xticklabels():
            label.set_horizontalalignment("right")


def plot_val_loss_curves(history: pd.DataFrame, dataset: str, path: Path,
                         order: Sequence[str] | None = None) -> Path | None:
    """Validation loss (nats/token) against optimizer step, one line per variant: the mean over
    seeds with a band of +-1 SD over seeds (SD, not a bootstrap CI: 3 seeds make a poor
    bootstrap). Returns ``path``, or None if there is no history for ``dataset``."""
    h = history[history["dataset"] == dataset] if len(history) else history
    if h.empty or "val_loss" not in h:
        return None
    h = h.dropna(subset=["val_loss"])
    order = _order(h["variant"], order)
    n_seeds = h.groupby("variant")["seed"].nunique().max()
    with _figure(path, figsize=(8.5, 4.8)) as (fig, axes):
        ax = axes[0, 0]
        sns.lineplot(data=h, x="step", y="val_loss", hue="variant", hue_order=order,
                     palette=_palette(order), errorbar="sd", marker="o", markersize=4, ax=ax)
        ax.set_title(f"{dataset}: validation loss during training\n"
                     f"(mean over {n_seeds} seed(s), band = ±1 SD)")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("validation loss (nats/token)")
        # outside the axes: with a dozen variants an inner legend hides the curves
        ax.legend(title="variant", loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    return Path(path)


def plot_test_loss(ablation: pd.DataFrame, dataset: str, path: Path,
                   order: Sequence[str] | None = None) -> Path | None:
    """Test loss (nats/token) per variant: each seed as a grey dot, the mean as a diamond with
    its 95% Student-t interval (the same interval as summary.csv); a dotted line marks the
    baseline mean. Returns ``path``, or None without test losses for ``dataset``."""
    d = ablation[(ablation["dataset"] == dataset)].dropna(subset=["test_loss"])
    if d.empty:
        return None
    order = _order(d["variant"], order)
    with _figure(path, figsize=(max(6.0, 1.1 * len(order) + 2.5), 4.5)) as (fig, axes):
        ax = axes[0, 0]
        sns.stripplot(data=d, x="variant", y="test_loss", order=order, color="0.5", size=5,
                      alpha=0.75, jitter=0.12, ax=ax)
        sns.pointplot(data=d, x="variant", y="test_loss", order=order, errorbar=t_interval,
                      color="C3", markers="D", linestyle="none", capsize=0.15, ax=ax)
        base = d.loc[d["variant"] == BASELINE, "test_loss"]
        handles = [
            Line2D([], [], color="0.5", marker="o", linestyle="none", label="one seed"),
            Line2D([], [], color="C3", marker="D", label="mean ± 95% t-interval"),
        ]
        if len(base):
            ax.axhline(base.mean(), color="0.3", linestyle=":", linewidth=1)
            handles.append(Line2D([], [], color="0.3", linestyle=":", label="baseline mean"))
        ax.set_title(f"{dataset}: test loss per variant")
        ax.set_xlabel("variant")
        ax.set_ylabel("test loss (nats/token)")
        ax.legend(handles=handles, loc="best")
        _rotate_if_crowded(ax, len(order))
    return Path(path)


def plot_forest(comparisons: pd.DataFrame, dataset: str, path: Path,
                metric: str = "test_loss", order: Sequence[str] | None = None) -> Path | None:
    """Forest plot of ``variant - baseline`` in ``metric`` per variant: the mean paired
    difference and its 95% t-interval, coloured by the Holm-corrected verdict, with the Holm
    p-value written beside it; a vertical line at 0 (no difference). Returns ``path``, or None
    when ``dataset`` has no comparison for ``metric``."""
    c = comparisons[(comparisons["dataset"] == dataset) & (comparisons["metric"] == metric)]
    c = c.dropna(subset=["mean_diff"])
    if c.empty:
        return None
    order = [v for v in _order(c["variant"], order) if v != BASELINE]
    c = c.set_index("variant").loc[order].reset_index()
    c["y"] = np.arange(len(c))
    label, unit, higher = METRICS[metric]
    with _figure(path, figsize=(7.5, 1.0 + 0.6 * len(c) + 1.2)) as (fig, axes):
        ax = axes[0, 0]
        ax.axvline(0, color="black", linewidth=1, linestyle="--")
        for _, r in c.iterrows():
            colour = VERDICT_COLORS[r["verdict"]]
            if np.isfinite(r["ci95_low"]):
                # caps keep a narrow interval visible behind its marker
                ax.errorbar(r["mean_diff"], r["y"], fmt="none", ecolor=colour, elinewidth=2,
                            capsize=6, capthick=2,
                            xerr=[[r["mean_diff"] - r["ci95_low"]],
                                  [r["ci95_high"] - r["mean_diff"]]])
        sns.scatterplot(data=c, x="mean_diff", y="y", hue="verdict",
                        hue_order=[v for v in VERDICT_COLORS if v in set(c["verdict"])],
                        palette=VERDICT_COLORS, s=90, marker="D", zorder=3, ax=ax)
        for _, r in c.iterrows():
            right = r["ci95_high"] if np.isfinite(r["ci95_high"]) else r["mean_diff"]
            if r["verdict"] == VERDICT_FEW:
                note = f"n={r['n_pairs']}: no test"
            else:
                star = " *" if r["reject_holm"] else ""
                note = f"p_Holm={r['p_holm']:.2g}{star}" if np.isfinite(r["p_holm"]) else "p n/a"
            ax.annotate(note, (right, r["y"]), xytext=(6, 0), textcoords="offset points",
                        va="center", fontsize=8)
        ax.set_yticks(c["y"], c["variant"])
        ax.set_ylim(len(c) - 0.5, -0.5)  # first variant on top, as in the tables
        ax.margins(x=0.25)
        better = "> 0" if higher else "< 0"
        ax.set_xlabel(f"Δ {label} (variant − baseline){', ' + unit if unit else ''}; "
                      f"{better} = better")
        ax.set_ylabel("variant")
        ax.set_title(f"{dataset}: difference to baseline in {label}\n"
                     f"paired by seed, 95% t-interval; * = significant after Holm (α={ALPHA})")
        ax.legend(title="verdict", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return Path(path)


def plot_by_op_heatmap(per_op: pd.DataFrame, path: Path, metric: str = "exact_match",
                       order: Sequence[str] | None = None,
                       datasets: Sequence[str] | None = None) -> Path | None:
    """Heatmap of the mean over seeds of ``metric`` (fraction in [0, 1]) per arithmetic
    operation (rows) x variant (columns), one panel per dataset with per-op results.
    Returns ``path``, or None when no run reported per-op results."""
    p = per_op.dropna(subset=[metric]) if len(per_op) else per_op
    if datasets is not None and len(p):
        p = p[p["dataset"].isin(datasets)]
    if p.empty:
        return None
    label = METRICS[metric][0]
    ds_list = list(pd.unique(p["dataset"]))
    variants = _order(p["variant"], order)
    n_ops = p["op"].nunique()
    with _figure(path, figsize=(1.1 * len(variants) + 3.0, (0.5 * n_ops + 1.6) * len(ds_list)),
                 nrows=len(ds_list)) as (fig, axes):
        for ax, ds in zip(axes[:, 0], ds_list):
            q = p[p["dataset"] == ds]
            table = q.pivot_table(index="op", columns="variant", values=metric, aggfunc="mean")
            table = table.reindex(index=list(pd.unique(q["op"])),
                                  columns=[v for v in variants if v in table.columns])
            sns.heatmap(table, annot=True, fmt=".2f", vmin=0, vmax=1, cmap="viridis",
                        linewidths=0.5, cbar_kws={"label": f"{label} (fraction)"}, ax=ax)
            ax.set_title(f"{ds}: {label} by operation (mean over seeds)")
            ax.set_xlabel("variant")
            ax.set_ylabel("operation")
            ax.tick_params(axis="y", labelrotation=0)
    return Path(path)


def plot_tuning(trials: pd.DataFrame, dataset: str, path: Path,
                order: Sequence[str] | None = None, steps: int | None = None) -> Path | None:
    """Optuna trials: learning rate (log x-axis) against the trial's validation loss
    (nats/token), colour = variant, marker = d_model. Completed trials are solid, pruned trials
    faded (their value is the last reported intermediate loss), failed trials omitted; a star
    marks each variant's best completed trial. Returns ``path``, or None without trials."""
    t = trials[trials["dataset"] == dataset] if len(trials) else trials
    if t.empty or "params_lr" not in t or "value" not in t:
        return None
    t = t.copy()
    t["state"] = t.get("state", pd.Series("COMPLETE", index=t.index)).fillna("COMPLETE")
    t = t[t["state"].isin(["COMPLETE", "PRUNED"])].dropna(subset=["value", "params_lr"])
    if t.empty:
        return None
    order = _order(t["variant"], order)
    palette = _palette(order)
    style = None
    markers: Any = True
    style_order = None
    if "params_d_model" in t and t["params_d_model"].notna().any():
        t["d_model"] = _maybe_int(t["params_d_model"]).astype(str)
        style = "d_model"
        style_order = sorted(t["d_model"].unique(), key=lambda s: float(s) if s != "<NA>" else 0)
        shapes = ["o", "s", "^", "P", "X", "v", "<", ">"]
        markers = {s: shapes[i % len(shapes)] for i, s in enumerate(style_order)}
    with _figure(path, figsize=(8.5, 4.8)) as (fig, axes):
        ax = axes[0, 0]
        # shared so both layers map variant -> colour and d_model -> marker identically
        common = dict(x="params_lr", y="value", hue="variant", hue_order=order,
                      palette=palette, style=style, style_order=style_order, markers=markers,
                      ax=ax)
        done = t[t["state"] == "COMPLETE"]
        pruned = t[t["state"] == "PRUNED"]
        if len(pruned):
            sns.scatterplot(data=pruned, s=40, alpha=0.3, legend=False, **common)
        if len(done):
            sns.scatterplot(data=done, s=60, alpha=0.9, **common)
            best = done.loc[done.groupby("variant")["value"].idxmin()]
            sns.scatterplot(data=best, x="params_lr", y="value", hue="variant",
                            hue_order=order, palette=palette, marker="*", s=320,
                            edgecolor="black", linewidth=0.8, legend=False, ax=ax, zorder=4)
        ax.set_xscale("log")
        # 1-2-5 labelled ticks: a tuning range often spans less than one decade, where
        # matplotlib's defaults give a single labelled tick or overlapping minor labels
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        handles, labels = ax.get_legend_handles_labels()
        handles += [Line2D([], [], marker="*", color="0.4", markeredgecolor="black",
                           markersize=13, linestyle="none"),
                    Line2D([], [], marker="o", color="0.4", alpha=0.3, linestyle="none")]
        labels += ["best completed trial", "faded: pruned trial"]
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        n_done, n_pruned = len(done), len(pruned)
        after = f" after {steps} steps" if steps else ""
        ax.set_title(f"{dataset}: tuning trials ({n_done} completed, {n_pruned} pruned)")
        ax.set_xlabel("learning rate (log scale)")
        ax.set_ylabel(f"validation loss{after} (nats/token)")
    return Path(path)


def plot_params_vs_loss(ablation: pd.DataFrame, dataset: str, path: Path,
                        order: Sequence[str] | None = None) -> Path | None:
    """Non-embedding parameter count against test loss (nats/token), one point per seed,
    colour and marker = variant. Shows whether a variant's gain is just extra capacity.
    Returns ``path``, or None without parameter counts for ``dataset``."""
    d = ablation[ablation["dataset"] == dataset].dropna(
        subset=["test_loss", "n_params_non_embedding"]).copy()
    if d.empty:
        return None
    d["n_params_non_embedding"] = d["n_params_non_embedding"].astype(float)
    order = _order(d["variant"], order)
    with _figure(path, figsize=(7.5, 4.5)) as (fig, axes):
        ax = axes[0, 0]
        sns.scatterplot(data=d, x="n_params_non_embedding", y="test_loss", hue="variant",
                        hue_order=order, palette=_palette(order), style="variant",
                        style_order=order, s=70, alpha=0.85, ax=ax)
        ax.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))  # exact counts
        ax.margins(x=0.1)
        ax.set_title(f"{dataset}: size vs test loss (one point per seed)")
        ax.set_xlabel("non-embedding parameters (count)")
        ax.set_ylabel("test loss (nats/token)")
        ax.legend(title="variant", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return Path(path)


def plot_grad_flow(grad: pd.DataFrame, dataset: str, path: Path,
                   order: Sequence[str] | None = None) -> Path | None:
    """Heatmap of the fraction of gradient entries with |grad| < 1e-8 after the last training
    step (mean over seeds), parameter group (rows) x variant (columns). High values flag dead
    units or vanishing gradients. Returns ``path``, or None without grad stats."""
    g = grad[grad["dataset"] == dataset] if len(grad) else grad
    if g.empty or "frac_near_zero" not in g:
        return None
    order = _order(g["variant"], order)
    table = g.pivot_table(index="group", columns="variant", values="frac_near_zero",
                          aggfunc="mean")
    table = table.reindex(index=list(pd.unique(g["group"])),
                          columns=[v for v in order if v in table.columns])
    with _figure(path, figsize=(1.2 * len(order) + 4.0, 0.4 * len(table) + 1.8)) as (fig, axes):
        ax = axes[0, 0]
        sns.heatmap(table, annot=True, fmt=".2f", vmin=0, vmax=1, cmap="rocket_r",
                    linewidths=0.5, cbar_kws={"label": "fraction of |grad| < 1e-8"}, ax=ax)
        ax.set_title(f"{dataset}: near-zero gradients after the last step (mean over seeds)")
        ax.set_xlabel("variant")
        ax.set_ylabel("parameter group")
        ax.tick_params(axis="y", labelrotation=0)
    return Path(path)


def _visible(token: str) -> str:
    """A printable stand-in for whitespace/control characters in tick labels."""
    return {" ": "␣", "\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(token, token)


def plot_attention(maps: Mapping[str, np.ndarray], tokens: Sequence[str], title: str,
                   path: Path) -> Path:
    """Attention weights on one input, one heatmap per panel (e.g. per variant).

    Args:
        maps: panel label -> array ``(T, T)``; ``m[i, j]`` is the weight query position i gives
            to key position j (rows sum to 1; causal maps are lower-triangular), e.g. the last
            layer's weights averaged over heads.
        tokens: the T input characters (ticks; whitespace shown as ␣ / \\n).
        title: figure title; path: PNG to write.

    Raises:
        ValueError: a map is not square T x T with T = ``len(tokens)``, or ``maps`` is empty.
    """
    arrays = {k: np.asarray(v, dtype=float) for k, v in maps.items()}
    t_len = len(tokens)
    if not arrays or any(m.shape != (t_len, t_len) for m in arrays.values()):
        raise ValueError(f"plot_attention: expected (T, T) maps with T = len(tokens) = {t_len}, "
                         f"got {[m.shape for m in arrays.values()]}")
    labels = [_visible(t) for t in tokens]
    step = max(1, math.ceil(t_len / 24))
    ncols = min(len(arrays), 4)
    nrows = math.ceil(len(arrays) / ncols)
    with _figure(path, figsize=(3.3 * ncols + 1.2, 3.3 * nrows + 0.8), nrows=nrows,
                 ncols=ncols) as (fig, axes):
        for ax in axes.ravel()[len(arrays):]:
            ax.set_visible(False)
        for i, (name, m) in enumerate(arrays.items()):
            ax = axes.ravel()[i]
            sns.heatmap(m, vmin=0, vmax=1, cmap="viridis", cbar=False, square=True,
                        xticklabels=False, yticklabels=False, ax=ax)
            ticks = np.arange(0, t_len, step) + 0.5
            ax.set_xticks(ticks, labels[::step] if i // ncols == nrows - 1 else [], rotation=90,
                          fontsize=6)
            ax.set_yticks(ticks, labels[::step] if i % ncols == 0 else [], fontsize=6)
            ax.set_title(name, fontsize=9)
        fig.supxlabel("key position (attended to)")
        fig.supylabel("query position")
        fig.colorbar(axes[0, 0].collections[0], ax=axes.ravel().tolist(), shrink=0.6,
                     label="attention weight")
        fig.suptitle(title)
    return Path(path)


def _char_class(ch: str) -> str:
    if ch.isspace():
        return "whitespace"
    if ch.isdigit():
        return "digit"
    if ch.isalpha():
        return "upper case" if ch.isupper() else "lower case"
    return "punctuation/other"


def plot_embedding_pca(embs: Mapping[str, np.ndarray], chars: Sequence[str], title: str,
                       path: Path) -> Path:
    """Token embeddings projected on their first two principal components, one panel per entry
    of ``embs`` (e.g. per variant); points labelled with their character, coloured by class.

    PCA: SVD of the column-centred matrix; each panel's axes give the share of variance.

    Args:
        embs: panel label -> ``(vocab_size, d_model)`` embedding weights.
        chars: the character of each row (len == vocab_size).
        title: figure title; path: PNG to write.

    Raises:
        ValueError: an array is not 2-D, has fewer than 2 columns, or rows != ``len(chars)``;
            or ``embs`` is empty.
    """
    arrays = {k: np.asarray(v, dtype=float) for k, v in embs.items()}
    if not arrays or any(e.ndim != 2 or e.shape[0] != len(chars) or e.shape[1] < 2
                         for e in arrays.values()):
        raise ValueError(f"plot_embedding_pca: expected arrays of shape (len(chars)="
                         f"{len(chars)}, d >= 2), got {[e.shape for e in arrays.values()]}")
    classes = [_char_class(c) for c in chars]
    ncols = min(len(arrays), 4)
    nrows = math.ceil(len(arrays) / ncols)
    with _figure(path, figsize=(4.2 * ncols, 3.8 * nrows + 0.6), nrows=nrows,
                 ncols=ncols) as (fig, axes):
        for ax in axes.ravel()[len(arrays):]:
            ax.set_visible(False)
        for i, (name, emb) in enumerate(arrays.items()):
            ax = axes.ravel()[i]
            centred = emb - emb.mean(axis=0)
            _, s, vt = np.linalg.svd(centred, full_matrices=False)
            pcs = centred @ vt[:2].T
            explained = s**2 / max(float(np.sum(s**2)), np.finfo(float).tiny)
            d = pd.DataFrame({"pc1": pcs[:, 0], "pc2": pcs[:, 1], "class": classes})
            sns.scatterplot(data=d, x="pc1", y="pc2", hue="class", s=25, alpha=0.6, ax=ax,
                            legend=i == 0)
            for (x, y), ch in zip(pcs[:, :2], chars):
                ax.annotate(_visible(ch), (x, y), xytext=(2, 2), textcoords="offset points",
                            fontsize=6)
            ax.set_title(name, fontsize=9)
            ax.set_xlabel(f"PC1 ({explained[0]:.0%} of variance)")
            ax.set_ylabel(f"PC2 ({explained[1]:.0%} of variance)")
        if axes[0, 0].get_legend() is not None:
            axes[0, 0].legend(title="character class", fontsize=7, title_fontsize=7)
        fig.suptitle(title)
    return Path(path)


# --------------------------------------------------------------------------------------------
# Markdown
# --------------------------------------------------------------------------------------------

def _md_table(df: pd.DataFrame) -> str:
    """A GitHub-flavoured markdown table (kept local so the report needs no ``tabulate``)."""
    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")
    header = "| " + " | ".join(cell(c) for c in df.columns) + " |"
    rule = "|" + "|".join("---" for _ in df.columns) + "|"
    body = ["| " + " | ".join(cell(v) for v in row) + " |"
            for row in df.itertuples(index=False, name=None)]
    return "\n".join([header, rule, *body])


def _num(x: Any, digits: int = 3) -> str:
    """Fixed-point with ``digits`` decimals, "–" for missing."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)) or pd.isna(x):
        return "–"
    return f"{float(x):.{digits}f}"


def _int(x: Any) -> str:
    if x is None or pd.isna(x):
        return "–"
    return f"{int(round(float(x))):,}"


def _p(x: Any) -> str:
    if x is None or pd.isna(x):
        return "–"
    return "<0.001" if x < 0.001 else f"{x:.3f}"


def _digits(metric: str) -> int:
    return {"perplexity": 2, "train_seconds": 1, "tokens_per_second": 0}.get(metric, 3)


def _fence(text: str) -> str:
    """A code block whose fence is longer than any backtick run inside ``text`` (a generated
    sample may well contain ``` and would otherwise close the block)."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text}\n{fence}"


def _code_span(text: str) -> str:
    text = str(text).replace("\n", "\\n")
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _summary_table(summary: pd.DataFrame, dataset: str, order: Sequence[str]) -> str:
    s = summary[summary["dataset"] == dataset]
    metrics = [m for m in METRICS if m in set(s["metric"])
               and m not in ("train_seconds", "tokens_per_second")]
    rows = []
    for variant in order:
        v = s[s["variant"] == variant].set_index("metric")
        if v.empty:
            continue
        row = {"variant": variant, "seeds": int(v["n"].max())}
        for m in metrics:
            label, unit, _ = METRICS[m]
            head = f"{label} ({unit})" if unit else label
            if m not in v.index:
                row[head] = "–"
                continue
            r = v.loc[m]
            digits = _digits(m)
            if np.isfinite(r["ci95_low"]):
                half = (r["ci95_high"] - r["ci95_low"]) / 2
                row[head] = f"{_num(r['mean'], digits)} ± {_num(half, digits)}"
            else:
                row[head] = f"{_num(r['mean'], digits)} (no CI, n={int(r['n'])})"
        rows.append(row)
    return _md_table(pd.DataFrame(rows)) if rows else "_No results._"


def _comparison_table(comparisons: pd.DataFrame, dataset: str) -> str:
    c = comparisons[comparisons["dataset"] == dataset]
    if c.empty:
        return ("_No comparisons: they need runs of the baseline and of at least one other "
                "variant on this dataset._")
    rows = []
    for _, r in c.iterrows():
        label, unit, higher = METRICS[r["metric"]]
        digits = _digits(r["metric"])
        verdict = r["verdict"]
        mark = VERDICT_MARKS.get(verdict, "")
        shown = f"**{mark} {verdict}**" if mark else verdict
        ci = (f"[{_num(r['ci95_low'], digits)}, {_num(r['ci95_high'], digits)}]"
              if np.isfinite(r["ci95_low"]) else "–")
        rows.append({
            "metric": f"{label} ({'higher' if higher else 'lower'} is better)",
            "variant": r["variant"],
            "paired seeds": int(r["n_pairs"]),
            "baseline mean": _num(r["baseline_mean"], digits),
            "variant mean": _num(r["variant_mean"], digits),
            "Δ (variant − baseline)": _num(r["mean_diff"], digits),
            "95% CI of Δ": ci,
            "p (paired t)": _p(r["p_value"]),
            "p (Holm)": _p(r["p_holm"]),
            "verdict": shown,
        })
    return _md_table(pd.DataFrame(rows))


def _tuned_table(ablation: pd.DataFrame, dataset: str, order: Sequence[str]) -> str:
    d = ablation[ablation["dataset"] == dataset]
    rows = []
    for variant in order:
        v = d[d["variant"] == variant]
        if v.empty:
            continue
        lrs = v["lr"].dropna().unique()
        widths = v["d_model"].dropna().unique()
        rows.append({
            "variant": variant,
            # tuning picks one value per dataset x variant; several would mean stale runs
            "lr": ", ".join(f"{x:.3g}" for x in lrs) or "–",
            "d_model": ", ".join(_int(x) for x in widths) or "–",
            "parameters": _int(v["n_params"].max()),
            "non-embedding parameters": _int(v["n_params_non_embedding"].max()),
            "FLOPs/token": _int(v["flops_per_token"].max()),
            "throughput (tokens/s, mean)": _int(v["tokens_per_second"].mean()),
            "train time (s, mean)": _num(v["train_seconds"].mean(), 1),
        })
    return _md_table(pd.DataFrame(rows)) if rows else "_No runs._"


def _samples_section(extras: Mapping[str, Any], dataset: str, order: Sequence[str],
                     seeds: Sequence[int], max_chars: int = 600,
                     n_predictions: int = 5) -> list[str]:
    lines: list[str] = []

    def first_seed_key(by_seed: Mapping[str, Any]) -> str | None:
        keys = [k for k in by_seed if by_seed[k]]
        preferred = [f"seed_{s}" for s in seeds if f"seed_{s}" in keys]
        return (preferred or sorted(keys) or [None])[0]

    samples = extras.get("samples", {})
    shown = [(v, samples[(dataset, v)]) for v in order if (dataset, v) in samples]
    if shown:
        lines += ["### Samples", "",
                  "First sample of the first seed of each variant (truncated to "
                  f"{max_chars} characters).", ""]
        for variant, by_seed in shown:
            key = first_seed_key(by_seed)
            if key is None:
                continue
            text = str(by_seed[key][0])[:max_chars]
            lines += [f"**{variant}** ({key}):", "", _fence(text), ""]
    predictions = extras.get("predictions", {})
    shown = [(v, predictions[(dataset, v)]) for v in order if (dataset, v) in predictions]
    if shown:
        lines += ["### Predictions", "",
                  f"Up to {n_predictions} greedy-decoded test problems of the first seed of each "
                  "variant.", ""]
        for variant, by_seed in shown:
            key = first_seed_key(by_seed)
            if key is None:
                continue
            rows = [{"prompt": _code_span(p.get("prompt", "")),
                     "target": _code_span(p.get("target", "")),
                     "prediction": _code_span(p.get("prediction", "")),
                     "correct": "✓" if p.get("prediction") == p.get("target") else "✗"}
                    for p in by_seed[key][:n_predictions]]
            lines += [f"**{variant}** ({key}):", "", _md_table(pd.DataFrame(rows)), ""]
    return lines


def _methodology(cfg: StudyConfig, ablation: pd.DataFrame,
                 environment: Mapping[str, Any] | None) -> list[str]:
    tr, tu, m, ev = cfg.train, cfg.tune, cfg.model, cfg.evaluate
    datasets = ", ".join(f"{name} ({d.kind})" for name, d in cfg.datasets.items())
    changes = [f"{v}: " + ", ".join(f"{k}={val}" for k, val in cfg.variants[v].items())
               for v in cfg.study_variants if cfg.variants.get(v)]
    tokens = tr.steps * tr.batch_size * m.context_length
    text = (
        f"Each of {len(cfg.study_variants)} variants was trained on each of "
        f"{len(cfg.datasets)} datasets ({datasets}) with {len(cfg.seeds)} seeds "
        f"({', '.join(map(str, cfg.seeds))}); the same seeds are used for every variant, so "
        f"results can be paired by seed. "
        f"The baseline is a {m.n_layers}-layer GPT with {m.n_heads} heads, {m.ffn} "
        f"feed-forward, {m.norm_placement}-{m.norm}, {m.position} positions and a context of "
        f"{m.context_length} characters" + (f"; the variants change {'; '.join(changes)}. "
                                            if changes else ". ") +
        f"Before training, the learning rate (log-uniform in [{tu.lr_low:g}, {tu.lr_high:g}]) "
        f"and d_model (one of {', '.join(map(str, tu.d_model_choices))}) were tuned per "
        f"dataset x variant with Optuna: {tu.n_trials} trials of {tu.steps} steps each, "
        f"objective validation loss, {tu.pruner} pruner, sampler seed {tu.sampler_seed}; the "
        f"tuned values (per variant below) replace the configured learning rate {tr.lr:g} and "
        f"width {m.d_model}. "
        f"Each run then trained for {tr.steps} optimizer steps of {tr.batch_size} sequences x "
        f"{m.context_length} tokens ({tokens:,} tokens), {tr.lr_schedule} learning-rate "
        f"schedule with {tr.warmup_steps} warm-up steps, weight decay {tr.weight_decay:g}, "
        f"betas ({tr.beta1:g}, {tr.beta2:g}), gradient clipping at {tr.grad_clip:g}, "
        f"validation every {tr.eval_interval} steps over {tr.eval_iters} batches. "
        f"Test loss is measured on up to {ev.max_batches} batches of held-out data; arithmetic "
        f"answers are greedy-decoded for up to {ev.max_problems} test problems."
    )
    if cfg.match_params:
        text += " Widths were adjusted so that every variant matches the baseline's parameter count."
    stats_text = (
        f"Statistics: each table gives the mean over seeds ± the half-width of its "
        f"{CONFIDENCE:.0%} Student-t interval. Variants are compared with the baseline by a "
        f"two-sided paired t-test on the per-seed differences (scipy.stats.ttest_rel); the "
        f"p-values of all variants within a dataset x metric are corrected with Holm's method "
        f"(statsmodels multipletests) at a family-wise α = {ALPHA}. With fewer than "
        f"{MIN_SEEDS_FOR_TEST} paired seeds no test is run."
    )
    lines = ["## Methodology", "", text, "", stats_text, ""]
    env = dict(environment or {})
    hardware = next((env[k] for k in ("hardware", "device", "gpu", "cpu") if env.get(k)), None)
    torch_v = next((env[k] for k in ("torch", "torch_version") if env.get(k)), None)
    total = ablation["train_seconds"].sum(min_count=1)
    if hardware or torch_v:
        sentence = (f"Runs executed on {hardware or 'unrecorded hardware'} with torch "
                    f"{torch_v or '(version not recorded)'}")
    else:
        sentence = "Environment not recorded"
    if pd.notna(total):
        sentence += (f"; training took {total:,.1f} s in total over {len(ablation)} runs "
                     f"(sum of train_seconds)")
    lines += [sentence + ".", ""]
    if env:
        lines += ["Environment:", ""]
        for key, value in env.items():
            if isinstance(value, Mapping):
                value = ", ".join(f"{k}={_env_value(v)}" for k, v in value.items())
            lines.append(f"- {key}: {_env_value(value)}")
        lines.append("")
    return lines


def _env_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.1f}" if abs(v) >= 10 else f"{v:.3g}"
    return str(v)


def render_markdown(cfg: StudyConfig, ablation: pd.DataFrame, summary: pd.DataFrame,
                    comparisons: pd.DataFrame, extras: Mapping[str, Any],
                    figures: Sequence[tuple[str | None, str, str]],
                    environment: Mapping[str, Any] | None = None,
                    order: Sequence[str] | None = None,
                    notes: Sequence[str] = ()) -> str:
    """The text of ``report.md``.

    Args:
        figures: ``(dataset or None, caption, relative path)`` per figure written; each appears
            in its dataset's section (None: in the closing section), linked relatively.
        order: variant order of every table (baseline first).
        notes: extra lines for the data section (e.g. missing or ignored runs).
    """
    order = list(order or _order(ablation["variant"]))
    datasets = list(pd.unique(ablation["dataset"]))
    lines = [
        "# Ablation study report", "",
        f"{len(ablation)} runs: {len(datasets)} dataset(s) x "
        f"{ablation['variant'].nunique()} variant(s) x {ablation['seed'].nunique()} seed(s). "
        "Generated by `lmablate.report` "
        "from the run outputs; every number below is computed, none typed by hand.", "",
        "**How to read this report.** Losses are cross-entropy in nats per character (lower is "
        "better); bits/char = loss / ln 2. Tables show the mean over seeds ± the half-width of "
        f"its {CONFIDENCE:.0%} t-interval. A variant is called better or worse than the "
        f"baseline only when the paired t-test survives Holm's correction (α = {ALPHA}): "
        f"**▲ better** / **▼ worse**; anything else is \"no significant difference\", which "
        "is not evidence that the variants are equal. Raw numbers are in `ablation.csv`, "
        "`summary.csv` (long format: one row per dataset x variant x metric) and "
        "`comparisons.csv`.", "",
    ]
    lines += _methodology(cfg, ablation, environment)
    if notes:
        lines += ["Data notes:", "", *[f"- {n}" for n in notes], ""]

    for ds in datasets:
        lines += [f"## {ds}", ""]
        lines += [f"### Summary (mean ± {CONFIDENCE:.0%} CI half-width over seeds)", "",
                  _summary_table(summary, ds, order), ""]
        s = summary[summary["dataset"] == ds]
        if len(s) and int(s["n"].min()) < 2:
            lines += ["Some cells rest on a single seed: their spread, and hence their "
                      "confidence interval, cannot be estimated.", ""]
        lines += ["### Comparison with the baseline", "", _comparison_table(comparisons, ds), ""]
        c = comparisons[comparisons["dataset"] == ds]
        if len(c) and (c["verdict"] == VERDICT_FEW).any():
            few = list(pd.unique(c.loc[c["verdict"] == VERDICT_FEW, "variant"]))
            lines += [f"Too few seeds to conclude for {', '.join(few)}: fewer than "
                      f"{MIN_SEEDS_FOR_TEST} seeds pair with the baseline, so no test was run "
                      "and the differences shown are descriptive only.", ""]
        if len(c):
            wins = c[c["verdict"] == VERDICT_BETTER]
            losses = c[c["verdict"] == VERDICT_WORSE]
            def listing(rows: pd.DataFrame) -> str:
                return ", ".join(f"{r.variant} ({METRICS[r.metric][0]})"
                                 for r in rows.itertuples()) or "none"
            lines += [f"Significantly better than the baseline: {listing(wins)}. "
                      f"Significantly worse: {listing(losses)}.", ""]
        lines += ["### Tuned hyper-parameters, size and throughput", "",
                  _tuned_table(ablation, ds, order), ""]
        ds_figs = [(cap, rel) for d, cap, rel in figures if d == ds]
        if ds_figs:
            lines += ["### Figures", ""]
            for caption, rel in ds_figs:
                lines += [f"**{caption}**", "", f"![{Path(rel).stem}]({rel})", ""]
        lines += _samples_section(extras, ds, order, cfg.seeds)
    other = [(cap, rel) for d, cap, rel in figures if d is None]
    if other:
        lines += ["## Other figures", ""]
        for caption, rel in other:
            lines += [f"**{caption}**", "", f"![{Path(rel).stem}]({rel})", ""]
    return "\n".join(lines).rstrip() + "\n"


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------

def _restrict_to_study(cfg: StudyConfig, ablation: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Keep the runs the config asks for; describe missing and ignored (stale) runs."""
    notes = []
    keep = (ablation["dataset"].isin(list(cfg.datasets))
            & ablation["variant"].isin(list(cfg.study_variants))
            & ablation["seed"].isin(list(cfg.seeds)))
    ignored = ablation[~keep]
    if len(ignored):
        names = sorted({f"{r.dataset}/{r.variant}/seed {r.seed}" for r in ignored.itertuples()})
        notes.append(f"{len(ignored)} run(s) under the runs directory are not part of the "
                     f"configured study and were ignored: {', '.join(names[:10])}"
                     f"{' ...' if len(names) > 10 else ''}.")
    kept = ablation[keep]
    found = set(zip(kept["dataset"], kept["variant"], kept["seed"].astype(int)))
    missing = [f"{d}/{v}/seed {s}" for d in cfg.datasets for v in cfg.study_variants
               for s in cfg.seeds if (d, v, s) not in found]
    if missing:
        notes.append(f"{len(missing)} configured run(s) have no results: "
                     f"{', '.join(missing[:10])}{' ...' if len(missing) > 10 else ''}.")
    return kept, notes


def _filter(df: pd.DataFrame, cfg: StudyConfig) -> pd.DataFrame:
    if df.empty:
        return df
    keep = df["dataset"].isin(list(cfg.datasets)) & df["variant"].isin(list(cfg.study_variants))
    if "seed" in df:
        keep &= df["seed"].isin(list(cfg.seeds))
    return df[keep]


def _sort(df: pd.DataFrame, datasets: Sequence[str], order: Sequence[str]) -> pd.DataFrame:
    """Rows in config order of datasets, then variants (baseline first), then seed."""
    ds_rank = {d: i for i, d in enumerate(datasets)}
    var_rank = {v: i for i, v in enumerate(order)}
    return (df.assign(_d=df["dataset"].map(ds_rank), _v=df["variant"].map(var_rank))
            .sort_values(["_d", "_v", "seed"], kind="stable")
            .drop(columns=["_d", "_v"]).reset_index(drop=True))


def build_report(cfg: StudyConfig, runs_dir: Path, out_dir: Path,
                 environment: dict | None = None,
                 extra_figures: Sequence[tuple[str | None, str, Path]] = ()) -> dict:
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

    Returns:
        ``{"report", "ablation", "summary", "comparisons": Path, "figures": [Path, ...]}``.

    Raises:
        FileNotFoundError: no ``metrics.json`` of the configured study under ``runs_dir``.
    """
    runs_dir, out_dir = Path(runs_dir), Path(out_dir)
    ablation, history, trials, grad, extras = collect(runs_dir)
    ablation, notes = _restrict_to_study(cfg, ablation)
    if ablation.empty:
        raise FileNotFoundError(
            f"report: no results of the configured study under {runs_dir} (expected "
            f"<dataset>/<variant>/metrics.json for datasets {', '.join(cfg.datasets)})")
    history, trials, grad = _filter(history, cfg), _filter(trials, cfg), _filter(grad, cfg)
    per_op = _filter(extras["per_op"], cfg)
    extras = {**extras, "per_op": per_op}

    order = _order(ablation["variant"], cfg.study_variants)
    datasets = [d for d in cfg.datasets if d in set(ablation["dataset"])]
    ablation = _sort(ablation, datasets, order)
    summary = summarise(ablation)
    comparisons = compare(ablation, baseline=BASELINE)

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "ablation": _write_csv(ablation[ABLATION_COLUMNS], out_dir / "ablation.csv"),
        "summary": _write_csv(summary, out_dir / "summary.csv"),
        "comparisons": _write_csv(comparisons, out_dir / "comparisons.csv"),
    }

    fig_dir = out_dir / "figures"
    figures: list[tuple[str | None, str, Path | None]] = []
    for ds in datasets:
        figures += [
            (ds, f"{ds}: validation loss vs step (mean ± 1 SD over seeds)",
             plot_val_loss_curves(history, ds, fig_dir / f"val_loss_curves_{ds}.png", order)),
            (ds, f"{ds}: test loss per variant (dots: seeds; diamond: mean ± 95% t-interval)",
             plot_test_loss(ablation, ds, fig_dir / f"test_loss_{ds}.png", order)),
            (ds, f"{ds}: test-loss difference to baseline (paired 95% t-interval, Holm)",
             plot_forest(comparisons, ds, fig_dir / f"forest_{ds}.png", "test_loss", order)),
        ]
        if not per_op.empty and ds in set(per_op["dataset"]):
            single = per_op["dataset"].nunique() == 1
            for metric in ("exact_match", "char_accuracy"):
                name = f"{metric}_by_op.png" if single else f"{metric}_by_op_{ds}.png"
                figures.append((ds, f"{ds}: {METRICS[metric][0]} by operation x variant",
                                plot_by_op_heatmap(per_op, fig_dir / name, metric, order, [ds])))
        figures += [
            (ds, f"{ds}: tuning trials, learning rate vs validation loss",
             plot_tuning(trials, ds, fig_dir / f"tuning_{ds}.png", order, cfg.tune.steps)),
            (ds, f"{ds}: non-embedding parameters vs test loss",
             plot_params_vs_loss(ablation, ds, fig_dir / f"params_vs_loss_{ds}.png", order)),
            (ds, f"{ds}: fraction of near-zero gradients per parameter group",
             plot_grad_flow(grad, ds, fig_dir / f"grad_flow_{ds}.png", order)),
        ]
    figures += [(ds, cap, Path(p)) for ds, cap, p in extra_figures]
    written = [(ds, cap, p) for ds, cap, p in figures if p is not None]
    md = render_markdown(
        cfg, ablation, summary, comparisons, extras,
        [(ds, cap, p.relative_to(out_dir).as_posix()) for ds, cap, p in written],
        environment, order, notes)
    paths["report"] = _write_text(out_dir / "report.md", md)
    paths["figures"] = [p for _, _, p in written]
    return paths
