"""The arithmetic task's format (seed 000, a GPT calculator): one rule to write, read and score it.

One problem per line::

    $(0000753.78+0000000910)=87.3661000$

``$(`` + operand a + op + operand b + ``)=`` + the *reversed* answer + ``$``. Operands lie in
(0, 1000]: half are integers 1..1000 (``910``), half have exactly two decimals (``2.08``, drawn
as integer cents 1..100000 and divided by 100). Operands and answer are left-padded with ``0``
to 10 characters (``-134.14`` -> ``000-134.14``); the answer is written with two decimals,
except that integer ``+ - *`` integer is written as an integer. Answers are exact: computed in
integer hundredths, and where the exact result has more than two decimals (``*`` of two decimal
operands, ``/``) rounded to the nearest hundredth with ties rounded half up
(``863.50*837.05`` = 722792.675 -> ``722792.68``; see :func:`format_problems`).
Every line is :data:`LINE_LENGTH` (36) characters long.

Everything else is derived from these constants: the offset of the operator
(:data:`OP_INDEX`), the prompt a model is given (:data:`PROMPT_LENGTH` characters, up to and
including ``=``), and the answer it must produce (:func:`split_problem`). The answer rule
exists once, vectorised (:func:`format_problems`); :func:`format_problem` is its one-problem
form, so generated data and hand-written problems can never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import numpy as np

from .config import DataError

__all__ = [
    "DataError", "Operand", "OPS", "OP_NAMES", "FIELD_WIDTH", "LINE_LENGTH", "OP_INDEX",
    "PROMPT_LENGTH", "format_problem", "format_problems", "split_problem", "problem_op",
    "generate_arithmetic",
]


OPS = ("+", "-", "*", "/")
OP_NAMES = {"+": "add", "-": "sub", "*": "mul", "/": "div"}  # per-operation metric names
FIELD_WIDTH = 10  # characters of each operand and of the answer, zero-padded on the left
OP_INDEX = len("$(") + FIELD_WIDTH  # the operator follows "$(" and the first operand
PROMPT_LENGTH = OP_INDEX + 1 + FIELD_WIDTH + len(")=")  # "$(" a op b ")=": what the model sees
LINE_LENGTH = PROMPT_LENGTH + FIELD_WIDTH + len("$")  # then the reversed answer and "$"
MAX_INTEGER = 1000  # integer operands are 1..MAX_INTEGER
MAX_CENTS = 100_000  # decimal operands are 0.01..1000.00, i.e. 1..MAX_CENTS hundredths


@dataclass(frozen=True)
class Operand:
    """One operand of a problem, in (0, 1000]: an integer, or a number with two decimals.

    ``cents`` is the value in hundredths (``910`` -> 91000, ``2.08`` -> 208); ``is_integer``
    says how it is written (``910`` vs ``910.00``). Build with :meth:`integer`, :meth:`decimal`,
    :meth:`parse` or :meth:`coerce`.

    Raises:
        DataError: out of range (integers 1..1000, decimals 0.01..1000.00).
    """

    cents: int
    is_integer: bool

    def __post_init__(self) -> None:
        if self.is_integer:
            if self.cents % 100 or not 1 <= self.cents // 100 <= MAX_INTEGER:
                raise DataError(f"integer operand {self.cents / 100:g} is not allowed; "
                                f"expected an integer in 1..{MAX_INTEGER}")
        elif not 1 <= self.cents <= MAX_CENTS:
            raise DataError(f"decimal operand {self.cents / 100:.2f} is not allowed; "
                            f"expected 0.01..{MAX_CENTS / 100:.2f}")

    @classmethod
    def integer(cls, n: int) -> "Operand":
        """An integer operand ``n`` in 1..1000, written without decimals."""
        return cls(int(n) * 100, True)

    @classmethod
    def decimal(cls, cents: int) -> "Operand":
        """A two-decimal operand of ``cents`` hundredths (1..100000), written ``f"{x:.2f}"``."""
        return cls(int(cents), False)

    @classmethod
    def parse(cls, text: str) -> "Operand":
        """From its written form: ``"910"`` (integer) or ``"2.08"`` (exactly two decimals).

        Leading zeros are allowed (``"0000002.08"``). Raises DataError for any other shape.
        """
        body = text.strip()
        whole, dot, frac = body.partition(".")
        ok = whole.isdigit() and (not dot or (len(frac) == 2 and frac.isdigit()))
        if not ok:
            raise DataError(f"operand {text!r} is not allowed; expected an integer like '910' "
                            "or a number with exactly two decimals like '2.08'")
        if not dot:
            return cls.integer(int(whole))
        return cls.decimal(int(whole) * 100 + int(frac))

    @classmethod
    def coerce(cls, x: Union["Operand", str, int, float]) -> "Operand":
        """An Operand as is; a str via :meth:`parse`; an int as an integer operand; a float as
        a two-decimal operand (it must have at most two decimals, e.g. ``753.78``)."""
        if isinstance(x, Operand):
            return x
        if isinstance(x, str):
            return cls.parse(x)
        if isinstance(x, (bool, np.bool_)):
            raise DataError(f"operand {x!r} is not allowed; expected a number")
        if isinstance(x, (int, np.integer)):
            return cls.integer(int(x))
        if isinstance(x, (float, np.floating)):
            cents = round(float(x) * 100)
            if abs(float(x) * 100 - cents) > 1e-6:
                raise DataError(f"operand {x!r} is not allowed; expected at most two decimals")
            return cls.decimal(cents)
        raise DataError(f"operand {x!r} is not allowed; expected an Operand, str, int or float")

    @property
    def value(self) -> float:
        """The number as a float, ``cents / 100`` (for display; answers are computed exactly
        from :attr:`cents`, never from this float)."""
        return self.cents / 100

    @property
    def text(self) -> str:
        """Its written form, unpadded: ``"910"`` or ``"2.08"``."""
        return _operand_text(self.cents, self.is_integer)


def _texts(hundredths: np.ndarray, as_integer: np.ndarray) -> list[str]:
    """Exact numbers of hundredths (int64) written as integers (where ``as_integer``; they
    must be multiples of 100) or with two decimals: ``91000`` -> ``"910"``, ``-13414`` ->
    ``"-134.14"``, ``0`` -> ``"0.00"`` (never ``"-0.00"``).

    The two-decimal form is ``f"{h / 100:.2f}"``, exact for ``|h| < 1e12`` (answers here are
    at most 1e8): the float is within 1e-4 of ``h / 100``, well inside the 0.005 that ``.2f``
    rounds away, and ``0 / 100`` is ``+0.0``. Twice as fast as formatting ``divmod(h, 100)``.
    """
    hundredths = np.asarray(hundredths, dtype=np.int64)
    whole, scaled = (hundredths // 100).tolist(), (hundredths / 100).tolist()
    return [str(w) if i else f"{x:.2f}"
            for i, w, x in zip(np.asarray(as_integer, dtype=bool).tolist(), whole, scaled)]


def _operand_text(cents: int, is_integer: bool) -> str:
    return _texts(np.array([cents]), np.array([is_integer]))[0]


def _divide_half_up(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """``num / den`` rounded to the nearest integer, ties up; elementwise, ``num >= 0``,
    ``den > 0`` (int64, exact)."""
    quotient, remainder = np.divmod(num, den)
    return quotient + (2 * remainder >= den)


def _answer_hundredths(op: str, a_cents: np.ndarray, b_cents: np.ndarray) -> np.ndarray:
    """``a op b`` in hundredths, exact, rounded half up where the exact result has more than
    two decimals; elementwise on int64 arrays of operands in hundredths (1..100000).

    ``+ -``: exact. ``*``: the exact product has four decimals (``a_cents * b_cents`` ten-
    thousandths, at most 1e10, so int64 is exact), rounded to hundredths. ``/``: the exact
    rational quotient (``100 * a_cents / b_cents`` hundredths) rounded to the nearest
    hundredth; a non-terminating quotient is never a tie.
    """
    if op == "+":
        return a_cents + b_cents
    if op == "-":
        return a_cents - b_cents
    if op == "*":
        return _divide_half_up(a_cents * b_cents, np.int64(100))
    return _divide_half_up(100 * a_cents, b_cents)


def _assemble(a: str, op: str, b: str, answer: str) -> str:
    """One line from unpadded parts: pad each field to 10 characters, reverse the answer."""
    w = FIELD_WIDTH
    return f"$({a.rjust(w, '0')}{op}{b.rjust(w, '0')})={answer.rjust(w, '0')[::-1]}$"


def format_problems(op_idx: np.ndarray, a_int: np.ndarray, a_cents: np.ndarray,
                    b_int: np.ndarray, b_cents: np.ndarray) -> list[str]:
    """Problem lines (no ``\n``) for arrays of operator indices into :data:`OPS`, and of the
    operands as (is_integer bool, value in cents int64, i.e. hundredths: ``910`` -> 91000,
    ``2.08`` -> 208).

    The answer rule: the answer is computed exactly in integer hundredths (no floats) and
    written with two decimals (``-134.14``; zero is ``0.00``, never ``-0.00``), except integer
    ``+ - *`` integer, written as an integer (``803``). ``+`` and ``-`` are exact. ``*`` is
    exact unless both operands are decimals: then the product has four decimals and is
    rounded to two. ``/`` (always two decimals, even integer / integer) is the exact quotient
    rounded to two decimals. Rounding is to the nearest hundredth, **ties half up** (Python's
    ``decimal.ROUND_HALF_UP``; every rounded result is positive, so this is also half away
    from zero). A tie means the exact result ends in a 5 in the third decimal and nothing
    after it: ``863.50*837.05`` = 722792.675 -> ``722792.68``, ``148/32`` = 4.625 -> ``4.63``,
    ``207.69/2`` = 103.845 -> ``103.85``. A non-terminating quotient (``400/344`` =
    1.16279...) is never a tie and rounds to the nearest (``1.16``).

    Raises:
        DataError: an operator index outside :data:`OPS`, or an operand outside what
            :class:`Operand` allows (decimals 1..100000 hundredths, integers 100..100000 and
            a multiple of 100).
    """
    op_idx = np.asarray(op_idx, dtype=np.int64)
    a_int, b_int = np.asarray(a_int, dtype=bool), np.asarray(b_int, dtype=bool)
    a_cents, b_cents = np.asarray(a_cents, dtype=np.int64), np.asarray(b_cents, dtype=np.int64)
    if np.any((op_idx < 0) | (op_idx >= len(OPS))):
        raise DataError(f"operator index out of 0..{len(OPS) - 1} is not allowed")
    for is_int, cents in ((a_int, a_cents), (b_int, b_cents)):
        if np.any((cents < 1) | (cents > MAX_CENTS) | (is_int & (cents % 100 != 0))):
            raise DataError("operand out of range is not allowed; expected integers 1..1000 "
                            "(100..100000 hundredths) or decimals 0.01..1000.00")
    hundredths = np.zeros(len(op_idx), dtype=np.int64)
    for k, op in enumerate(OPS):
        sel = op_idx == k
        hundredths[sel] = _answer_hundredths(op, a_cents[sel], b_cents[sel])
    as_integer = a_int & b_int & (op_idx != OPS.index("/"))  # hundredths a multiple of 100
    answers = _texts(hundredths, as_integer)
    a_text, b_text = _texts(a_cents, a_int), _texts(b_cents, b_int)
    ops = [OPS[k] for k in op_idx.tolist()]
    return [_assemble(*parts) for parts in zip(a_text, ops, b_text, answers)]


def format_problem(a: Union[Operand, str, int, float], op: str,
                   b: Union[Operand, str, int, float]) -> str:
    """The problem line for ``a op b`` (36 characters, no trailing newline), by the rule of
    :func:`format_problems`.

    ``a`` and ``b`` are :class:`Operand` values or anything :meth:`Operand.coerce` accepts:
    ``format_problem("753.78", "+", 910)`` -> ``"$(0000753.78+0000000910)=87.3661000$"``.

    Raises:
        DataError: an operand out of range or badly written, or ``op`` not one of ``+ - * /``.
    """
    if op not in OPS:
        raise DataError(f"operator {op!r} is not allowed; choose one of {' '.join(OPS)}")
    a, b = Operand.coerce(a), Operand.coerce(b)
    return format_problems([OPS.index(op)], [a.is_integer], [a.cents],
                           [b.is_integer], [b.cents])[0]


def split_problem(line: str) -> tuple[str, str]:
    """``$(a op b)=answer$`` -> (the prompt, its first :data:`PROMPT_LENGTH` characters up to
    and including ``=``; the target, the reversed answer with its closing ``$``).

    Raises:
        DataError: ``line`` is not :data:`LINE_LENGTH` characters with ``=`` where the format
            puts it.
    """
    if len(line) != LINE_LENGTH or line[PROMPT_LENGTH - 1] != "=":
        raise DataError(f"arithmetic problem {line!r} is not allowed; expected "
                        f"{LINE_LENGTH} characters like '$(0000753.78+0000000910)=87.3661000$'")
    return line[:PROMPT_LENGTH], line[PROMPT_LENGTH:]


def problem_op(line: str) -> str:
    """The operator (one of :data:`OPS`) of a problem line or prompt."""
    return line[OP_INDEX]


def _balanced_ops(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` operator indices into :data:`OPS`, equal counts up to one, shuffled."""
    return rng.permutation(np.arange(n, dtype=np.int64) % len(OPS))


def _draw_operands(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` operands as (is_integer bool array, value in cents int64 array), 50/50 kinds."""
    is_integer = rng.integers(0, 2, size=n).astype(bool)
    integers = rng.integers(1, MAX_INTEGER + 1, size=n, dtype=np.int64)
    cents = rng.integers(1, MAX_CENTS + 1, size=n, dtype=np.int64)
    return is_integer, np.where(is_integer, integers * 100, cents)


def _draw_problems(rng: np.random.Generator, op_idx: np.ndarray) -> list[str]:
    """One random problem line per entry of ``op_idx`` (operator indices into OPS)."""
    n = len(op_idx)
    a_int, a_cents = _draw_operands(rng, n)
    b_int, b_cents = _draw_operands(rng, n)
    return format_problems(op_idx, a_int, a_cents, b_int, b_cents)


def _check_count(key: str, value: object, minimum: int) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
        raise DataError(f"{key}={value!r} is not allowed; expected an integer >= {minimum}")
    return int(value)


def generate_arithmetic(n_train: int, n_test: int, seed: int) -> tuple[list[str], list[str]]:
    """Draw ``n_train`` pool problems and ``n_test`` test problems (lines without ``\\n``).

    Deterministic for a given ``seed`` (a :func:`numpy.random.default_rng` stream). In each set
    the four operators have equal counts (up to one) in shuffled order. The test problems are
    drawn first; the pool is then drawn and any pool problem that also occurs in the test set
    is redrawn (same operator) until none does, so the two are disjoint. Duplicates *within*
    a set are allowed (the problem space holds ~4e10 problems). About 1.5 s per million problems.

    Raises:
        DataError: ``n_train`` < 1, ``n_test`` < 0 or ``seed`` not a non-negative integer.
    """
    n_train = _check_count("n_train", n_train, 1)
    n_test = _check_count("n_test", n_test, 0)
    seed = _check_count("seed", seed, 0)
    rng = np.random.default_rng(seed)
    test = _draw_problems(rng, _balanced_ops(rng, n_test))
    forbidden = set(test)
    train_ops = _balanced_ops(rng, n_train)
    train = _draw_problems(rng, train_ops)
    clashes = np.array([i for i, line in enumerate(train) if line in forbidden], dtype=np.int64)
    while len(clashes):
        redrawn = _draw_problems(rng, train_ops[clashes])
        for i, line in zip(clashes.tolist(), redrawn):
            train[i] = line
        clashes = np.array([i for i in clashes.tolist() if train[i] in forbidden], dtype=np.int64)
    return train, test
