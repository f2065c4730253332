"""The arithmetic task's format (seed 000, a GPT calculator): one rule to write, read and score it.

One problem per line::

    $(0000753.78+0000000910)=87.3661000$

``$(`` + operand a + op + operand b + ``)=`` + the *reversed* answer + ``$``. Operands lie in
(0, 1000]: half are integers 1..1000 (``910``), half have exactly two decimals (``2.08``, drawn
as integer cents 1..100000 and divided by 100). Operands and answer are left-padded with ``0``
to 10 characters (``-134.14`` -> ``000-134.14``); the answer is rounded to two decimals and
written with two decimals, except that integer ``+ - *`` integer is written as an integer.
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
        """The number as a float (a decimal is ``cents / 100``, as the generator computes it)."""
        return float(self.cents // 100) if self.is_integer else self.cents / 100

    @property
    def text(self) -> str:
        """Its written form, unpadded: ``"910"`` or ``"2.08"``."""
        return _operand_text(self.cents, self.is_integer)



def _operand_text(cents: int, is_integer: bool) -> str:
    return str(cents // 100) if is_integer else f"{cents / 100:.2f}"


def _two_decimals(x: float) -> str:
    """``f"{x:.2f}"`` without a negative zero."""
    s = f"{x:.2f}"
    return "0.00" if s == "-0.00" else s


def _apply(op: str, x, y):
    """``x op y``, elementwise on numpy arrays."""
    if op == "+":
        return x + y
    if op == "-":
        return x - y
    if op == "*":
        return x * y
    return x / y


def _assemble(a: str, op: str, b: str, answer: str) -> str:
    """One line from unpadded parts: pad each field to 10 characters, reverse the answer."""
    w = FIELD_WIDTH
    return f"$({a.rjust(w, '0')}{op}{b.rjust(w, '0')})={answer.rjust(w, '0')[::-1]}$"


def format_problems(op_idx: np.ndarray, a_int: np.ndarray, a_cents: np.ndarray,
                    b_int: np.ndarray, b_cents: np.ndarray) -> list[str]:
    """Problem lines (no ``\n``) for arrays of operator indices into :data:`OPS`, and of the
    operands as (is_integer bool, value in cents int64).

    The answer is computed in float64 and written ``f"{ans:.2f}"`` (negative zero written
    ``0.00``), except integer ``+ - *`` integer, computed and written as an exact integer. A
    decimal operand's value is ``cents / 100``, an integer's ``cents // 100``.
    """
    op_idx = np.asarray(op_idx, dtype=np.int64)
    a_int, b_int = np.asarray(a_int, dtype=bool), np.asarray(b_int, dtype=bool)
    a_cents, b_cents = np.asarray(a_cents, dtype=np.int64), np.asarray(b_cents, dtype=np.int64)
    a_val = np.where(a_int, (a_cents // 100).astype(np.float64), a_cents / 100)
    b_val = np.where(b_int, (b_cents // 100).astype(np.float64), b_cents / 100)
    ans_float = np.zeros(len(op_idx))
    ans_int = np.zeros(len(op_idx), dtype=np.int64)
    for k, op in enumerate(OPS):
        sel = op_idx == k
        ans_float[sel] = _apply(op, a_val[sel], b_val[sel])
        if op != "/":
            ans_int[sel] = _apply(op, a_cents[sel] // 100, b_cents[sel] // 100)
    exact = a_int & b_int & (op_idx != OPS.index("/"))
    answers = [str(i) if e else _two_decimals(f)
               for e, i, f in zip(exact.tolist(), ans_int.tolist(), ans_float.tolist())]
    a_text = [_operand_text(c, i) for c, i in zip(a_cents.tolist(), a_int.tolist())]
    b_text = [_operand_text(c, i) for c, i in zip(b_cents.tolist(), b_int.tolist())]
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
