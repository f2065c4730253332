"""Figures of a trained model's insides: attention maps and token embeddings."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
import seaborn as sns
import torch
from matplotlib.lines import Line2D

from lmablate.config.study import StudyConfig
from lmablate.data.tokenizer import UNK, load_split, load_tokenizer
from lmablate.report.captions import Caption
from lmablate.report.figures import plotting
from lmablate.train.checkpoint import load_checkpoint

# the embedding PCA's character classes in legend order, in seaborn's colorblind colours (the
# unknown symbol black, apart from every character)
CHAR_CLASS_COLOURS = {"lower case": "#0173b2", "upper case": "#de8f05", "digit": "#029e73",
                      "whitespace": "#56b4e9", "punctuation/other": "#cc78bc",
                      "unknown symbol": "#000000"}
CHAR_CLASSES = tuple(CHAR_CLASS_COLOURS)
PCA_LABEL_SIZE = 9  # points: the characters labelling the embedding PCA's dots
# plot_attention's ticks: at most MAX_TICKS characters a side, TICK_POINTS high (16 x 9 pt fit
# along a 3.3-inch panel)
MAX_TICKS = 16
TICK_POINTS = 9
ATTENTION_TOKENS = 48  # length of the held-out sequence shown in attention heatmaps (tokens)


def visible(token: str) -> str:
    """A printable stand-in for a whitespace/control character (␣, \\n, \\t, \\r)."""
    return {" ": "␣", "\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(token, token)


def plot_attention(maps: Mapping[str, np.ndarray], tokens: Sequence[str], title: str,
                   path: Path) -> Path:
    """An attention heatmap per panel: ``maps`` is label -> ``(T, T)`` weights (``m[i, j]``:
    query i to key j; rows sum to 1) on the T characters ``tokens``. Raises ValueError if
    ``maps`` is empty or a map is not T x T."""
    arrays = {k: np.asarray(v, dtype=float) for k, v in maps.items()}
    t_len = len(tokens)
    if not arrays or any(m.shape != (t_len, t_len) for m in arrays.values()):
        raise ValueError(f"plot_attention: expected (T, T) maps with T = len(tokens) = {t_len}, "
                         f"got {[m.shape for m in arrays.values()]}")
    labels = [visible(t) for t in tokens]
    step = max(1, math.ceil(t_len / MAX_TICKS))
    with plotting.panels(path, len(arrays), 4, (3.3, 3.3), (1.2, 0.8)) as (fig, axes):
        nrows, ncols = axes.shape
        for i, (name, m) in enumerate(arrays.items()):
            ax = axes.ravel()[i]
            sns.heatmap(m, vmin=0, vmax=1, cmap="viridis", cbar=False, square=True,
                        xticklabels=False, yticklabels=False, ax=ax)
            ticks = np.arange(0, t_len, step) + 0.5
            ax.set_xticks(ticks, labels[::step] if i // ncols == nrows - 1 else [], rotation=90,
                          fontsize=TICK_POINTS)
            ax.set_yticks(ticks, labels[::step] if i % ncols == 0 else [], fontsize=TICK_POINTS)
            ax.set_title(name, fontsize=9)
        fig.supxlabel("key position (attended to)")
        fig.supylabel("query position")
        fig.colorbar(axes[0, 0].collections[0], ax=axes.ravel().tolist(), shrink=0.6,
                     label="attention weight")
        fig.suptitle(title)
    return Path(path)


def char_class(ch: str, unknown: str | None = UNK) -> str:
    """A vocabulary entry's class (:data:`CHAR_CLASSES`): ``unknown`` (which ``isupper`` may call
    upper case) and any entry not one character are ``"unknown symbol"``."""
    if ch == unknown or len(ch) != 1:
        return "unknown symbol"
    return ("whitespace" if ch.isspace() else "digit" if ch.isdigit() else
            ("upper case" if ch.isupper() else "lower case") if ch.isalpha()
            else "punctuation/other")


def plot_embedding_pca(embs: Mapping[str, np.ndarray], chars: Sequence[str], title: str,
                       path: Path, *, unknown: str | None = UNK) -> Path:
    """Token embeddings (``embs``: label -> ``(vocab_size, d_model)``, a row per character of
    ``chars``) on their first two principal components (SVD of the centred matrix), a panel
    each; dots coloured by :func:`char_class` and labelled where no label overlaps another.
    Raises ValueError if ``embs`` is empty or an array is not ``(len(chars), d >= 2)``."""
    arrays = {k: np.asarray(v, dtype=float) for k, v in embs.items()}
    if not arrays or any(e.ndim != 2 or e.shape[0] != len(chars) or e.shape[1] < 2
                         for e in arrays.values()):
        raise ValueError(f"plot_embedding_pca: expected arrays of shape (len(chars)="
                         f"{len(chars)}, d >= 2), got {[e.shape for e in arrays.values()]}")
    classes = [char_class(c, unknown) for c in chars]
    present = [c for c in CHAR_CLASSES if c in classes]
    # large panels: with ~70 characters a panel, smaller ones leave most labels overlapping
    with plotting.panels(path, len(arrays), 2, (6.4, 5.2), (1.6, 0.7)) as (fig, axes):
        labels, priority = [], []
        for ax, (name, emb) in zip(axes.ravel(), arrays.items()):
            texts, ranks = _pca_panel(ax, name, emb, chars, classes, present, unknown)
            labels += texts
            priority += ranks
        fig.legend(handles=[Line2D([], [], color=CHAR_CLASS_COLOURS[c], marker="o",
                                   linestyle="none", label=c) for c in present],
                   title="character class", loc="outside right upper", fontsize=9)
        # the second line is there before the layout pass, so that filling it in moves nothing
        heading = fig.suptitle(title + "\n(labels)")
        fig.draw_without_rendering()  # the final (constrained) layout, so extents are final
        kept: list = []
        for i in np.argsort(-np.asarray(priority, dtype=float), kind="stable"):
            box = labels[i].get_window_extent().padded(1.0)
            if any(box.overlaps(k) for k in kept):
                labels[i].set_visible(False)
            else:
                kept.append(box)
        hidden = len(labels) - len(kept)
        heading.set_text(title + (f"\n(dots without a label: {hidden} of {len(labels)}, whose "
                                  "label would overlap another)" if hidden else
                                  "\n(every dot labelled)"))
    return Path(path)


def _pca_panel(ax: Any, name: str, emb: np.ndarray, chars: Sequence[str], classes: Sequence[str],
               present: Sequence[str], unknown: str | None) -> tuple[list, list[float]]:
    """One PCA panel; returns its labels and their priorities (outliers first)."""
    centred = emb - emb.mean(axis=0)
    _, s, vt = np.linalg.svd(centred, full_matrices=False)
    pcs = centred @ vt[:2].T
    explained = s**2 / max(float(np.sum(s**2)), np.finfo(float).tiny)
    d = pd.DataFrame({"pc1": pcs[:, 0], "pc2": pcs[:, 1], "class": classes})
    sns.scatterplot(data=d, x="pc1", y="pc2", hue="class", hue_order=present,
                    palette=CHAR_CLASS_COLOURS, s=30, alpha=0.75, ax=ax, legend=False)
    scale = np.maximum(np.abs(pcs[:, :2]).max(axis=0), np.finfo(float).tiny)
    labels = [ax.annotate(visible(ch), (x, y), xytext=(3, 3), textcoords="offset points",
                          fontsize=PCA_LABEL_SIZE, in_layout=False)
              for (x, y), ch in zip(pcs[:, :2], chars)]
    # the unknown symbol's label first (its class has one dot), then the outliers'
    priority = [np.inf if char_class(ch, unknown) == "unknown symbol"
                else float(np.hypot(x / scale[0], y / scale[1]))
                for (x, y), ch in zip(pcs[:, :2], chars)]
    ax.set_title(name, fontsize=10)
    ax.set_xlabel(f"PC1 ({explained[0]:.0%} of variance)")
    ax.set_ylabel(f"PC2 ({explained[1]:.0%} of variance)")
    ax.margins(0.08)
    return labels, priority


@torch.no_grad()
def draw_model_figures(cfg: StudyConfig, runs_dir: Path, tokens_dir: Path,
                  figures_dir: Path) -> list[tuple[str, Caption, Path]]:
    """Per dataset, from each variant's first-seed checkpoint (if any): the last layer's
    attention (mean over heads) on the first :data:`ATTENTION_TOKENS` test tokens, and a PCA
    of the token embeddings; returns ``(dataset, caption, path)`` per figure written. Raises
    FileNotFoundError if a tokenizer or test split is missing under ``tokens_dir``."""
    written = []
    seed = cfg.seeds[0]
    for dataset in cfg.datasets:
        tok = load_tokenizer(tokens_dir / dataset)
        test = load_split(tokens_dir / dataset, "test")
        maps, embs, chars = {}, {}, []
        for variant in cfg.study_variants:
            ckpt = runs_dir / dataset / variant / "checkpoints" / f"seed_{seed}" / "checkpoint.pt"
            if not ckpt.exists():
                continue
            model, _ = load_checkpoint(ckpt)
            T = min(ATTENTION_TOKENS, model.cfg.context_length, len(test))
            idx = torch.from_numpy(np.asarray(test[:T], dtype=np.int64))[None]  # (1, T)
            maps[variant] = model.attention_maps(idx)[-1, 0].mean(0).numpy()  # (T, T)
            chars = [tok.decode([i]) for i in idx[0].tolist()]
            embs[variant] = model.wte.weight.numpy()  # (vocab_size, d_model)
        if not maps:
            continue
        written.append((dataset, Caption.of("attention", ds=dataset), plot_attention(
            maps, chars, f"{dataset}: last-layer attention (mean over heads), held-out text, "
            f"seed {seed}", figures_dir / f"attention_{dataset}.png")))
        labels = [tok.decode([i]) for i in range(tok.vocab_size)]
        written.append((dataset, Caption.of("embeddings", ds=dataset), plot_embedding_pca(
            embs, labels, f"{dataset}: token embeddings, first two principal components "
            f"(seed {seed})", figures_dir / f"embeddings_{dataset}.png", unknown=tok.unk)))
    return written
