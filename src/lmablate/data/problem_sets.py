"""Drawing arithmetic problem sets: the training pool, the disjoint test problems and the
length-generalisation problems of a format (:class:`lmablate.data.arithmetic.ArithmeticFormat`),
each written by :func:`lmablate.data.arithmetic.format_problems`, deterministic for its seed."""

from __future__ import annotations

import numpy as np

from lmablate.core.validation import DataError
from lmablate.data.arithmetic import (MAX_DIGITS, OPS, SEED_FORMAT, ArithmeticFormat,
                                 format_problems)

__all__ = ["generate_arithmetic", "length_problems"]


def _balanced_ops(rng: np.random.Generator, n: int, fmt: ArithmeticFormat) -> np.ndarray:
    """``n`` operator indices into :data:`OPS` of the format's operations, equal counts up to
    one, shuffled."""
    allowed = np.array([OPS.index(op) for op in fmt.operations], dtype=np.int64)
    return allowed[rng.permutation(np.arange(n, dtype=np.int64) % len(allowed))]


def _draw_operands(rng: np.random.Generator, n: int, fmt: ArithmeticFormat,
                   low: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """``n`` operands as (is_integer bool array, value in cents int64 array): integers
    ``low``..max_operand and, with decimals, 50/50 kinds, decimals 0.01..max_operand.00 for
    ``low`` 1 (seed 000's draws, in its order) and ``low``.00..max_operand.00 above."""
    if not fmt.decimals:
        return np.ones(n, dtype=bool), 100 * rng.integers(low, fmt.max_operand + 1, size=n,
                                                          dtype=np.int64)
    is_integer = rng.integers(0, 2, size=n).astype(bool)
    integers = rng.integers(low, fmt.max_operand + 1, size=n, dtype=np.int64)
    cents = rng.integers(1 if low == 1 else 100 * low, fmt.max_cents + 1, size=n,
                         dtype=np.int64)
    return is_integer, np.where(is_integer, integers * 100, cents)


def _draw_problems(rng: np.random.Generator, op_idx: np.ndarray, fmt: ArithmeticFormat,
                   low: int = 1) -> list[str]:
    """One random problem line per entry of ``op_idx`` (operator indices into OPS)."""
    n = len(op_idx)
    a_int, a_cents = _draw_operands(rng, n, fmt, low)
    b_int, b_cents = _draw_operands(rng, n, fmt, low)
    return format_problems(op_idx, a_int, a_cents, b_int, b_cents, fmt)


def _check_count(key: str, value: object, minimum: int) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
        raise DataError(f"{key}={value!r} is not allowed; expected an integer >= {minimum}")
    return int(value)


def generate_arithmetic(n_train: int, n_test: int, seed: int,
                        fmt: ArithmeticFormat = SEED_FORMAT) -> tuple[list[str], list[str]]:
    """Draw ``n_train`` pool problems and ``n_test`` test problems of format ``fmt`` (lines
    without ``\\n``).

    Deterministic for a given ``seed`` (a :func:`numpy.random.default_rng` stream). In each set
    the format's operations have equal counts (up to one) in shuffled order. The test problems
    are drawn first; the pool is then drawn and any pool problem that also occurs in the test
    set is redrawn (same operator) until none does, so the two are disjoint. Duplicates
    *within* a set are allowed. About 1.5 s per million problems. With :data:`SEED_FORMAT`
    the draws are those of seed 000's generator, problem for problem.

    Raises:
        DataError: ``n_train`` < 1, ``n_test`` < 0 or ``seed`` not a non-negative integer;
            a test set that leaves no problem for the pool (it holds every problem there is).
    """
    n_train = _check_count("n_train", n_train, 1)
    n_test = _check_count("n_test", n_test, 0)
    seed = _check_count("seed", seed, 0)
    rng = np.random.default_rng(seed)
    test = _draw_problems(rng, _balanced_ops(rng, n_test, fmt), fmt)
    forbidden = set(test)
    train_ops = _balanced_ops(rng, n_train, fmt)
    train = _draw_problems(rng, train_ops, fmt)
    clashes = np.array([i for i, line in enumerate(train) if line in forbidden], dtype=np.int64)
    for _ in range(1000):
        if not len(clashes):
            return train, test
        redrawn = _draw_problems(rng, train_ops[clashes], fmt)
        for i, line in zip(clashes.tolist(), redrawn):
            train[i] = line
        clashes = np.array([i for i in clashes.tolist() if train[i] in forbidden],
                           dtype=np.int64)
    raise DataError(f"n_test={n_test} is not allowed: the test problems leave (almost) no "
                    "problem of this format for the training pool; draw fewer test problems "
                    "or raise digits")


def length_problems(fmt: ArithmeticFormat, n_digits: int, n: int, seed: int) -> list[str]:
    """``n`` problems whose operands both have exactly ``n_digits`` digits before the point,
    in the format of ``fmt`` at that many digits (:meth:`ArithmeticFormat.at_digits`): the
    length-generalisation split of ``n_digits`` (Kazemnejad et al. 2023; Zhou et al. 2024).

    Operands are integers 10^(n_digits-1)..10^n_digits - 1 and, with decimals, half of them
    two-decimal numbers in the same integer range. Deterministic for (``seed``,
    ``n_digits``). Disjoint from any problem of ``fmt`` when ``n_digits`` exceeds the digits of
    ``fmt.max_operand``, since every operand is longer.

    Raises:
        DataError: ``n_digits`` outside 1..:data:`MAX_DIGITS`, ``n`` < 0.
    """
    n = _check_count("n", n, 0)
    if not isinstance(n_digits, int) or not 1 <= n_digits <= MAX_DIGITS:
        raise DataError(f"n_digits={n_digits!r} is not allowed; expected 1..{MAX_DIGITS}")
    long = fmt.at_digits(n_digits)
    rng = np.random.default_rng([_check_count("seed", seed, 0), n_digits])
    return _draw_problems(rng, _balanced_ops(rng, n, long), long, low=10 ** (n_digits - 1))
