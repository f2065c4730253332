"""Token data for training: one dataset's memory-mapped splits and random batches of windows."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .tokenizer import load_split, load_tokenizer


@dataclass
class TokenData:
    """Token id arrays (1-D, uint8/uint16, memory-mapped) of one dataset's splits."""

    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    vocab_size: int

    tokens_dir: Path | None = None

    @classmethod
    def load(cls, tokens_dir: Path) -> "TokenData":
        """The splits written by ``lmablate tokenize`` into ``tokens_dir``.

        Raises:
            TokenizerError: a missing or truncated file (see :func:`lmablate.tokenizer.load_split`).
        """
        tok = load_tokenizer(tokens_dir)
        return cls(*(load_split(tokens_dir, s) for s in ("train", "val", "test")),
                   vocab_size=tok.vocab_size, tokens_dir=Path(tokens_dir))

    def fingerprint(self) -> str:
        """Hash of the training and validation tokens (ties resume states to their data)."""
        h = hashlib.sha256()
        for split in (self.train, self.val):
            h.update(np.ascontiguousarray(split).tobytes())
        return h.hexdigest()[:16]

    def check_fits(self, context_length: int, what: str) -> None:
        """Raise ValueError unless every split holds at least one window of context_length+1."""
        for split in ("train", "val", "test"):
            n = len(getattr(self, split))
            if n < context_length + 1:
                raise ValueError(
                    f"{what}: the {split} split has {n} tokens, fewer than context_length + 1 = "
                    f"{context_length + 1}; enlarge the dataset or its split fraction, or shrink "
                    "model.context_length")


def batch_starts(n_tokens: int, batch_size: int, context_length: int,
                 generator: torch.Generator) -> torch.Tensor:
    """Start offsets (B,) int64 of ``batch_size`` random windows of ``context_length`` + 1 tokens
    in a split of ``n_tokens`` tokens: one ``torch.randint`` call on ``generator``, the only
    draw a batch takes from it, so that a loop drawing starts ahead (:mod:`lmablate.batched`)
    sees the batches :func:`get_batch` would."""
    return torch.randint(n_tokens - context_length, (batch_size,), generator=generator)


def get_batch(data: np.ndarray, batch_size: int, context_length: int,
              generator: torch.Generator, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample ``batch_size`` random windows: inputs (B, T) and next-token targets (B, T), int64.

    The window starts come from ``generator`` (one ``torch.randint`` call), so a seeded
    generator gives the same batches on every machine and in every thread.
    """
    starts = batch_starts(len(data), batch_size, context_length, generator).numpy()
    windows = data[starts[:, None] + np.arange(context_length + 1)]  # (B, T+1), one gather
    windows = torch.from_numpy(windows.astype(np.int64))
    x, y = windows[:, :-1], windows[:, 1:]
    if device.type == "cuda":
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)
