"""Token data for training: one dataset's memory-mapped splits and random batches of windows."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lmablate.data.tokenizer import load_split, load_tokenizer, read_meta


@dataclass
class TokenData:
    """Token id arrays (1-D, uint8/uint16, memory-mapped) of one dataset's splits.

    ``stride``: training and validation windows start at multiples of it (tokens). 1 for a text
    corpus (a window may start anywhere); an arithmetic dataset's problem length (meta.json's
    ``line_length``), so every window starts with a problem, as evaluation presents one: a
    learned position table then sees each digit at one position (at any offset, it could not
    tell a problem's digits apart by position, and the baseline does not learn the task).
    """

    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    vocab_size: int

    tokens_dir: Path | None = None
    stride: int = 1

    @classmethod
    def load(cls, tokens_dir: Path) -> "TokenData":
        """The splits written by ``lmablate tokenize`` into ``tokens_dir``.

        Raises:
            TokenizerError: a missing or truncated file (see
                :func:`lmablate.data.tokenizer.load_split`).
        """
        tok = load_tokenizer(tokens_dir)
        return cls(*(load_split(tokens_dir, s) for s in ("train", "val", "test")),
                   vocab_size=tok.vocab_size, tokens_dir=Path(tokens_dir),
                   stride=int(read_meta(tokens_dir).get("line_length", 1)))

    @property
    def line_length(self) -> int:
        """Characters of an arithmetic dataset's every line (its window stride); 0 for text."""
        return self.stride if self.stride > 1 else 0

    def fingerprint(self) -> str:
        """Hash of the training and validation tokens and the window stride (ties resume states
        to their data)."""
        h = hashlib.sha256()
        for split in (self.train, self.val):
            h.update(np.ascontiguousarray(split).tobytes())
        if self.stride != 1:  # the windows a run trains on; a text corpus's hash is unchanged
            h.update(f"stride={self.stride}".encode())
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
                 generator: torch.Generator, stride: int = 1) -> torch.Tensor:
    """Start offsets (B,) int64 of ``batch_size`` random windows of ``context_length`` + 1 tokens
    in a split of ``n_tokens`` tokens, each a multiple of ``stride`` (:attr:`TokenData.stride`):
    one ``torch.randint`` call on ``generator``, the only draw a batch takes from it, so that a
    loop drawing starts ahead (:mod:`lmablate.train.batched`) sees the batches :func:`get_batch`
    would. With ``stride`` 1 the draw is ``randint(n_tokens - context_length)``."""
    count = (n_tokens - context_length - 1) // stride + 1
    return torch.randint(count, (batch_size,), generator=generator) * stride


def get_batch(data: np.ndarray, batch_size: int, context_length: int,
              generator: torch.Generator, device: torch.device,
              stride: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample ``batch_size`` random windows starting at multiples of ``stride``: inputs (B, T)
    and next-token targets (B, T), int64.

    The window starts come from ``generator`` (one ``torch.randint`` call), so a seeded
    generator gives the same batches on every machine and in every thread.
    """
    starts = batch_starts(len(data), batch_size, context_length, generator, stride).numpy()
    windows = data[starts[:, None] + np.arange(context_length + 1)]  # (B, T+1), one gather
    windows = torch.from_numpy(windows.astype(np.int64))
    x, y = windows[:, :-1], windows[:, 1:]
    if device.type == "cuda":
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)
