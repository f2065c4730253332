"""What a model gets for free, from the data alone: n-gram and uniform cross-entropies of a
character corpus (nats/char), and arithmetic answers that ignore the question. Numpy and the
standard library only (a stage start-up pays for every import)."""

from __future__ import annotations

from collections import Counter
from typing import Sequence

import numpy as np

__all__ = ["DISCOUNT", "MAX_ORDER", "NGRAM_SMOOTHING", "ngram_cross_entropy", "ngram_probabilities",
           "ngram_references", "uniform_cross_entropy", "constant_answer_scores",
           "best_constant_answer", "most_frequent_answer", "all_zeros_answer", "ANSWER_SMOOTHING",
           "answer_position_floor"]

DISCOUNT = 0.75  # D, the one absolute discount of every order >= 2
MAX_ORDER = 3  # trigram; every order scores test tokens from index MAX_ORDER - 1 on
NGRAM_SHORT = "Kneser-Ney"  # the smoothing's name in a figure legend
NGRAM_SMOOTHING = f"interpolated Kneser-Ney (D = {DISCOUNT}) over an add-one unigram"
_ORDER_NAMES = {1: "unigram", 2: "bigram", 3: "trigram"}
ANSWER_SMOOTHING = ("per answer position, the training answers' character frequencies, add-one "
                    "over the characters of either set")


def _checked(order: int, vocab_size: int, **splits) -> list[np.ndarray]:
    """``splits`` as 1-D int64 arrays of ids in [0, vocab_size), ``train`` not empty."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) \
            or vocab_size < 1:
        raise ValueError(f"vocab_size must be an integer >= 1, got {vocab_size!r}")
    if isinstance(order, bool) or order not in _ORDER_NAMES:
        raise ValueError(f"order must be 1, 2 or 3 (unigram, bigram, trigram), got {order!r}")
    out = []
    for name, ids in splits.items():
        ids = np.asarray(ids)
        if ids.ndim != 1:
            raise ValueError(f"{name} must be a 1-D array of token ids, got shape {ids.shape}")
        if ids.size and not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"{name} must hold integer token ids, got dtype {ids.dtype}")
        out.append(ids.astype(np.int64))
        bad = np.flatnonzero((out[-1] < 0) | (out[-1] >= vocab_size))
        if bad.size:
            raise ValueError(f"{name}[{bad[0]}] = {out[-1][bad[0]]} is outside [0, vocab_size = "
                             f"{vocab_size}); {bad.size} ids of {name} are")
    if splits and not out[0].size:
        raise ValueError("train is empty: there is nothing to count n-grams in")
    return out


def _codes(ids: np.ndarray, k: int, vocab_size: int) -> np.ndarray:
    """Every k-gram of ``ids`` as one integer, ``sum_j ids[i + j] * V ** (k - 1 - j)``."""
    n = len(ids) - k + 1
    codes = np.zeros(max(n, 0), dtype=np.int64)
    for j in range(k):  # k <= 3: a loop over the n-gram's positions, not over tokens
        codes = codes * vocab_size + ids[j:j + n]
    return codes


def _lookup(keys: np.ndarray, values: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """``values`` at ``queries`` in the sorted ``keys``; 0 where a query is not a key."""
    if not keys.size:
        return np.zeros(len(queries), dtype=values.dtype)
    at = np.minimum(np.searchsorted(keys, queries), keys.size - 1)
    return np.where(keys[at] == queries, values[at], 0)


def _interpolate(grams: np.ndarray, counts: np.ndarray, queries: np.ndarray,
                 lower: np.ndarray, vocab_size: int) -> np.ndarray:
    """P_k at ``queries`` (codes h w), from a_k at the sorted ``grams`` and P_{k-1} (``lower``)."""
    contexts, start, types = np.unique(grams // vocab_size, return_index=True,
                                       return_counts=True)  # h, and T(h)
    totals = np.add.reduceat(counts, start) if counts.size else counts  # S(h)
    a = _lookup(grams, counts, queries)
    s = _lookup(contexts, totals, queries // vocab_size)
    t = _lookup(contexts, types, queries // vocab_size)
    seen = s > 0
    p = lower.copy()  # an unseen context backs off fully
    p[seen] = (np.maximum(a[seen] - DISCOUNT, 0) + DISCOUNT * t[seen] * lower[seen]) / s[seen]
    return p


def ngram_cross_entropy(train: np.ndarray, test: np.ndarray, order: int,
                        vocab_size: int) -> float:
    """Cross-entropy (nats/char) on ``test`` of an interpolated Kneser-Ney model of ``order``
    1-3 counted on ``train`` (1-D integer ids in [0, vocab_size)): ``-mean_i log P_order(test[i]
    | test[i-order+1:i])`` over the test tokens from index 2 on, the same for every order.

    V = ``vocab_size``, N = ``len(train)``, D = :data:`DISCOUNT`, c(x) the count of the n-gram x
    in ``train`` (Kneser & Ney, ICASSP 1995; Chen & Goodman, TR-10-98, 1998, interpolated; the
    add-one unigram is ours), h' = h without its first token::

        P_1(w) = (c(w) + 1) / (N + V);  S(h) = sum_w a_k(h, w);  T(h) = |{w : a_k(h, w) > 0}|
        P_k(w | h) = (max(a_k(h, w) - D, 0) + D * T(h) * P_{k-1}(w | h')) / S(h)   if S(h) > 0
        P_k(w | h) = P_{k-1}(w | h')                                               if S(h) = 0

    with a_k(h, w) = c(h w) at the highest order, else N1+(. h w) = |{u : c(u h w) > 0}|.
    Raises ValueError (naming the argument) for a bad ``order``, ``vocab_size`` or id, an empty
    ``train``, or a ``test`` of fewer than 3 tokens."""
    train, test = _checked(order, vocab_size, train=train, test=test)
    if len(test) < MAX_ORDER:
        raise ValueError(f"test has {len(test)} tokens; scoring starts at index {MAX_ORDER - 1}, "
                         f"so it needs at least {MAX_ORDER} for one scored token")
    V = vocab_size
    grams = _codes(test[MAX_ORDER - order:], order, V)  # ends at test[2:]
    p = (np.bincount(train, minlength=V)[grams % V] + 1) / (len(train) + V)  # P_1
    if order > 1:
        top, top_counts = np.unique(_codes(train, order, V), return_counts=True)  # c(h w)
        if order == 3:  # N1+(. v w): distinct left contexts u of each bigram v w
            cont, cont_counts = np.unique(top % (V * V), return_counts=True)
            p = _interpolate(cont, cont_counts, grams % (V * V), p, V)
        p = _interpolate(top, top_counts, grams, p, V)
    return float(-np.log(p).mean())


def _interpolate_dense(counts: np.ndarray, lower: np.ndarray) -> np.ndarray:
    total = counts.sum(-1, keepdims=True)
    types = (counts > 0).sum(-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = (np.maximum(counts - DISCOUNT, 0) + DISCOUNT * types * lower) / total
    return np.where(total > 0, p, lower)


def ngram_probabilities(train: np.ndarray, order: int, vocab_size: int) -> np.ndarray:
    """:func:`ngram_cross_entropy`'s model as a dense table (for checks), shape
    ``(vocab_size,) * order``, ``table[..., w]`` = P(w | the leading indices). Raises as it."""
    train, = _checked(order, vocab_size, train=train)
    V = vocab_size
    p = (np.bincount(train, minlength=V) + 1) / (len(train) + V)
    if order == 1:
        return p
    top = np.bincount(_codes(train, order, V), minlength=V ** order).reshape((V,) * order)
    if order == 3:
        p = _interpolate_dense((top > 0).sum(0), p[None, :])[None, :, :]  # N1+(. v w)
    return _interpolate_dense(top, p)


def ngram_references(train: np.ndarray, test: np.ndarray, vocab_size: int) -> dict[str, float]:
    """``{"unigram", "bigram", "trigram"}`` -> :func:`ngram_cross_entropy`."""
    return {name: ngram_cross_entropy(train, test, order, vocab_size)
            for order, name in _ORDER_NAMES.items()}


def uniform_cross_entropy(vocab_size: int) -> float:
    """``ln(vocab_size)`` (nats/char), a model's loss at initialisation; ValueError if < 1."""
    _checked(1, vocab_size)
    return float(np.log(vocab_size))


def _check_lengths(targets: Sequence[str], what: str = "targets[0]", length: int | None = None,
                   name: str = "targets", least: int = 1) -> int:
    if not len(targets):
        raise ValueError(f"{name} is empty: there is no answer to count or score")
    length = len(targets[0]) if length is None else length
    if length < least:
        raise ValueError(f"{what} has length {length}; answers need at least one character")
    for i, target in enumerate(targets):
        if len(target) != length:
            raise ValueError(f"{name}[{i}] has length {len(target)} but {what} has length "
                             f"{length}; all answers must have one length")
    return length


def constant_answer_scores(targets: Sequence[str], answer: str) -> dict:
    """``{"answer", "char_accuracy", "exact_match", "n_problems", "solved"}`` of answering
    ``answer`` to every problem (shares of positions, ``$`` included, and of answers). Raises
    ValueError for empty ``targets`` or ``answer``, or a target of another length."""
    _check_lengths(targets, "answer", len(answer))
    matches = sum(a == b for target in targets for a, b in zip(target, answer))
    solved = sum(target == answer for target in targets)
    return {"answer": answer, "char_accuracy": matches / (len(targets) * len(answer)),
            "exact_match": solved / len(targets), "n_problems": len(targets), "solved": solved}


def _mode(counts: Counter):
    return min(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0]


def best_constant_answer(targets: Sequence[str]) -> dict:
    """:func:`constant_answer_scores` of the most frequent character (ties: the smallest) at
    each position, chosen on the targets scored: an oracle floor. Raises as that function."""
    _check_lengths(targets)
    return constant_answer_scores(targets, "".join(_mode(Counter(c)) for c in zip(*targets)))


def most_frequent_answer(targets: Sequence[str]) -> dict:
    """:func:`constant_answer_scores` of the most frequent target (ties: the smallest)."""
    _check_lengths(targets)
    return constant_answer_scores(targets, _mode(Counter(targets)))


def all_zeros_answer(length: int) -> str:
    """``"0" * (length - 1) + "$"``. Raises ValueError for ``length`` < 1."""
    if length < 1:
        raise ValueError(f"length must be >= 1 (room for the closing '$'), got {length}")
    return "0" * (length - 1) + "$"


def answer_position_floor(train_targets: Sequence[str], test_targets: Sequence[str]) -> float:
    """Cross-entropy (nats per answer character) on ``test_targets`` of the best predictor
    that ignores the question, :data:`ANSWER_SMOOTHING`: with A the characters of either set,
    N = ``len(train_targets)``, c_j(x) the count of x at position j of the train answers,
    ``P_j(x) = (c_j(x) + 1) / (N + |A|)``; floor = -mean over t, j of ln P_j(t[j]). Raises
    ValueError for an empty set, or answers not all of one non-zero length."""
    width, test_width = (_check_lengths(t, f"{n}[0]", None, n, 0) for n, t in (
        ("train_targets", train_targets), ("test_targets", test_targets)))
    if width != test_width:
        raise ValueError(f"train answers have length {width}, test answers "
                         f"{test_width}; the floor needs one answer width")
    if width < 1:
        raise ValueError("the answers are empty strings; they need at least the closing '$'")
    denominator = len(train_targets) + len(set("".join(train_targets) + "".join(test_targets)))
    total = 0.0
    for j, column in enumerate(zip(*test_targets)):
        counts = Counter(target[j] for target in train_targets)
        total -= sum(k * np.log((counts[x] + 1) / denominator)
                     for x, k in Counter(column).items())
    return float(total / (len(test_targets) * width))
