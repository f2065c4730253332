"""lmablate.report.stats.reference_models: n-gram cross-entropies of a corpus and constant-answer
scores, the reference points a report prints next to model results."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest

from lmablate.report.stats.reference_models import (DISCOUNT, NGRAM_SMOOTHING, all_zeros_answer,
                                  answer_position_floor, best_constant_answer,
                                  constant_answer_scores,
                                  most_frequent_answer, ngram_cross_entropy,
                                  ngram_probabilities, ngram_references)


def slow_kneser_ney(train: list[int], order: int, V: int):
    """P(w | context) straight from the formula in ngram_cross_entropy's docstring, with dicts:
    raw counts at the top order, continuation counts below it, an add-one unigram at the bottom.
    """
    N, D = len(train), DISCOUNT
    unigram = defaultdict(int)
    for w in train:
        unigram[w] += 1

    def p1(ctx, w):
        return (unigram[w] + 1) / (N + V)

    def level(counts, lower):
        def p(ctx, w):  # ctx: tuple of k - 1 tokens
            total = sum(c for (h, _), c in counts.items() if h == ctx)
            if total == 0:
                return lower(ctx[1:], w)
            types = sum(1 for (h, _), c in counts.items() if h == ctx and c > 0)
            return (max(counts.get((ctx, w), 0) - D, 0) + D * types * lower(ctx[1:], w)) / total
        return p

    def raw(k):
        counts = defaultdict(int)
        for i in range(len(train) - k + 1):
            counts[tuple(train[i:i + k - 1]), train[i + k - 1]] += 1
        return counts

    def continuation(k):  # N1+(. h w): distinct left neighbours of each k-gram h w
        left = defaultdict(set)
        for i in range(1, len(train) - k + 1):
            left[tuple(train[i:i + k - 1]), train[i + k - 1]].add(train[i - 1])
        return {key: len(us) for key, us in left.items()}

    p = p1
    for k in range(2, order + 1):
        p = level(raw(k) if k == order else continuation(k), p)
    return p


def slow_cross_entropy(train, test, order, V):
    p = slow_kneser_ney(list(train), order, V)
    return -sum(math.log(p(tuple(test[i - order + 1:i]), test[i]))
                for i in range(2, len(test))) / (len(test) - 2)


# ---------------------------------------------------------------------------------------------
# n-gram cross-entropies
# ---------------------------------------------------------------------------------------------

def test_unigram_cross_entropy_of_a_tiny_text_equals_the_hand_computed_value():
    train = np.array([0, 0, 1, 0], dtype=np.uint8)
    test = np.array([1, 1, 0, 1, 0], dtype=np.uint8)  # scored from index 2: 0, 1, 0
    p0, p1 = (3 + 1) / (4 + 2), (1 + 1) / (4 + 2)
    expected = -(2 * math.log(p0) + math.log(p1)) / 3
    assert ngram_cross_entropy(train, test, 1, 2) == pytest.approx(expected, abs=1e-15)


def test_bigram_of_a_tiny_text_equals_the_hand_computed_kneser_ney_value():
    # bigrams of train: 00, 01, 10 -> context 0: S = 2, T = 2; context 1: S = 1, T = 1
    train, test = np.array([0, 0, 1, 0]), np.array([1, 1, 0, 1])  # scored: 1->0, 0->1
    u0, u1, D = 4 / 6, 2 / 6, 0.75
    p_0_after_1 = (1 - D + D * 1 * u0) / 1
    p_1_after_0 = (1 - D + D * 2 * u1) / 2
    expected = -(math.log(p_0_after_1) + math.log(p_1_after_0)) / 2
    assert ngram_cross_entropy(train, test, 2, 2) == pytest.approx(expected, abs=1e-15)


@pytest.mark.parametrize("order", [1, 2, 3])
def test_each_conditional_distribution_sums_to_one_for_seen_and_unseen_contexts(order):
    rng = np.random.default_rng(0)
    V = 6
    train = rng.integers(0, V - 2, 200)  # ids 4 and 5 never occur: unseen contexts exist
    table = ngram_probabilities(train, order, V)
    assert table.shape == (V,) * order
    assert (table > 0).all()
    np.testing.assert_allclose(table.sum(-1), 1.0, rtol=0, atol=1e-12)
    if order > 1:
        seen = np.zeros((V,) * (order - 1), dtype=bool)
        for i in range(len(train) - order + 1):
            seen[tuple(train[i:i + order - 1])] = True
        assert seen.any() and not seen.all()


@pytest.mark.parametrize("order", [1, 2, 3])
def test_cross_entropy_is_the_mean_negative_log_of_the_table_at_the_test_ngrams(order):
    rng = np.random.default_rng(1)
    V = 7
    train, test = rng.integers(0, V, 500), rng.integers(0, V, 120)
    table = ngram_probabilities(train, order, V)
    probs = [table[tuple(test[i - order + 1:i + 1])] for i in range(2, len(test))]
    expected = -np.mean(np.log(probs))
    assert ngram_cross_entropy(train, test, order, V) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("order", [1, 2, 3])
def test_vectorised_kneser_ney_agrees_with_a_slow_reference_to_1e_12(order):
    rng = np.random.default_rng(2)
    V = 5
    # skewed, so that some n-grams are frequent and some contexts unseen
    train = rng.choice(V, 300, p=[0.4, 0.3, 0.2, 0.1, 0.0])
    test = rng.integers(0, V, 80)
    fast = ngram_cross_entropy(train, test, order, V)
    assert fast == pytest.approx(slow_cross_entropy(train, test, order, V), abs=1e-12)
    slow = slow_kneser_ney(list(train), order, V)
    table = ngram_probabilities(train, order, V)
    for index in np.ndindex(table.shape):
        assert table[index] == pytest.approx(slow(index[:-1], index[-1]), abs=1e-12)


def test_on_structured_text_the_trigram_beats_the_bigram_which_is_no_worse_than_the_unigram():
    rng = np.random.default_rng(3)
    V = 3

    def text(n):
        ids = np.arange(n) % V  # "abcabc...", with a little noise
        noise = rng.random(n) < 0.05
        ids[noise] = rng.integers(0, V, noise.sum())
        return ids

    refs = ngram_references(text(20_000), text(2_000), V)
    assert refs["trigram"] < refs["bigram"] <= refs["unigram"]
    assert refs["unigram"] == pytest.approx(math.log(V), abs=0.01)
    assert refs["bigram"] < 0.5 * math.log(V)


def test_on_uniform_random_tokens_all_orders_are_close_to_log_vocab_size():
    rng = np.random.default_rng(4)
    V = 8
    refs = ngram_references(rng.integers(0, V, 200_000), rng.integers(0, V, 20_000), V)
    assert set(refs) == {"unigram", "bigram", "trigram"}
    for value in refs.values():
        assert value == pytest.approx(math.log(V), abs=0.02)
    assert "Kneser-Ney" in NGRAM_SMOOTHING and "add-one" in NGRAM_SMOOTHING


def test_every_order_scores_the_same_test_tokens_from_index_two():
    # a token before index 2 is only ever context: the unigram ignores both, the bigram test[0]
    train = np.array([0, 1, 2, 0, 1, 2, 0, 1])
    a, b = np.array([0, 1, 2, 0, 1]), np.array([2, 2, 2, 0, 1])
    assert ngram_cross_entropy(train, a, 1, 3) == ngram_cross_entropy(train, b, 1, 3)
    assert ngram_cross_entropy(train, a, 2, 3) == ngram_cross_entropy(train, [2, 1, 2, 0, 1], 2, 3)
    assert ngram_cross_entropy(train, a, 3, 3) != ngram_cross_entropy(train, [2, 1, 2, 0, 1], 3, 3)


def test_a_test_token_never_seen_in_train_gets_a_finite_loss():
    train, test = np.zeros(50, dtype=np.uint16), np.array([0, 0, 1, 1, 1], dtype=np.uint16)
    for order in (1, 2, 3):
        assert math.isfinite(ngram_cross_entropy(train, test, order, 2))


@pytest.mark.parametrize("kwargs, match", [
    (dict(order=0), "order must be 1, 2 or 3.*got 0"),
    (dict(order=4), "order must be 1, 2 or 3.*got 4"),
    (dict(vocab_size=0), "vocab_size must be an integer >= 1, got 0"),
    (dict(train=np.array([0, 1, 3])), r"train\[2\] = 3 is outside \[0, vocab_size = 3\)"),
    (dict(test=np.array([0, -1, 1])), r"test\[1\] = -1 is outside"),
    (dict(train=np.array([], dtype=np.int64)), "train is empty"),
    (dict(test=np.array([0, 1])), "test has 2 tokens.*at least 3"),
    (dict(train=np.array([0.0, 1.0])), "train must hold integer token ids"),
    (dict(test=np.zeros((2, 3), dtype=int)), "test must be a 1-D array"),
])
def test_bad_inputs_raise_value_errors_naming_the_argument(kwargs, match):
    args = dict(train=np.array([0, 1, 2, 0]), test=np.array([0, 1, 2]), order=2, vocab_size=3)
    with pytest.raises(ValueError, match=match):
        ngram_cross_entropy(**{**args, **kwargs})


# ---------------------------------------------------------------------------------------------
# constant answers
# ---------------------------------------------------------------------------------------------

def test_best_constant_answer_is_the_per_position_mode_scored_like_the_model():
    targets = ["12$", "13$", "22$"]
    best = best_constant_answer(targets)
    # "12$" matches 3, 2 and 2 of the 3 characters of each target
    assert best == {"answer": "12$", "char_accuracy": (3 + 2 + 2) / 9, "exact_match": 1 / 3,
                    "n_problems": 3, "solved": 1}


def test_constant_answer_scores_count_every_position_including_the_end_mark():
    scores = constant_answer_scores(["12$", "13$", "22$"], "00$")
    assert scores == {"answer": "00$", "char_accuracy": 3 / 9, "exact_match": 0.0,
                      "n_problems": 3, "solved": 0}


def test_ties_go_to_the_smallest_character_and_the_smallest_string():
    targets = ["b1$", "a2$", "b2$", "a1$"]  # every position and every whole target ties
    assert best_constant_answer(targets)["answer"] == "a1$"
    assert most_frequent_answer(targets)["answer"] == "a1$"
    assert best_constant_answer(list(reversed(targets)))["answer"] == "a1$"


def test_most_frequent_answer_is_the_best_constant_for_exact_match():
    targets = ["19$", "19$", "22$", "21$", "11$"]
    frequent = most_frequent_answer(targets)
    assert frequent["answer"] == "19$" and frequent["solved"] == 2
    assert frequent["exact_match"] == 2 / 5
    best = best_constant_answer(targets)  # position 1 ties "1" with "9": "1" wins
    assert best["answer"] == "11$" and best["char_accuracy"] >= frequent["char_accuracy"]


def test_all_zeros_answer_is_zeros_then_the_end_mark():
    assert all_zeros_answer(11) == "0000000000$"
    assert all_zeros_answer(1) == "$"
    with pytest.raises(ValueError, match="length must be >= 1"):
        all_zeros_answer(0)


def test_a_length_mismatch_names_the_first_bad_index_and_the_lengths():
    with pytest.raises(ValueError, match=r"targets\[1\] has length 2 but answer has length 3"):
        constant_answer_scores(["12$", "1$", "1$"], "00$")
    with pytest.raises(ValueError, match=r"targets\[2\] has length 4 but targets\[0\] has "
                                         r"length 3"):
        best_constant_answer(["12$", "13$", "123$"])
    with pytest.raises(ValueError, match="targets is empty"):
        most_frequent_answer([])


# ---------------------------------------------------------------------------------------------
# the answer-position floor
# ---------------------------------------------------------------------------------------------

def test_answer_position_floor_of_a_tiny_example_equals_the_hand_computed_value():
    train = ["12$", "10$", "22$"]
    test = ["12$", "30$"]
    # characters of either set: 0 1 2 3 $ -> |A| = 5; N = 3 -> every P_j(x) = (c_j(x) + 1) / 8
    # position 0: train 1 x2, 2 x1 -> test "1" 3/8, "3" 1/8
    # position 1: train 2 x2, 0 x1 -> test "2" 3/8, "0" 2/8
    # position 2: train $ x3       -> test "$" 4/8 twice
    logs = [math.log(p) for p in (3 / 8, 1 / 8, 3 / 8, 2 / 8, 4 / 8, 4 / 8)]
    assert answer_position_floor(train, test) == pytest.approx(-sum(logs) / 6, abs=1e-15)


def test_answer_position_floor_is_lowest_when_the_answers_repeat_the_training_ones():
    train = ["12$", "12$", "12$", "34$"]
    seen, unseen = answer_position_floor(train, ["12$"]), answer_position_floor(train, ["34$"])
    assert 0 < seen < unseen


@pytest.mark.parametrize("train, test, match", [
    ([], ["1$"], "train_targets is empty"),
    (["1$"], [], "test_targets is empty"),
    (["1$", "12$"], ["1$"], r"train_targets\[1\] has length 3 but train_targets\[0\] has "
                            "length 2"),
    (["1$"], ["1$", "2$", "123$"], r"test_targets\[2\] has length 4"),
    (["12$"], ["1$"], "train answers have length 3, test answers 2"),
    ([""], [""], "empty strings"),
])
def test_answer_position_floor_refuses_empty_or_unequal_answers(train, test, match):
    with pytest.raises(ValueError, match=match):
        answer_position_floor(train, test)
