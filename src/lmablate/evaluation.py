"""Evaluation metrics: test loss, perplexity, bits per character; arithmetic exact match.

Definitions (seed 000, made deterministic):
- test loss: mean cross-entropy in nats per token over non-overlapping ``context_length`` windows
  of the test split; perplexity = exp(test loss); bits per character = test loss / ln 2 (one
  token is one character).
- arithmetic: every test problem is cut after ``=``; the model decodes greedily, all problems in a
  batch at once with a key/value cache, for as many tokens as the answer has (10 characters + the
  closing ``$``). After the first ``$`` the prediction is padded with ``$`` (seed 000 stops there
  and pads). Character accuracy = share of answer positions equal to the target; exact match =
  share of problems whose every answer position is right. Both overall and per operation.
- length extrapolation: the test loss on windows of 1, 2, 4 ... x ``context_length`` tokens, by
  position bucket, for the position schemes that run past the training context
  (:func:`extrapolation`).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from . import interrupt
from .arithmetic import OP_NAMES, problem_op, split_problem
from .device import autocast
from .parallel import map_jobs
from .progress import progress
from .tokenizer import CharTokenizer


def aligned_step(length: int, stride: int) -> int:
    """The distance between the starts of non-overlapping windows of ``length`` tokens that
    start at multiples of ``stride`` (:attr:`lmablate.tokens.TokenData.stride`): ``length``
    rounded up to a multiple of ``stride``."""
    return stride * -(-length // stride)


@torch.no_grad()
def test_loss(model, tokens: np.ndarray, batch_size: int, max_batches: int,
              device: torch.device, stride: int = 1) -> float:
    """Mean cross-entropy (nats/token) over non-overlapping windows of the test split, each
    starting at a multiple of ``stride`` (where training windows start: a problem's first
    character on arithmetic, anywhere on text).

    Raises:
        ValueError: the split is shorter than one window of context_length + 1 tokens.
        Interrupted: the stage was asked to stop (checked before every batch).
    """
    T = model.cfg.context_length
    step = aligned_step(T, stride)
    n_windows = min(max(0, (len(tokens) - 1 - T) // step + 1), batch_size * max_batches)
    if n_windows < 1:
        raise ValueError(f"test split has {len(tokens)} tokens; need at least {T + 1}")
    starts = np.arange(n_windows) * step
    total, count = 0.0, 0
    for chunk in np.array_split(starts, math.ceil(n_windows / batch_size)):
        interrupt.check()
        w = torch.from_numpy(tokens[chunk[:, None] + np.arange(T + 1)].astype(np.int64)).to(device)
        with autocast(device):
            _, loss = model(w[:, :-1], w[:, 1:])
        total += loss.float().item() * len(chunk)
        count += len(chunk)
    return total / count


def not_extrapolating(model) -> str | None:
    """Why ``model`` cannot be run past its training context: "n/a (learned table of N
    positions)" for a position table, None for a scheme that runs at any length."""
    limit = model.position.max_positions
    return None if limit is None else f"n/a ({model.cfg.position} table of {limit} positions)"


def extrapolation(model, tokens: np.ndarray, factors: tuple[int, ...], bucket: int,
                  batch_size: int, max_tokens: int, device: torch.device,
                  stride: int = 1) -> dict:
    """Length extrapolation (Press et al. 2022, "Train Short, Test Long"): the test loss of
    ``model`` on windows of f x context_length tokens for each factor f, and its breakdown by
    position.

    Every factor reads the same tokens: the first n x (max factor x context_length) tokens of
    ``tokens``, with n as many windows of the longest length as fit in ``len(tokens) - 1`` and
    ``max_tokens``, cut into non-overlapping windows of each length; with ``stride`` > 1 each
    window starts at the next multiple of ``stride`` (a problem's start, as in training), so
    a window may be followed by a gap of less than ``stride`` tokens. The loss at a window's
    position p predicts token p + 1 from the p + 1 tokens before it (from that window alone).

    Returns ``{"x<f>": {"test_loss": nats/token, "length": window length in tokens, "bucket":
    ``bucket``, "position_loss": [mean loss (nats/token) of positions b*bucket ..
    (b+1)*bucket - 1, for each bucket b], "windows": number of windows}}``; a factor past a
    learned position table maps to :func:`not_extrapolating`'s "n/a (...)" string instead.

    Raises:
        ValueError: ``tokens`` hold fewer than max factor x context_length + 1 tokens.
        Interrupted: the stage was asked to stop (checked before every batch).
    """
    T = model.cfg.context_length
    longest = max(factors) * T
    n_long = min((len(tokens) - 1) // longest, max(1, max_tokens // longest))
    if n_long < 1:
        raise ValueError(f"test split has {len(tokens)} tokens; length extrapolation to "
                         f"{max(factors)} x context_length needs at least {longest + 1}")
    span = n_long * longest
    reason, limit = not_extrapolating(model), model.position.max_positions
    out: dict[str, dict | str] = {}
    for f in factors:
        L = f * T
        if limit is not None and L > limit:
            out[f"x{f}"] = reason
            continue
        starts = np.arange(0, span - L + 1, aligned_step(L, stride))
        total = np.zeros(L)
        for chunk in np.array_split(starts, math.ceil(len(starts) / batch_size)):
            interrupt.check()
            w = torch.from_numpy(tokens[chunk[:, None] + np.arange(L + 1)].astype(np.int64))
            w = w.to(device)
            with torch.inference_mode(), autocast(device):
                logits, _ = model(w[:, :-1])
            nll = F.cross_entropy(logits.float().flatten(0, 1), w[:, 1:].flatten(),
                                  reduction="none").view(len(chunk), L)  # (B, L) nats
            total += nll.sum(0).double().cpu().numpy()
        per_position = total / len(starts)  # (L,)
        buckets = [float(per_position[b:b + bucket].mean()) for b in range(0, L, bucket)]
        out[f"x{f}"] = {"test_loss": float(per_position.mean()), "length": L, "bucket": bucket,
                        "position_loss": buckets, "windows": int(len(starts))}
    return out


def arithmetic_predictions(model, tok: CharTokenizer, problems: list[str], batch_size: int,
                           device: torch.device, workers: int = 1,
                           desc: str = "decoding") -> list[str]:
    """Greedy, batched, KV-cached completions of each problem's prompt (see module doc).

    Batches of ``batch_size`` problems are decoded ``workers`` at a time in threads (on a CPU;
    each batch is independent, so the predictions do not depend on ``workers``).
    Returns one predicted answer string per problem, as long as its target. With one worker
    a progress bar named ``desc`` counts the batches (:func:`lmablate.progress.progress`).

    Raises:
        DataError: a problem not in the format of :mod:`lmablate.arithmetic` (which gives every
            problem the same prompt and answer length, so one batch decodes them all).
        Interrupted: the stage was asked to stop (checked before every batch).
    """
    prompts, targets = zip(*(split_problem(p) for p in problems))
    n_new = len(targets[0])
    end = tok.token_id("$")

    @torch.inference_mode()
    def decode(start: int) -> list[str]:
        interrupt.check()
        idx = torch.from_numpy(np.stack([tok.encode(p) for p in prompts[start:start + batch_size]])
                               .astype(np.int64)).to(device)
        with autocast(device):
            gen = model.generate(idx, n_new, greedy=True)[:, idx.shape[1]:]  # (B, n_new)
        # Everything after the first "$" becomes "$", as seed 000 pads after stopping.
        stopped = (gen == end).cumsum(dim=1) > 0
        gen = torch.where(stopped, torch.full_like(gen, end), gen)
        return [tok.decode(row) for row in gen.cpu().numpy()]

    starts = range(0, len(prompts), batch_size)
    workers = min(workers, len(starts)) if device.type == "cpu" else 1
    if workers == 1:  # e.g. inside the evaluate stage's seed threads: leave torch's threads be
        batches = [decode(start) for start in progress(starts, desc=desc, total=len(starts))]
    else:
        batches = map_jobs(decode, starts, workers)
    return [pred for batch in batches for pred in batch]


def arithmetic_scores(problems: list[str], predictions: list[str]) -> dict:
    """Character accuracy and exact match over answer positions, overall and per operation.

    Returns ``{"char_accuracy", "exact_match", "per_op": {"add": {...}, ...}}`` (fractions).
    """
    targets = np.array([list(split_problem(p)[1]) for p in problems])
    preds = np.array([list(p) for p in predictions])
    correct = preds == targets  # (N, answer length)
    ops = np.array([problem_op(p) for p in problems])
    scores = {"char_accuracy": float(correct.mean()), "exact_match": float(correct.all(1).mean())}
    scores["per_op"] = {
        name: {"char_accuracy": float(correct[ops == op].mean()),
               "exact_match": float(correct[ops == op].all(1).mean())}
        for op, name in OP_NAMES.items() if (ops == op).any()}
    return scores


@torch.no_grad()
def text_samples(model, tok: CharTokenizer, n: int, length: int, temperature: float,
                 seed: int, device: torch.device) -> list[str]:
    """``n`` samples of ``length`` characters, each started from a newline, seeded."""
    if n == 0:
        return []
    g = torch.Generator(device=device).manual_seed(seed)
    start = tok.encode("\n") if "\n" in tok.chars else np.array([0])
    idx = torch.from_numpy(np.tile(start.astype(np.int64), (n, 1))).to(device)
    out = model.generate(idx, length, temperature=temperature, generator=g)
    return [tok.decode(row) for row in out[:, idx.shape[1]:].cpu().numpy()]
