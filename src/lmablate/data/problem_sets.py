"""Drawing arithmetic problem sets: the training pool, the disjoint test problems and the
length-generalisation problems of a format (:class:`lmablate.data.arithmetic.ArithmeticFormat`),
each written by :func:`lmablate.data.arithmetic.format_problems`, deterministic for its seed."""

from __future__ import annotations

import numpy as np

from lmablate.core.validation import DataError
from lmablate.data.arithmetic import (MAX_DIGITS, OPS, SEED_FORMAT, ArithmeticFormat,
                                 format_problems)

__all__ = ["SAMPLINGS", "carries", "generate_arithmetic", "length_problems"]

# how the training pool is drawn: every problem equally likely, or equal shares of each number
# of carries (+) or borrows (-) within each operation (Lee et al. 2023, "Teaching Arithmetic to
# Small Transformers", sec. 4: balanced carries)
SAMPLINGS = ("uniform", "carries")
CARRY_OPS = ("+", "-")  # the operations sampling "carries" balances; * and / stay uniform


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


def carries(op_idx: np.ndarray, a_cents: np.ndarray, b_cents: np.ndarray) -> np.ndarray:
    """The number of carries of each ``+`` problem and of borrows of each ``-`` problem, its
    digits aligned at the decimal point (values in hundredths, int64 arrays (N,)); 0 for ``*``
    and ``/``. Borrows are counted in the larger operand minus the smaller (the answer's
    magnitude): ``23-48`` counts those of 48 - 23 (none), ``42-28`` those of 42 - 28 (one).
    ``99+1`` carries twice."""
    op_idx, a, b = (np.asarray(x, dtype=np.int64) for x in (op_idx, a_cents, b_cents))
    add, sub = op_idx == OPS.index("+"), op_idx == OPS.index("-")
    hi, lo = np.where(sub, np.maximum(a, b), a), np.where(sub, np.minimum(a, b), b)
    count = np.zeros(len(op_idx), dtype=np.int64)
    carry = np.zeros(len(op_idx), dtype=np.int64)
    while (hi > 0).any() or (lo > 0).any():
        x, y = hi % 10, lo % 10
        carry = np.where(add, (x + y + carry) >= 10, (x - y - carry) < 0).astype(np.int64)
        count += carry
        hi, lo = hi // 10, lo // 10
    return np.where(add | sub, count, 0)


def _draw_by_carries(rng: np.random.Generator, op_idx: np.ndarray, fmt: ArithmeticFormat,
                     forbidden: set[str]) -> list[str]:
    """One problem per entry of ``op_idx``, none in ``forbidden``: within each operation of
    :data:`CARRY_OPS`, equal counts (up to one) of each number of :func:`carries` that its
    first draw of candidates shows (drawn uniformly, then kept per class in draw order until
    each class is full); the other operations drawn uniformly. Problems keep ``op_idx``'s
    order of operations; within an operation the classes are shuffled."""
    out = [""] * len(op_idx)
    for k in np.unique(op_idx).tolist():
        slots = np.flatnonzero(op_idx == k)
        chosen: dict[int, list[str]] = {}
        quota: dict[int, int] | None = None
        for _ in range(1000):
            ops = np.full(max(4 * len(slots), 4096), k, dtype=np.int64)
            a_int, a_cents = _draw_operands(rng, len(ops), fmt)
            b_int, b_cents = _draw_operands(rng, len(ops), fmt)
            lines = format_problems(ops, a_int, a_cents, b_int, b_cents, fmt)
            classes = (carries(ops, a_cents, b_cents) if OPS[k] in CARRY_OPS
                       else np.zeros(len(ops), dtype=np.int64))
            if quota is None:  # the classes this operation has, each an equal share
                kinds = np.unique(classes).tolist()
                quota = {c: len(slots) // len(kinds) + (i < len(slots) % len(kinds))
                         for i, c in enumerate(kinds)}
                chosen = {c: [] for c in kinds}
            for line, c in zip(lines, classes.tolist()):
                if c in quota and len(chosen[c]) < quota[c] and line not in forbidden:
                    chosen[c].append(line)
            if all(len(chosen[c]) >= q for c, q in quota.items()):
                break
        else:
            raise DataError(f"sampling='carries' is not allowed for this format: its "
                            f"{OPS[k]!r} problems outside the test set leave a number of "
                            "carries too rare to fill; use sampling 'uniform'")
        drawn = [line for c in chosen for line in chosen[c]]
        for slot, i in zip(slots.tolist(), rng.permutation(len(drawn)).tolist()):
            out[slot] = drawn[i]
    return out


def _check_count(key: str, value: object, minimum: int) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
        raise DataError(f"{key}={value!r} is not allowed; expected an integer >= {minimum}")
    return int(value)


def generate_arithmetic(n_train: int, n_test: int, seed: int,
                        fmt: ArithmeticFormat = SEED_FORMAT,
                        sampling: str = "uniform") -> tuple[list[str], list[str]]:
    """Draw ``n_train`` pool problems and ``n_test`` test problems of format ``fmt`` (lines
    without ``\\n``).

    ``sampling`` (:data:`SAMPLINGS`) draws the pool: ``uniform``, every problem equally
    likely, or ``carries``, equal shares of each number of carries or borrows within each
    operation (:func:`_draw_by_carries`). The test problems are always uniform: they measure
    the task as it is, not as it was taught.

    Deterministic for a given ``seed`` (a :func:`numpy.random.default_rng` stream). In each set
    the format's operations have equal counts (up to one) in shuffled order. The test problems
    are drawn first; the pool is then drawn and any pool problem that also occurs in the test
    set is redrawn (same operator) until none does, so the two are disjoint. Duplicates
    *within* a set are allowed. About 1.5 s per million problems. With :data:`SEED_FORMAT`
    the draws are those of seed 000's generator, problem for problem.

    Raises:
        DataError: ``n_train`` < 1, ``n_test`` < 0 or ``seed`` not a non-negative integer;
            ``sampling`` not one of :data:`SAMPLINGS`, or ``carries`` where a class of carries
            cannot be filled;
            a test set that leaves no problem for the pool (it holds every problem there is).
    """
    n_train = _check_count("n_train", n_train, 1)
    n_test = _check_count("n_test", n_test, 0)
    seed = _check_count("seed", seed, 0)
    rng = np.random.default_rng(seed)
    test = _draw_problems(rng, _balanced_ops(rng, n_test, fmt), fmt)
    forbidden = set(test)
    train_ops = _balanced_ops(rng, n_train, fmt)
    if sampling == "carries":
        return _draw_by_carries(rng, train_ops, fmt, forbidden), test
    if sampling != "uniform":
        raise DataError(f"sampling={sampling!r} is not allowed; expected one of "
                        f"{', '.join(SAMPLINGS)}")
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
