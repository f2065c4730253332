"""Reference points computed from the data alone, printed next to model results in a report.

A test loss or an exact-match score means little on its own: these say what a model gets for
free. Two kinds:

* **n-gram cross-entropies** of a character corpus (:func:`ngram_cross_entropy`,
  :func:`ngram_references`): what counting unigrams, bigrams and trigrams in the train split
  achieves on the test split, in nats/char. A transformer that cannot beat the trigram has
  learned little beyond local character statistics. Worse than them all, the uniform prediction
  (:func:`uniform_cross_entropy`, ``ln(vocab_size)``): the loss a model starts from.
* **constant answers** for the arithmetic task (:func:`constant_answer_scores`,
  :func:`best_constant_answer`, :func:`most_frequent_answer`, :func:`all_zeros_answer`): the
  character accuracy and exact match of an answer that ignores the question. Leading zero
  padding and the closing ``$`` make character accuracy far from 0 for such answers.
* **the answer-position floor** (:func:`answer_position_floor`): the answer loss, in nats per
  answer character, of the best predictor that ignores the question, the character
  frequencies of the training answers at each answer position (:data:`ANSWER_SMOOTHING`).

Smoothing (:data:`NGRAM_SMOOTHING`) is interpolated Kneser-Ney with one absolute discount
``D = 0.75`` over an add-one unigram, vectorised with numpy (no loop over tokens). Sources:
R. Kneser and H. Ney, "Improved backing-off for m-gram language modeling", ICASSP 1995; S. F.
Chen and J. Goodman, "An empirical study of smoothing techniques for language modeling",
Harvard TR-10-98 (1998) / Computer Speech and Language 13:359-394 (1999), the interpolated form
of Kneser-Ney smoothing. The formulas are in :func:`ngram_cross_entropy`.

Numpy and the standard library only: the report stage imports this, and a stage start-up pays
for every import.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

import numpy as np

__all__ = [
    "DISCOUNT", "MAX_ORDER", "NGRAM_SMOOTHING", "ngram_cross_entropy", "ngram_probabilities",
    "ngram_references", "uniform_cross_entropy", "constant_answer_scores", "best_constant_answer",
    "most_frequent_answer", "all_zeros_answer", "ANSWER_SMOOTHING", "answer_position_floor",
]

DISCOUNT = 0.75  # D, the one absolute discount of every order >= 2
MAX_ORDER = 3  # trigram; every order scores test tokens from index MAX_ORDER - 1 on
NGRAM_SHORT = "Kneser-Ney"  # the smoothing's name in a figure legend
NGRAM_SMOOTHING = f"interpolated Kneser-Ney (D = {DISCOUNT}) over an add-one unigram"
_ORDER_NAMES = {1: "unigram", 2: "bigram", 3: "trigram"}


# ---------------------------------------------------------------------------------------------
# n-gram cross-entropies
# ---------------------------------------------------------------------------------------------

def _check_vocab_order(order: int, vocab_size: int) -> None:
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) \
            or vocab_size < 1:
        raise ValueError(f"vocab_size must be an integer >= 1, got {vocab_size!r}")
    if isinstance(order, bool) or order not in _ORDER_NAMES:
        raise ValueError(f"order must be 1, 2 or 3 (unigram, bigram, trigram), got {order!r}")


def _check_ids(name: str, ids, vocab_size: int) -> np.ndarray:
    """``ids`` as a 1-D int64 array, every id in [0, vocab_size)."""
    ids = np.asarray(ids)
    if ids.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of token ids, got shape {ids.shape}")
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"{name} must hold integer token ids, got dtype {ids.dtype}")
    ids = ids.astype(np.int64)
    bad = np.flatnonzero((ids < 0) | (ids >= vocab_size))
    if bad.size:
        raise ValueError(f"{name}[{bad[0]}] = {ids[bad[0]]} is outside [0, vocab_size = "
                         f"{vocab_size}); {bad.size} ids of {name} are")
    return ids


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
    """P_k(w | h) at ``queries`` (codes of h w) given k-gram ``counts`` a_k(h, w) at the sorted
    codes ``grams`` and P_{k-1}(w | h') at the same queries (``lower``); see the formula in
    :func:`ngram_cross_entropy`."""
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


def _probabilities_at(train: np.ndarray, grams: np.ndarray, order: int,
                      vocab_size: int) -> np.ndarray:
    """P_order(w | h) at each query code ``grams`` (of ``order`` tokens h w)."""
    V = vocab_size
    p = (np.bincount(train, minlength=V)[grams % V] + 1) / (len(train) + V)  # P_1
    if order == 1:
        return p
    top, top_counts = np.unique(_codes(train, order, V), return_counts=True)  # raw c(h w)
    if order == 3:
        # continuation counts N1+(. v w): distinct left contexts u of each bigram v w
        cont, cont_counts = np.unique(top % (V * V), return_counts=True)
        p = _interpolate(cont, cont_counts, grams % (V * V), p, V)
    return _interpolate(top, top_counts, grams, p, V)


def ngram_cross_entropy(train: np.ndarray, test: np.ndarray, order: int,
                        vocab_size: int) -> float:
    """Cross-entropy (nats/char) on ``test`` of an interpolated Kneser-Ney n-gram model
    counted on ``train``.

    ``train``, ``test``: 1-D integer arrays of token ids in [0, vocab_size) (any integer dtype).
    ``order``: 1 (unigram), 2 (bigram) or 3 (trigram).

    **Scored tokens.** Every test token from index ``MAX_ORDER - 1 = 2`` on, for every order, so
    the three numbers are means over the same ``len(test) - 2`` tokens and comparable; the
    context of ``test[i]`` is the ``order - 1`` test tokens before it. Counts come from n-grams
    inside ``train`` only. Result: ``-mean_i log P_order(test[i] | test[i-order+1:i])``.

    **Formulas.** V = ``vocab_size``, N = ``len(train)``, D = :data:`DISCOUNT` = 0.75, c(x) the
    number of occurrences of the n-gram x in ``train``. At the bottom, an add-one (Laplace)
    unigram over the whole vocabulary, so no token has probability zero::

        P_1(w) = (c(w) + 1) / (N + V)

    Each order k = 2..``order`` (context h of k - 1 tokens, h' = h without its first token,
    P_1 ignores its context) discounts a count a_k(h, w) and interpolates with order k - 1::

        S(h) = sum_w a_k(h, w)                 (the context's total)
        T(h) = |{w : a_k(h, w) > 0}|           (distinct words after h)
        P_k(w | h) = (max(a_k(h, w) - D, 0) + D * T(h) * P_{k-1}(w | h')) / S(h)   if S(h) > 0
        P_k(w | h) = P_{k-1}(w | h')                                               if S(h) = 0

    The highest order (k = ``order``) uses raw counts, a_k(h, w) = c(h w); a lower order
    k < ``order`` uses Kneser-Ney continuation counts, a_k(h, w) = N1+(. h w) = |{u : c(u h w)
    > 0}|, the number of distinct tokens seen before h w. Every a_k > 0 is an integer >= 1 > D,
    so the discounted mass is exactly D * T(h) / S(h) and each P_k(. | h) sums to 1 over the
    vocabulary. (Chen & Goodman 1998 interpolate Kneser-Ney down to a continuation unigram; the
    add-one unigram at the bottom is this module's choice, so unseen characters stay finite.)

    Sources: Kneser & Ney, ICASSP 1995; Chen & Goodman, "An empirical study of smoothing
    techniques for language modeling", TR-10-98 (1998), interpolated Kneser-Ney.

    Vectorised: n-grams become integer codes (``a*V*V + b*V + c``) counted with ``np.unique``;
    a 1M-token train and 50k-token test split with V = 65 take well under a second.

    Raises ValueError (naming the argument) for ``order`` not in {1, 2, 3}, ``vocab_size`` < 1,
    a split not 1-D or not of integers, ids outside [0, vocab_size), an empty ``train``, or a
    ``test`` of fewer than 3 tokens (no scored token).
    """
    _check_vocab_order(order, vocab_size)
    train = _check_ids("train", train, vocab_size)
    test = _check_ids("test", test, vocab_size)
    if not train.size:
        raise ValueError("train is empty: there is nothing to count n-grams in")
    if len(test) < MAX_ORDER:
        raise ValueError(f"test has {len(test)} tokens; scoring starts at index {MAX_ORDER - 1}, "
                         f"so it needs at least {MAX_ORDER} for one scored token")
    grams = _codes(test[MAX_ORDER - order:], order, vocab_size)  # ends at test[2:]
    p = _probabilities_at(train, grams, order, vocab_size)
    return float(-np.log(p).mean())


def _interpolate_dense(counts: np.ndarray, lower: np.ndarray) -> np.ndarray:
    """Dense P_k(w | h) over all h, w from the dense counts a_k (shape (V,) * k) and P_{k-1}
    broadcast to the same shape."""
    total = counts.sum(-1, keepdims=True)
    types = (counts > 0).sum(-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = (np.maximum(counts - DISCOUNT, 0) + DISCOUNT * types * lower) / total
    return np.where(total > 0, p, lower)


def ngram_probabilities(train: np.ndarray, order: int, vocab_size: int) -> np.ndarray:
    """The whole conditional table of :func:`ngram_cross_entropy`'s model, shape
    ``(vocab_size,) * order``: ``table[..., w]`` = P_order(w | context), the context being the
    leading ``order - 1`` indices. Each row ``table[h]`` sums to 1.

    A dense second implementation of the same formulas (V ** order floats: for checks and small
    vocabularies). Raises ValueError as :func:`ngram_cross_entropy` does.
    """
    _check_vocab_order(order, vocab_size)
    train = _check_ids("train", train, vocab_size)
    if not train.size:
        raise ValueError("train is empty: there is nothing to count n-grams in")
    V = vocab_size
    p = (np.bincount(train, minlength=V) + 1) / (len(train) + V)
    if order == 1:
        return p
    top = np.bincount(_codes(train, order, V), minlength=V ** order).reshape((V,) * order)
    if order == 3:
        p = _interpolate_dense((top > 0).sum(0), p[None, :])  # N1+(. v w)
        p = p[None, :, :]
    return _interpolate_dense(top, p)


def ngram_references(train: np.ndarray, test: np.ndarray, vocab_size: int) -> dict[str, float]:
    """``{"unigram", "bigram", "trigram"}``: :func:`ngram_cross_entropy` of each order, nats/char,
    all over the same test tokens (index 2 on). Raises ValueError as that function does."""
    return {name: ngram_cross_entropy(train, test, order, vocab_size)
            for order, name in _ORDER_NAMES.items()}


def uniform_cross_entropy(vocab_size: int) -> float:
    """``ln(vocab_size)``, nats/char: the cross-entropy of the uniform prediction over the
    vocabulary, whatever the text. It is a model's loss at initialisation when its logits start
    equal (near zero); the report's learning-rate sensitivity counts a diverged run at this
    loss (:func:`lmablate.report.stats.sensitivity.lr_sensitivity`). Raises ValueError unless
    ``vocab_size`` is an integer >= 1."""
    _check_vocab_order(1, vocab_size)
    return float(np.log(vocab_size))


# ---------------------------------------------------------------------------------------------
# constant answers for the arithmetic task
# ---------------------------------------------------------------------------------------------

def _check_lengths(targets: Sequence[str], length: int, what: str) -> None:
    if not len(targets):
        raise ValueError("targets is empty: there is no problem to score")
    if length < 1:
        raise ValueError(f"{what} has length {length}; answers need at least one character")
    for i, target in enumerate(targets):
        if len(target) != length:
            raise ValueError(f"targets[{i}] has length {len(target)} but {what} has length "
                             f"{length}; all answers must have the same length")


def constant_answer_scores(targets: Sequence[str], answer: str) -> dict:
    """Scores of answering ``answer`` to every problem, defined as the model's scores are.

    ``char_accuracy``: share of all answer positions (every problem, every position, the final
    ``$`` included) where ``answer`` equals the target, in [0, 1]. ``exact_match``: share of
    problems whose whole target equals ``answer``, in [0, 1]; ``solved`` is their number.

    Returns ``{"answer", "char_accuracy", "exact_match", "n_problems", "solved"}``. Raises
    ValueError if ``targets`` is empty, ``answer`` is empty, or a target's length differs from
    ``answer``'s (naming the first such index and both lengths).
    """
    _check_lengths(targets, len(answer), "answer")
    matches = sum(a == b for target in targets for a, b in zip(target, answer))
    solved = sum(target == answer for target in targets)
    return {"answer": answer, "char_accuracy": matches / (len(targets) * len(answer)),
            "exact_match": solved / len(targets), "n_problems": len(targets), "solved": solved}


def _mode(counts: Counter):
    """The most common key; ties go to the smallest, so the choice is deterministic."""
    return min(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0]


def best_constant_answer(targets: Sequence[str]) -> dict:
    """The constant answer of highest character accuracy on ``targets``, scored by
    :func:`constant_answer_scores`: at each position the most frequent target character (ties
    to the smallest character).

    It is chosen on the very targets it is scored on, so its character accuracy is an upper
    bound for any constant answer: an oracle floor that a model must beat to show that it reads
    the question. Raises ValueError for empty ``targets`` or unequal lengths (first bad index).
    """
    _check_lengths(targets, len(targets[0]) if len(targets) else 0, "targets[0]")
    answer = "".join(_mode(Counter(column)) for column in zip(*targets))
    return constant_answer_scores(targets, answer)


def most_frequent_answer(targets: Sequence[str]) -> dict:
    """The most frequent whole target (ties to the smallest string), scored by
    :func:`constant_answer_scores`: the constant answer of highest exact match, chosen on the
    targets it is scored on like :func:`best_constant_answer`. Raises ValueError as it does."""
    _check_lengths(targets, len(targets[0]) if len(targets) else 0, "targets[0]")
    return constant_answer_scores(targets, _mode(Counter(targets)))


def all_zeros_answer(length: int) -> str:
    """``"0" * (length - 1) + "$"``: all zeros, then the end mark. Raises ValueError for
    ``length`` < 1."""
    if length < 1:
        raise ValueError(f"length must be >= 1 (room for the closing '$'), got {length}")
    return "0" * (length - 1) + "$"


ANSWER_SMOOTHING = ("per answer position, the training answers' character frequencies, add-one "
                    "over the characters of either set")


def answer_position_floor(train_targets: Sequence[str], test_targets: Sequence[str]) -> float:
    """Cross-entropy, in nats per answer character, on ``test_targets`` of the best predictor
    that ignores the question: at each answer position j, the frequencies of the characters at
    position j of ``train_targets``. It is the answer-loss analogue of the constant answers
    (:func:`best_constant_answer`): a model whose answer loss is not below it has learned the
    answers' shape (padding, the closing ``$``, the usual leading digits) but nothing about
    the question.

    Targets are answers as the model writes them (reversed, the closing ``$`` included), every
    one of a set of the same length L, the two sets of the same L. With A the characters that
    occur in either set, N = ``len(train_targets)`` and c_j(x) the count of x at position j of
    the training answers, the prediction is smoothed add-one over A (:data:`ANSWER_SMOOTHING`,
    so no test character has probability 0)::

        P_j(x) = (c_j(x) + 1) / (N + |A|)
        floor = -mean over test answers t and positions j of ln P_j(t[j])

    Raises:
        ValueError: either set is empty; a set's targets differ in length (naming the set, the
            first such index and both lengths); the two sets' lengths differ; targets are
            empty strings.
    """
    for name, targets in (("train_targets", train_targets), ("test_targets", test_targets)):
        if not len(targets):
            raise ValueError(f"{name} is empty: there is no answer to count or score")
        for i, target in enumerate(targets):
            if len(target) != len(targets[0]):
                raise ValueError(f"{name}[{i}] has length {len(target)} but {name}[0] has "
                                 f"length {len(targets[0])}; all answers must have one length")
    width = len(train_targets[0])
    if width != len(test_targets[0]):
        raise ValueError(f"train answers have length {width}, test answers "
                         f"{len(test_targets[0])}; the floor needs one answer width")
    if width < 1:
        raise ValueError("the answers are empty strings; they need at least the closing '$'")
    alphabet = set("".join(train_targets)) | set("".join(test_targets))
    total = 0.0
    for j, column in enumerate(zip(*test_targets)):
        counts = Counter(target[j] for target in train_targets)
        denominator = len(train_targets) + len(alphabet)
        total -= sum(k * np.log((counts[x] + 1) / denominator)
                     for x, k in Counter(column).items())
    return float(total / (len(test_targets) * width))
