"""lmablate: reproducible ablation studies of small transformer language models."""

__version__ = "0.1.0"
