"""lmablate.report.figures.model_figures: attention maps and the PCA of token embeddings."""

from __future__ import annotations

import numpy as np
import pytest

from lmablate.report.figures import model_figures


def test_attention_and_embedding_hooks(tmp_path):
    rng = np.random.default_rng(0)
    tokens = list("To be, or not\nto be")
    t = len(tokens)
    logits = rng.normal(size=(5, t, t)) + np.triu(np.full((t, t), -1e9), 1)
    maps = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    panels = {f"variant {i}": m for i, m in enumerate(maps)}
    p = model_figures.plot_attention(panels, tokens, "test, seed 0", tmp_path / "attn.png")
    assert p.read_bytes()[:4] == b"\x89PNG"
    chars = list("abcXYZ019 .,\n")
    embs = {"a": rng.normal(size=(len(chars), 8)), "b": rng.normal(size=(len(chars), 4))}
    p = model_figures.plot_embedding_pca(embs, chars, "emb", tmp_path / "emb.png")
    assert p.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError):
        model_figures.plot_attention({"x": maps[0][:-1]}, tokens, "bad", tmp_path / "bad.png")
    with pytest.raises(ValueError):
        model_figures.plot_attention({}, tokens, "bad", tmp_path / "bad.png")
    with pytest.raises(ValueError):
        model_figures.plot_embedding_pca({"x": rng.normal(size=(3, 8))}, chars, "bad",
                                  tmp_path / "bad.png")
    assert not (tmp_path / "bad.png").exists()


def test_attention_tick_labels_are_9_points_and_never_overlap(tmp_path, drawn):
    import itertools
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    figs = drawn
    tokens = list("First Citizen:\nBefore we proceed any further, hear me speak.")[:64]
    t = len(tokens)
    maps = {f"variant {i}": np.tril(np.ones((t, t))) / np.arange(1, t + 1)[:, None]
            for i in range(4)}
    model_figures.plot_attention(maps, tokens, "test", tmp_path / "attn.png")
    canvas = FigureCanvasAgg(figs[0])
    canvas.draw()
    renderer = canvas.get_renderer()
    ax = figs[0].axes[0]
    for labels in (ax.get_xticklabels(), ax.get_yticklabels()):
        shown = [lab for lab in labels if lab.get_text()]
        assert 0 < len(shown) <= model_figures.MAX_TICKS
        assert min(lab.get_fontsize() for lab in shown) >= 9
        boxes = [lab.get_window_extent(renderer) for lab in shown]
        assert not any(a.overlaps(b) for a, b in itertools.combinations(boxes, 2))
