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
