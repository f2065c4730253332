"""The arithmetic task: one rule to write, read and score a problem, at any difficulty.

One problem per line, every field zero-padded to one width (:attr:`ArithmeticFormat.width`)::

    $(0000753.78+0000000910)=87.3661000$        seed 000's format (:data:`SEED_FORMAT`)
    $(007+091)=890$                             2-digit integer + and -
    $(00007+00091)=09800$                       the same, padded for 3- and 4-digit length splits

``$(`` + operand a + op + operand b + ``)=`` + the *reversed* answer + ``$``. The answer rule
exists once, vectorised (:func:`format_problems`); :func:`format_problem` is its one-problem
form, so generated data and hand-written problems can never disagree. :func:`split_problem`,
:func:`problem_op`, :func:`operand_digits` and :func:`answer_digits` read any format back; the
problem sets are drawn by :mod:`lmablate.data.problem_sets`. The format's settings, widths and
rounding: the handbook's Datasets and metrics, "arithmetic"."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence, Union

import numpy as np

from lmablate.core.validation import BOOLEAN, DataError, check_fields, fail, integer

__all__ = [
    "DataError", "ArithmeticFormat", "SEED_FORMAT", "Operand", "OPS", "OP_NAMES", "MAX_DIGITS",
    "format_problem", "format_problems", "split_problem", "problem_op", "operand_digits",
    "answer_digits", "check_length_digits",
]


OPS = ("+", "-", "*", "/")
OP_NAMES = {"+": "add", "-": "sub", "*": "mul", "/": "div"}  # per-operation metric names
# Operands of up to 7 digits keep every answer exact in int64: the largest intermediate is a
# product of two decimal operands in hundredths, (1e7 x 100)^2 = 1e18 < 9.2e18.
MAX_DIGITS = 7


@dataclass(frozen=True)
class ArithmeticFormat:
    """The difficulty and line format of an arithmetic dataset.

    Args:
        digits: the most digits an operand's integer part has, 1..:data:`MAX_DIGITS`.
        max_operand: the largest operand (None: ``10**digits - 1``); at least
            ``10**(digits - 1)`` and at most ``10**digits`` (seed 000's 1000 at 3 digits).
        decimals: half of the operands have exactly two decimals (seed 000).
        operations: a non-empty subset of :data:`OPS`, in :data:`OPS` order once validated.
        min_width: the narrowest a field may be (0: as wide as the format needs): a format
            padded to its length splits' width (:meth:`padded_for`).

    Derived: ``width`` (characters of every zero-padded field: the longest operand or answer
    any problem can have, or ``min_width`` when that is wider), ``prompt_length`` (``$(`` a op b
    ``)=``), ``line_length`` (the prompt, the answer and the closing ``$``). Every line of a format
    has ``line_length`` characters.

    Raises:
        ConfigError: a setting outside what is allowed (names the key as ``<where>.<key>``).
    """

    digits: int = field(default=2, metadata={"rule": integer(minimum=1, maximum=MAX_DIGITS)})
    max_operand: int | None = None  # its range depends on digits: checked in __post_init__
    decimals: bool = field(default=False, metadata={"rule": BOOLEAN})
    operations: tuple[str, ...] = ("+", "-")
    where: str = field(default="arithmetic", compare=False, repr=False)
    min_width: int = field(default=0, metadata={"rule": integer(minimum=0, maximum=64)})
    width: int = field(init=False)
    prompt_length: int = field(init=False)
    line_length: int = field(init=False)

    def __post_init__(self) -> None:
        p = self.where
        check_fields(self, p)  # digits, decimals, min_width: each by its own rule
        if self.max_operand is None:
            object.__setattr__(self, "max_operand", 10 ** self.digits - 1)
        integer(minimum=10 ** (self.digits - 1), maximum=10 ** self.digits).check(
            f"{p}.max_operand", self.max_operand)
        ops = self.operations
        if isinstance(ops, str) or not isinstance(ops, Sequence) or not ops:
            fail(f"{p}.operations", list(ops) if isinstance(ops, tuple) else ops,
                 f"a non-empty list of {', '.join(map(repr, OPS))}")
        bad = [op for op in ops if op not in OPS]
        if bad or len(set(ops)) != len(ops):
            fail(f"{p}.operations", list(ops),
                 f"each of {', '.join(map(repr, OPS))} at most once")
        object.__setattr__(self, "operations", tuple(op for op in OPS if op in ops))
        width = max(_widest(self), self.min_width)
        object.__setattr__(self, "width", width)
        object.__setattr__(self, "prompt_length", len("$(") + 2 * width + 1 + len(")="))
        object.__setattr__(self, "line_length", self.prompt_length + width + len("$"))

    @property
    def max_cents(self) -> int:
        """The largest operand in hundredths (decimal operands are 1..max_cents)."""
        return 100 * self.max_operand

    def n_problems(self, low: int = 1) -> int:
        """How many distinct problems the format can draw with operands from ``low`` (1, or 10^(n-1)
        for the length split of n digits, :func:`~lmablate.data.problem_sets.length_problems`) up:
        (operand values)^2 x operations, an operand's values being its integers and, with decimals,
        its two-decimal numbers (written differently from the integers)."""
        integers = self.max_operand - low + 1
        values = integers + (self.max_cents - (1 if low == 1 else 100 * low) + 1
                             if self.decimals else 0)
        return values ** 2 * len(self.operations)

    def at_digits(self, n: int) -> "ArithmeticFormat":
        """The same settings for operands of up to ``n`` digits (``max_operand`` 10^n - 1) and
        the same ``min_width``: the format of the length-generalisation problems of ``n``
        digits."""
        return ArithmeticFormat(n, None, self.decimals, self.operations, self.where,
                                self.min_width)

    def padded_for(self, lengths: Sequence[int]) -> "ArithmeticFormat":
        """This format with its fields as wide as those of its length-generalisation
        problems of each of ``lengths`` digits (:meth:`at_digits`), so that a length split
        differs from the training problems in operand length alone, not in where a digit
        sits; itself when ``lengths`` is empty."""
        if not lengths:
            return self
        widest = max(self.at_digits(n).width for n in lengths)
        return ArithmeticFormat(self.digits, self.max_operand, self.decimals, self.operations,
                                self.where, max(self.min_width, widest))


def check_length_digits(fmt: ArithmeticFormat, values: object, key: str) -> tuple[int, ...]:
    """The operand digits of a length-generalisation split, sorted: distinct integers, each
    longer than every operand of ``fmt`` (so the split is disjoint from it) and at most
    :data:`MAX_DIGITS`; an empty list means no split.

    Raises:
        ConfigError: names ``key``, the value and what is allowed."""
    shortest = len(str(fmt.max_operand)) + 1
    if isinstance(values, str) or not isinstance(values, Sequence):
        fail(key, values, f"a list of operand digits in {shortest}..{MAX_DIGITS}, e.g. "
             f"[{shortest}, {min(shortest + 1, MAX_DIGITS)}], or []")
    length = integer(minimum=shortest, maximum=MAX_DIGITS)
    for n in values:
        length.check(key, n)
    if len(set(values)) != len(values):
        fail(key, list(values), "each length at most once")
    return tuple(sorted(values))


def _widest(fmt: ArithmeticFormat) -> int:
    """The width of :class:`ArithmeticFormat`: the longest text of an operand or an answer.

    An answer's length grows with its magnitude (and a ``-``), so the longest answers are at
    the corners of the operand ranges: the smallest and largest integer and decimal operand,
    every pairing, every operation. They are computed by the answer rule itself."""
    kinds = [(True, 100), (True, fmt.max_cents)]
    if fmt.decimals:
        kinds += [(False, 1), (False, fmt.max_cents)]
    pairs = [(a, b) for a in kinds for b in kinds]
    longest = max(len(t) for t in _texts(np.array([c for _, c in kinds]),
                                         np.array([i for i, _ in kinds])))
    for op in fmt.operations:
        a_int, a_cents = (np.array(x) for x in zip(*(a for a, _ in pairs)))
        b_int, b_cents = (np.array(x) for x in zip(*(b for _, b in pairs)))
        hundredths = _answer_hundredths(op, a_cents.astype(np.int64), b_cents.astype(np.int64))
        as_integer = a_int & b_int & (op != "/")
        longest = max(longest, max(len(t) for t in _texts(hundredths, as_integer)))
    return longest



@dataclass(frozen=True)
class Operand:
    """One positive operand: an integer, or a number with exactly two decimals.

    ``cents`` is the value in hundredths (``910`` -> 91000, ``2.08`` -> 208); ``is_integer``
    says how it is written (``910`` vs ``910.00``). Build with :meth:`integer`, :meth:`decimal`,
    :meth:`parse` or :meth:`coerce`; a format's range is checked where a problem is formatted
    (:func:`format_problems`).

    Raises:
        DataError: not positive, or an integer whose cents are not a multiple of 100.
    """

    cents: int
    is_integer: bool

    def __post_init__(self) -> None:
        if self.cents < 1 or (self.is_integer and self.cents % 100):
            raise DataError(f"operand {self.cents / 100:g} is not allowed; expected a positive "
                            "integer or a positive number with two decimals")

    @classmethod
    def integer(cls, n: int) -> "Operand":
        """An integer operand ``n`` >= 1, written without decimals."""
        return cls(int(n) * 100, True)

    @classmethod
    def decimal(cls, cents: int) -> "Operand":
        """A two-decimal operand of ``cents`` hundredths (>= 1), written ``f"{x:.2f}"``."""
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


def _texts(hundredths: np.ndarray, as_integer: np.ndarray) -> list[str]:
    """Exact numbers of hundredths (int64) written as integers (where ``as_integer``; they
    must be multiples of 100) or with two decimals: ``91000`` -> ``"910"``, ``-13414`` ->
    ``"-134.14"``, ``0`` -> ``"0.00"`` (never ``"-0.00"``).

    The two-decimal form is ``f"{h / 100:.2f}"``, exact for ``|h| < 1e12``: the float is
    within 1e-4 of ``h / 100``, well inside the 0.005 that ``.2f`` rounds away, and ``0 / 100``
    is ``+0.0``. Larger values (7-digit products) are written from ``divmod(h, 100)``.
    """
    hundredths = np.asarray(hundredths, dtype=np.int64)
    whole, scaled = (hundredths // 100).tolist(), (hundredths / 100).tolist()
    exact = hundredths.tolist()
    return [str(w) if i else f"{x:.2f}" if abs(h) < 10 ** 12
            else f"{'-' * (h < 0)}{abs(h) // 100}.{abs(h) % 100:02d}"
            for i, w, x, h in zip(np.asarray(as_integer, dtype=bool).tolist(), whole, scaled,
                                  exact)]


def _divide_half_up(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """``num / den`` rounded to the nearest integer, ties up; elementwise, ``num >= 0``,
    ``den > 0`` (int64, exact)."""
    quotient, remainder = np.divmod(num, den)
    return quotient + (2 * remainder >= den)


def _answer_hundredths(op: str, a_cents: np.ndarray, b_cents: np.ndarray) -> np.ndarray:
    """``a op b`` in hundredths, exact, rounded half up where the exact result has more than
    two decimals; elementwise on int64 arrays of positive operands in hundredths.

    ``+ -``: exact. ``*``: the exact product has four decimals (``a_cents * b_cents`` ten-
    thousandths, below 1e18 for :data:`MAX_DIGITS`, so int64 is exact), rounded to hundredths.
    ``/``: the exact rational quotient (``100 * a_cents / b_cents`` hundredths) rounded to the
    nearest hundredth; a non-terminating quotient is never a tie.
    """
    if op == "+":
        return a_cents + b_cents
    if op == "-":
        return a_cents - b_cents
    if op == "*":
        return _divide_half_up(a_cents * b_cents, np.int64(100))
    return _divide_half_up(100 * a_cents, b_cents)


# seed 000's format: operands in (0, 1000], half with two decimals, + - * /; width 10
SEED_FORMAT = ArithmeticFormat(digits=3, max_operand=1000, decimals=True, operations=OPS)


def format_problems(op_idx: np.ndarray, a_int: np.ndarray, a_cents: np.ndarray,
                    b_int: np.ndarray, b_cents: np.ndarray,
                    fmt: ArithmeticFormat = SEED_FORMAT) -> list[str]:
    """Problem lines (no ``\n``) of format ``fmt`` for arrays of operator indices into
    :data:`OPS`, and of the operands as (is_integer bool, value in cents int64, i.e.
    hundredths: ``910`` -> 91000, ``2.08`` -> 208).

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
    1.16279...) is never a tie and rounds to the nearest (``1.16``). Each field is then
    left-padded with ``0`` to ``fmt.width`` and the answer reversed.

    Raises:
        DataError: an operation ``fmt`` does not have, or an operand outside its range
            (integers 1..max_operand, decimals 0.01..max_operand.00, a decimal where the
            format has none).
    """
    op_idx = np.asarray(op_idx, dtype=np.int64)
    a_int, b_int = np.asarray(a_int, dtype=bool), np.asarray(b_int, dtype=bool)
    a_cents, b_cents = np.asarray(a_cents, dtype=np.int64), np.asarray(b_cents, dtype=np.int64)
    allowed = [OPS.index(op) for op in fmt.operations]
    if not np.isin(op_idx, allowed).all():
        raise DataError(f"an operator outside {' '.join(fmt.operations)} is not allowed in "
                        "this format")
    for is_int, cents in ((a_int, a_cents), (b_int, b_cents)):
        if np.any((cents < 1) | (cents > fmt.max_cents) | (is_int & (cents % 100 != 0))
                  | (~is_int & (not fmt.decimals))):
            kinds = " or decimals 0.01.." + f"{fmt.max_operand}.00" if fmt.decimals else ""
            raise DataError(f"operand out of range is not allowed; expected integers "
                            f"1..{fmt.max_operand}{kinds}")
    hundredths = np.zeros(len(op_idx), dtype=np.int64)
    for k, op in enumerate(OPS):
        sel = op_idx == k
        hundredths[sel] = _answer_hundredths(op, a_cents[sel], b_cents[sel])
    as_integer = a_int & b_int & (op_idx != OPS.index("/"))  # hundredths a multiple of 100
    answers = _texts(hundredths, as_integer)
    a_text, b_text = _texts(a_cents, a_int), _texts(b_cents, b_int)
    ops = [OPS[k] for k in op_idx.tolist()]
    w = fmt.width
    return [f"$({a.rjust(w, '0')}{op}{b.rjust(w, '0')})={c.rjust(w, '0')[::-1]}$"
            for a, op, b, c in zip(a_text, ops, b_text, answers)]


def format_problem(a: Union[Operand, str, int, float], op: str,
                   b: Union[Operand, str, int, float],
                   fmt: ArithmeticFormat = SEED_FORMAT) -> str:
    """The problem line for ``a op b`` in format ``fmt`` (no trailing newline), by the rule
    of :func:`format_problems`.

    ``a`` and ``b`` are :class:`Operand` values or anything :meth:`Operand.coerce` accepts:
    ``format_problem("753.78", "+", 910)`` -> ``"$(0000753.78+0000000910)=87.3661000$"``.

    Raises:
        DataError: an operand out of the format's range or badly written, or ``op`` not one
            of the format's operations.
    """
    if op not in fmt.operations:
        raise DataError(f"operator {op!r} is not allowed; choose one of "
                        f"{' '.join(fmt.operations)}")
    a, b = Operand.coerce(a), Operand.coerce(b)
    return format_problems([OPS.index(op)], [a.is_integer], [a.cents],
                           [b.is_integer], [b.cents], fmt)[0]


def _parts(line: str) -> tuple[str, str, str, str]:
    """``(a, op, b, reversed answer)`` as written (padded) in a problem line of any format.

    Raises:
        DataError: ``line`` is not ``$(`` digits op digits ``)=`` answer ``$``.
    """
    head, eq, tail = line.partition(")=")
    body = head[2:]
    k = next((i for i, ch in enumerate(body) if ch in OPS), -1)
    ok = (line.startswith("$(") and eq and tail.endswith("$") and len(tail) > 1 and k > 0
          and k < len(body) - 1)
    a, b = body[:k], body[k + 1:]
    if not ok or not all(c.isdigit() or c == "." for c in a + b):
        raise DataError(f"arithmetic problem {line!r} is not allowed; expected "
                        "'$(' a op b ')=' reversed answer '$', like '$(007+091)=890$'")
    return a, body[k], b, tail[:-1]


def split_problem(line: str) -> tuple[str, str]:
    """``$(a op b)=answer$`` -> (the prompt, up to and including ``=``; the target, the
    reversed answer with its closing ``$``).

    Raises:
        DataError: ``line`` is not in the problem format (see :func:`_parts`).
    """
    _parts(line)
    cut = line.index(")=") + 2
    return line[:cut], line[cut:]


def problem_op(line: str) -> str:
    """The operator (one of :data:`OPS`) of a problem line.

    Raises:
        DataError: ``line`` is not in the problem format."""
    return _parts(line)[1]


def _integer_digits(text: str) -> int:
    """Digits of a written number's integer part without padding: ``000-134.14`` -> 3,
    ``0.50`` -> 1, ``0`` -> 1."""
    whole = text.partition(".")[0].replace("-", "").lstrip("0")
    return max(len(whole), 1)


def operand_digits(line: str) -> int:
    """The digits of the longer operand's integer part (``$(0753+0091)=...`` -> 3): a
    problem's operand length.

    Raises:
        DataError: ``line`` is not in the problem format."""
    a, _, b, _ = _parts(line)
    return max(_integer_digits(a), _integer_digits(b))


def answer_digits(line: str) -> int:
    """The digits of the answer's integer part, sign and padding left out (``-98`` -> 2,
    ``198`` -> 3, ``0.50`` -> 1): a problem's answer length.

    Raises:
        DataError: ``line`` is not in the problem format."""
    return _integer_digits(_parts(line)[3][::-1])
