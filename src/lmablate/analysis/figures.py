"""The study's figures: one seaborn figure per ``plot_*`` function, written as a PNG.

Every function takes the frames of :mod:`lmablate.analysis.collect` (or plain arrays) and a
path, draws with matplotlib's Agg (no display, no pyplot state) and writes the PNG atomically;
it returns the path, or None when there is nothing to draw. Variants appear in the study order
carried by the frames' categorical ``variant`` column (baseline first), never re-sorted here.

Units: losses are natural-log cross-entropy per character token (nats/token); accuracies are
fractions in [0, 1]; parameter counts are counts; learning rates per optimizer step.

:func:`plot_attention` and :func:`plot_embedding_pca` take plain arrays, so the caller decides
which model and which input to visualise (the report stage loads checkpoints for them).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import (FuncFormatter, LogLocator, NullFormatter,
                               StrMethodFormatter)

from lmablate import fileio
from lmablate.analysis.collect import BASELINE, maybe_int, present
from lmablate.analysis.statistics import (ALPHA, METRICS, VERDICT_BETTER, VERDICT_FEW,
                                          VERDICT_NSD, VERDICT_WORSE, t_interval)

DPI = 110
VERDICT_COLORS = {
    VERDICT_BETTER: "#1a9850",
    VERDICT_WORSE: "#d73027",
    VERDICT_NSD: "#4d4d4d",
    VERDICT_FEW: "#b0b0b0",
}

JITTER_SEED = 0  # the strip plot's horizontal jitter (see plot_test_loss)


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
    """One colour per variant of ``order`` (a figure's variants in study order), so figures
    showing the same variants colour them alike."""
    return dict(zip(order, sns.color_palette("tab10" if len(order) <= 10 else "husl",
                                             len(order))))


def _rotate_if_crowded(ax: Any, n: int) -> None:
    if n > 4:
        ax.tick_params(axis="x", labelrotation=30)
        for label in ax.get_xticklabels():
            label.set_horizontalalignment("right")


def plot_val_loss_curves(history: pd.DataFrame, dataset: str, path: Path) -> Path | None:
    """Validation loss (nats/token) against optimizer step, one line per variant: the mean over
    seeds with a band of +-1 SD over seeds (SD, not a bootstrap CI: 3 seeds make a poor
    bootstrap). Returns ``path``, or None if there is no history for ``dataset``."""
    h = history[history["dataset"] == dataset] if len(history) else history
    if h.empty or "val_loss" not in h:
        return None
    h = h.dropna(subset=["val_loss"])
    order = present(h["variant"])
    n_seeds = h.groupby("variant", observed=True)["seed"].nunique().max()
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


def plot_test_loss(ablation: pd.DataFrame, dataset: str, path: Path) -> Path | None:
    """Test loss (nats/token) per variant: each seed as a grey dot, the mean as a diamond with
    its 95% Student-t interval (the same interval as summary.csv); a dotted line marks the
    baseline mean. Returns ``path``, or None without test losses for ``dataset``."""
    d = ablation[(ablation["dataset"] == dataset)].dropna(subset=["test_loss"])
    if d.empty:
        return None
    order = present(d["variant"])
    with _figure(path, figsize=(max(6.0, 1.1 * len(order) + 2.5), 4.5)) as (fig, axes):
        ax = axes[0, 0]
        # seaborn draws the jitter from numpy's global generator: seed it for this call only,
        # so that the same runs always give the same figure (and the caller's state is kept)
        state = np.random.get_state()
        np.random.seed(JITTER_SEED)
        try:
            sns.stripplot(data=d, x="variant", y="test_loss", order=order, color="0.5", size=5,
                          alpha=0.75, jitter=0.12, ax=ax)
        finally:
            np.random.set_state(state)
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
                metric: str = "test_loss") -> Path | None:
    """Forest plot of ``variant - baseline`` in ``metric`` per variant: the mean paired
    difference and its 95% t-interval, coloured by the Holm-corrected verdict, with the Holm
    p-value written beside it; a vertical line at 0 (no difference). Returns ``path``, or None
    when ``dataset`` has no comparison for ``metric``."""
    c = comparisons[(comparisons["dataset"] == dataset) & (comparisons["metric"] == metric)]
    c = c.dropna(subset=["mean_diff"])
    if c.empty:
        return None
    c = c[c["variant"] != BASELINE].reset_index(drop=True)  # rows already in variant order
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
    ds_list = present(p["dataset"])
    variants = present(p["variant"])
    n_ops = p["op"].nunique()
    with _figure(path, figsize=(1.1 * len(variants) + 3.0, (0.5 * n_ops + 1.6) * len(ds_list)),
                 nrows=len(ds_list)) as (fig, axes):
        for ax, ds in zip(axes[:, 0], ds_list):
            q = p[p["dataset"] == ds]
            table = q.pivot_table(index="op", columns="variant", values=metric, aggfunc="mean",
                                  observed=True)
            table = table.reindex(index=list(pd.unique(q["op"])),
                                  columns=[v for v in variants if v in table.columns])
            sns.heatmap(table, annot=True, fmt=".2f", vmin=0, vmax=1, cmap="viridis",
                        linewidths=0.5, cbar_kws={"label": f"{label} (fraction)"}, ax=ax)
            ax.set_title(f"{ds}: {label} by operation (mean over seeds)")
            ax.set_xlabel("variant")
            ax.set_ylabel("operation")
            ax.tick_params(axis="y", labelrotation=0)
    return Path(path)


def plot_tuning(trials: pd.DataFrame, dataset: str, path: Path) -> Path | None:
    """Optuna trials: learning rate (log x-axis) against the trial's validation loss
    (nats/token) at the end of its share of the budget, colour = variant, marker = d_model.
    Completed trials are solid, pruned trials faded (their value is the loss they were pruned
    at, earlier in their budget), failed trials omitted; a star
    marks each variant's best completed trial. Returns ``path``, or None without trials."""
    t = trials[trials["dataset"] == dataset] if len(trials) else trials
    if t.empty or "params_lr" not in t or "value" not in t:
        return None
    t = t.copy()
    t["state"] = t.get("state", pd.Series("COMPLETE", index=t.index)).fillna("COMPLETE")
    t = t[t["state"].isin(["COMPLETE", "PRUNED"])].dropna(subset=["value", "params_lr"])
    if t.empty:
        return None
    order = present(t["variant"])
    palette = _palette(order)
    style = None
    markers: Any = True
    style_order = None
    if "params_d_model" in t and t["params_d_model"].notna().any():
        t["d_model"] = maybe_int(t["params_d_model"]).astype(str)
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
            # stars in row order, like the trial points: the draw order of overlapping markers
            best = done.loc[done.groupby("variant", observed=True, sort=False)["value"].idxmin()]
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
        ax.set_title(f"{dataset}: tuning trials ({n_done} completed, {n_pruned} pruned)")
        ax.set_xlabel("learning rate (log scale)")
        ax.set_ylabel("val loss at trial end, pruned: at pruning\n(nats/token)")
    return Path(path)


def plot_params_vs_loss(ablation: pd.DataFrame, dataset: str, path: Path) -> Path | None:
    """Non-embedding parameter count against test loss (nats/token), one point per seed,
    colour and marker = variant. Shows whether a variant's gain is just extra capacity.
    Returns ``path``, or None without parameter counts for ``dataset``."""
    d = ablation[ablation["dataset"] == dataset].dropna(
        subset=["test_loss", "n_params_non_embedding"]).copy()
    if d.empty:
        return None
    d["n_params_non_embedding"] = d["n_params_non_embedding"].astype(float)
    order = present(d["variant"])
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


def plot_grad_flow(grad: pd.DataFrame, dataset: str, path: Path) -> Path | None:
    """Heatmap of the fraction of gradient entries with |grad| < 1e-8 after the last training
    step (mean over seeds), parameter group (rows) x variant (columns). High values flag dead
    units or vanishing gradients. Returns ``path``, or None without grad stats."""
    g = grad[grad["dataset"] == dataset] if len(grad) else grad
    if g.empty or "frac_near_zero" not in g:
        return None
    order = present(g["variant"])
    table = g.pivot_table(index="group", columns="variant", values="frac_near_zero",
                          aggfunc="mean", observed=True)
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

