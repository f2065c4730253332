"""Stage ``report``: the tables and figures of :mod:`lmablate.report`, plus what needs the trained
models (attention maps, token-embedding PCA), the environment paragraph, and an MLflow summary run
holding the report and figures as artifacts."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import numpy as np
import torch

from . import report
from .config import StudyConfig
from .tokenizer import load_split, load_tokenizer
from .tracking import NullTracker
from .train import load_checkpoint

ATTENTION_TOKENS = 48  # length of the held-out sequence shown in attention heatmaps (tokens)


def environment() -> dict:
    """Hardware and software the study ran on, for the methodology paragraph."""
    gpu = f", GPU {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ", no GPU"
    return {"hardware": f"{os.cpu_count()} CPU cores ({platform.machine()}){gpu}",
            "torch": torch.__version__, "python": platform.python_version(),
            "platform": platform.platform(terse=True)}


@torch.no_grad()
def model_figures(cfg: StudyConfig, runs_dir: Path, tokens_dir: Path,
                  figures_dir: Path) -> list[tuple[str, str, Path]]:
    """Per dataset, from each variant's first-seed checkpoint: the last layer's attention
    weights (mean over heads) on one held-out test sequence, and a 2-D PCA of the token
    embeddings. Returns ``(dataset, caption, path)`` per figure."""
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
        path = figures_dir / f"attention_{dataset}.png"
        report.plot_attention(maps, chars, f"{dataset}: last-layer attention (mean over heads), "
                              f"held-out text, seed {seed}", path)
        written.append((dataset, f"{dataset}: last-layer attention weights on a held-out "
                        "sequence, per variant", path))
        path = figures_dir / f"embeddings_{dataset}.png"
        labels = [tok.decode([i]) for i in range(tok.vocab_size)]
        report.plot_embedding_pca(embs, labels, f"{dataset}: token embeddings, first two "
                                  f"principal components (seed {seed})", path)
        written.append((dataset, f"{dataset}: token embeddings (PCA), per variant", path))
    return written


def run(cfg: StudyConfig, runs_dir: Path, tokens_dir: Path, out_dir: Path,
        tracker: NullTracker) -> dict:
    """Write the report under ``out_dir`` and log it to an MLflow summary run."""
    figures_dir = out_dir / "figures"
    figures_dir.mkdir(parents=True, exist_ok=True)
    extra = model_figures(cfg, runs_dir, tokens_dir, figures_dir)
    result = report.build_report(cfg, runs_dir, out_dir, environment(), extra_figures=extra)
    with tracker.run("study-summary", {"stage": "report"}):
        tracker.log_artifact(out_dir / "report.md")
        for name in ("ablation.csv", "summary.csv", "comparisons.csv"):
            tracker.log_artifact(out_dir / name, "tables")
        tracker.log_artifact(figures_dir, "figures")
    return result
