"""Evaluation metrics: test loss, perplexity, bits per character; arithmetic exact match.

Definitions (seed 000, made deterministic):
- test loss: mean cross-entropy in nats per token over non-overlapping ``context_length`` windows
  of the test split (:func:`split_loss`); perplexity = exp(test loss); bits per character =
  test loss / ln 2 (one token is one character).
- arithmetic: every test problem is cut after ``=``; the model decodes greedily, the problems of
  one length in a batch at once with a key/value cache, for as many tokens as the answer has
  (its padded width + the closing ``$``). After the first ``$`` the prediction is padded with
  ``$`` (seed 000 stops there and pads). Character accuracy = share of answer positions equal to
  the target; exact match = share of problems whose every answer position is right. The answer
  loss is the teacher-forced cross-entropy of the answer characters given the prompt, in nats
  per answer character (:func:`answer_nats`): the prompt's random operands are left out. All
  three overall, per operation, per answer length and per operand length.
- length extrapolation: the test loss on windows of 1, 2, 4 ... x ``context_length`` tokens, by
  position bucket, for the position schemes that run past the training context
  (:func:`extrapolation`).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from lmablate.core import interrupt
from lmablate.core.progress import progress
from lmablate.data.arithmetic import (OP_NAMES, answer_digits, operand_digits, problem_op,
                                      split_problem)
from lmablate.data.tokenizer import CharTokenizer
from lmablate.execution.executor import run_jobs
from lmablate.train.device import autocast


def aligned_step(length: int, stride: int) -> int:
    """The distance between the starts of non-overlapping windows of ``length`` tokens that
    start at multiples of ``stride`` (:attr:`lmablate.data.token_data.TokenData.stride`): ``length``
    rounded up to a multiple of ``stride``."""
    return stride * -(-length // stride)


@torch.no_grad()
def split_loss(model, tokens: np.ndarray, batch_size: int, max_batches: int,
               device: torch.device, stride: int = 1) -> float:
    """Mean cross-entropy (nats/char) over non-overlapping windows of context_length + 1 tokens
    of a split (``tokens``: its 1-D token ids; the evaluate stage's test loss on the test split),
    at most ``batch_size`` x ``max_batches`` windows, each starting at a multiple of ``stride``
    (where training windows start: a problem's first character on arithmetic, anywhere on text).

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

    Returns ``{"x<f>": {"test_loss": nats/char, "length": window length in tokens, "bucket":
    ``bucket``, "position_loss": [mean loss (nats/char) of positions b*bucket ..
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


def _groups(problems: Sequence[str], batch_size: int) -> list[tuple[int, int, list[int]]]:
    """Batches of problem indices with one prompt and one target length each: ``(prompt
    length, target length, indices)`` in order of first appearance, at most ``batch_size``
    per batch (every problem of one format has the same lengths, so a format is one group).

    Raises:
        DataError: a problem not in the format of :mod:`lmablate.data.arithmetic`."""
    by_shape: dict[tuple[int, int], list[int]] = {}
    for i, line in enumerate(problems):
        prompt, target = split_problem(line)
        by_shape.setdefault((len(prompt), len(target)), []).append(i)
    return [(p, t, idx[k:k + batch_size]) for (p, t), idx in by_shape.items()
            for k in range(0, len(idx), batch_size)]


def not_reaching(model, length: int) -> str | None:
    """Why ``model`` cannot read a problem of ``length`` characters: "n/a (learned table of N
    positions)" past a position table, None where it can (any length for a scheme without
    one: it runs past its training context as in :func:`extrapolation`)."""
    limit = model.position.max_positions
    return None if limit is None or length - 1 <= limit else not_extrapolating(model)


def _check_reach(model, length: int) -> None:
    reason = not_reaching(model, length)
    if reason:
        raise ValueError(f"a problem of {length} characters cannot be read: {reason}")


def _greedy(model, idx: torch.Tensor, n_new: int) -> torch.Tensor:
    """(B, P) prompts -> (B, n_new) greedy continuations: with the key/value cache within the
    context, else one full forward per token over the whole sequence (a scheme that runs past
    its context; the cache and ``generate``'s cropping stop at the context)."""
    if idx.size(1) + n_new - 1 <= model.cfg.context_length:
        return model.generate(idx, n_new, greedy=True)[:, idx.size(1):]
    for _ in range(n_new):
        logits, _ = model(idx)
        idx = torch.cat((idx, logits[:, -1].float().argmax(-1, keepdim=True)), dim=1)
    return idx[:, -n_new:]


def arithmetic_predictions(model, tok: CharTokenizer, problems: list[str], batch_size: int,
                           device: torch.device, workers: int = 1,
                           desc: str = "decoding", show_progress: bool = True) -> list[str]:
    """Greedy, batched, KV-cached completions of each problem's prompt (see module doc).

    Problems are batched by prompt and target length (:func:`_groups`), ``batch_size`` at a
    time, and the batches decoded ``workers`` at a time in threads (on a CPU; each batch is
    independent, so the predictions do not depend on ``workers``). Returns one predicted answer
    string per problem, in the order of ``problems``, as long as its target. With one worker a
    progress bar named ``desc`` counts the batches (:func:`lmablate.core.progress.progress`) unless
    ``show_progress`` is false (the answer probe inside a training run's bar).

    Raises:
        DataError: a problem not in the format of :mod:`lmablate.data.arithmetic` (before any
            decoding).
        ValueError: a problem longer than ``model``'s position table (:func:`not_reaching`).
        Interrupted: the stage was asked to stop (checked before every batch).
    """
    groups = _groups(problems, batch_size)
    for p_len, t_len, _ in groups:
        _check_reach(model, p_len + t_len)
    end = tok.token_id("$")

    @torch.inference_mode()
    def decode(group: tuple[int, int, list[int]]) -> list[str]:
        interrupt.check()
        p_len, t_len, indices = group
        idx = torch.from_numpy(np.stack([tok.encode(problems[i][:p_len]) for i in indices])
                               .astype(np.int64)).to(device)
        with autocast(device):
            gen = _greedy(model, idx, t_len)  # (B, t_len)
        # Everything after the first "$" becomes "$", as seed 000 pads after stopping.
        stopped = (gen == end).cumsum(dim=1) > 0
        gen = torch.where(stopped, torch.full_like(gen, end), gen)
        return [tok.decode(row) for row in gen.cpu().numpy()]

    workers = min(workers, len(groups)) if device.type == "cpu" else 1
    if workers <= 1:  # e.g. inside the evaluate stage's seed threads: leave torch's threads be
        batches = [decode(g) for g in (progress(groups, desc=desc, total=len(groups))
                                       if show_progress else groups)]
    else:
        batches = run_jobs(decode, groups, device=device, workers=workers)
    out = [""] * len(problems)
    for (_, _, indices), preds in zip(groups, batches):
        for i, pred in zip(indices, preds):
            out[i] = pred
    return out


@torch.no_grad()
def answer_nats(model, tok: CharTokenizer, problems: list[str], batch_size: int,
                device: torch.device) -> np.ndarray:
    """The answer-only loss of each problem: the cross-entropy (nats) of its answer
    characters, the closing ``$`` included, each predicted from the prompt and the answer
    characters before it (teacher forcing), summed per problem; float64 array (N,).

    Divide by the answer lengths (:func:`~lmablate.data.arithmetic.split_problem`'s target) for
    nats per answer character. The prompt's own characters are not scored: its operands are
    random by construction, so their loss measures the operand distribution, not arithmetic.

    Raises:
        DataError: a problem not in the format of :mod:`lmablate.data.arithmetic`.
        ValueError: a problem longer than ``model``'s position table (:func:`not_reaching`).
        Interrupted: the stage was asked to stop (checked before every batch).
    """
    out = np.zeros(len(problems))
    for p_len, t_len, indices in _groups(problems, batch_size):
        _check_reach(model, p_len + t_len)
        interrupt.check()
        lines = torch.from_numpy(np.stack([tok.encode(problems[i]) for i in indices])
                                 .astype(np.int64)).to(device)  # (B, p_len + t_len)
        with torch.inference_mode(), autocast(device):
            logits, _ = model(lines[:, :-1])  # (B, L - 1, vocab): position j predicts j + 1
        answer = logits[:, p_len - 1:].float()  # (B, t_len, vocab)
        nll = F.cross_entropy(answer.flatten(0, 1), lines[:, p_len:].flatten(),
                              reduction="none").view(len(indices), t_len)
        out[indices] = nll.double().sum(1).cpu().numpy()
    return out


def _scores(correct: list[np.ndarray], nats: np.ndarray | None, sel: np.ndarray) -> dict:
    """Char accuracy, exact match (and answer loss) of the selected problems, with their count."""
    chosen = [correct[i] for i in np.flatnonzero(sel)]
    chars = sum(len(c) for c in chosen)
    out = {"char_accuracy": float(sum(c.sum() for c in chosen) / chars),
           "exact_match": float(np.mean([c.all() for c in chosen]))}
    if nats is not None:
        out["answer_loss"] = float(nats[sel].sum() / chars)
    return {**out, "n": int(sel.sum())}


def _correct(problems: list[str], predictions: list[str]) -> list[np.ndarray]:
    """Per problem, which answer positions its prediction has right: bool (answer length,)."""
    return [np.array(list(q[:len(t)].ljust(len(t), "\0"))) == np.array(list(t))
            for q, t in zip(predictions, (split_problem(p)[1] for p in problems))]


def _by(correct: list[np.ndarray], nats: np.ndarray | None, keys: list[int]) -> dict[str, dict]:
    """:func:`_scores` of the problems of each key, keys ascending (as strings)."""
    keys = np.array(keys)
    return {str(k): _scores(correct, nats, keys == k) for k in sorted(set(keys.tolist()))}


def arithmetic_scores(problems: list[str], predictions: list[str],
                      nats: np.ndarray | None = None) -> dict:
    """Character accuracy and exact match over answer positions, and with ``nats`` (from
    :func:`answer_nats`) the answer loss, overall, per operation and per answer length.

    Returns ``{"char_accuracy", "exact_match", ["answer_loss",] "per_op": {"add": {...,
    "n"}, ...}, "by_answer_digits": {"2": {..., "n"}, ...}}``: accuracies as fractions, the
    answer loss in nats per answer character (the closing ``$`` counted, pooled over
    problems), ``n`` in problems; answer lengths are digits of the answer's integer part
    (:func:`~lmablate.data.arithmetic.answer_digits`).
    """
    correct = _correct(problems, predictions)
    everything = np.ones(len(problems), dtype=bool)
    scores = _scores(correct, nats, everything)
    del scores["n"]
    ops = np.array([problem_op(p) for p in problems])
    scores["per_op"] = {name: _scores(correct, nats, ops == op)
                        for op, name in OP_NAMES.items() if (ops == op).any()}
    scores["by_answer_digits"] = _by(correct, nats, [answer_digits(p) for p in problems])
    return scores


def by_operand_digits(problems: list[str], predictions: list[str], nats: np.ndarray,
                      split: str) -> dict[str, dict]:
    """Char accuracy, exact match and answer loss (as :func:`arithmetic_scores`) per operand
    length, the digits of a problem's longer operand (:func:`~lmablate.data.arithmetic.
    operand_digits`): ``{"2": {"char_accuracy", "exact_match", "answer_loss", "n", "split":
    split}, ...}``, lengths ascending."""
    by = _by(_correct(problems, predictions), nats, [operand_digits(p) for p in problems])
    return {d: {**scores, "split": split} for d, scores in by.items()}


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
