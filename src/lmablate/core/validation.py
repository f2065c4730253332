"""How bad input is reported: the typed errors, and the checks that name key, value and what is
allowed (``params: train.lr=0 is not allowed; expected a number > 0``).

The CLI turns these errors into one line and exit status 2; every check runs before any work.
"""

from __future__ import annotations

import collections.abc
import math
import reprlib
import re
import typing
from dataclasses import MISSING, Field, dataclass, field, fields, is_dataclass
from typing import Any, Callable, Mapping, NoReturn

from lmablate.core.fingerprint import NOT_A_RESULT
# a user's own component's name (re-exported: the config's rule below names it)
from lmablate.core.component_files import COMPONENT_TEXT, is_component

MAX_SEED = 2**31 - 1  # every generator here (torch, numpy, random) takes it
# Variant and dataset names name DVC stages (tune@<dataset>-<variant>), folders and MLflow runs.
# At most 64 characters: a folder name may have 255 bytes, and MLflow's run names and DVC's
# stage names join a dataset's and a variant's with more.
NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
NAME_RULE = ("a name of 1 to 64 letters, digits and _ that does not start with a digit (it names "
             "DVC stages, folders and MLflow runs)")


class ConfigError(ValueError):
    """A value in ``params.yaml`` (or an override) is missing, unknown or out of range.

    The message names the dotted key, the offending value and what is allowed.
    """


class DataError(ValueError):
    """Bad dataset input or an unusable source (a malformed arithmetic problem, a corpus that is
    missing, empty or not UTF-8, a failed download); the message names the key, file or URL."""


class OutputError(ValueError):
    """An output path cannot be written (a read-only folder, a file where a folder must be);
    checked before any work. The message names the path and the reason."""


# a value as an error shows it: Python's repr, with long lists, mappings and strings cut short
# (a 300-budget list must not become a 4,000-character line)
class _ShortRepr(reprlib.Repr):
    def repr_dict(self, x: dict, level: int) -> str:  # reprlib sorts the keys; keep their order
        if not x:
            return "{}"
        if level <= 0:
            return "{...}"
        items = [f"{self.repr1(k, level - 1)}: {self.repr1(v, level - 1)}"
                 for k, v in list(x.items())[:self.maxdict]]
        return "{" + ", ".join(items) + (", ...}" if len(x) > self.maxdict else "}")


_SHORT = _ShortRepr()  # keyword arguments only from Python 3.12
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxtuple, _SHORT.maxdict, _SHORT.maxset = 4, 8, 8, 8, 8
_SHORT.maxstring = _SHORT.maxother = 80


def short_repr(value: Any) -> str:
    """``value`` as a message shows it: ``repr`` shortened (``reprlib``) past 8 items or 80
    characters, and cut at 200 in all."""
    shown = _SHORT.repr(value)
    if len(shown) > 200:  # nested lists (a YAML alias bomb) are long even when each is cut
        shown = shown[:200] + "..."
    return shown


MAX_ERROR_LINE = 300  # characters of an error line; a longer one is cut in its middle


def error_line(exc: BaseException) -> str:
    """The one line ``lmablate`` prints for ``exc``: ``lmablate: error: <message>`` on one
    line, at most :data:`MAX_ERROR_LINE` characters (a longer message keeps its start, which
    names the key or file, and its end, which says what to do)."""
    line = "lmablate: error: " + " ".join(str(exc).split())
    if len(line) <= MAX_ERROR_LINE:
        return line
    cut = " [...] "
    head = (MAX_ERROR_LINE - len(cut)) * 2 // 3
    return line[:head] + cut + line[-(MAX_ERROR_LINE - len(cut) - head):]


def fail(key: str, value: Any, allowed: str) -> NoReturn:
    """Raise the :class:`ConfigError` ``params: <key>=<value> is not allowed; <allowed>``, the
    value shown by :func:`short_repr`, cut further where the line
    (:func:`error_line`) would pass :data:`MAX_ERROR_LINE` characters: the key and what is
    allowed are always shown whole."""
    shown = short_repr(value)
    rest = f"params: {key}= is not allowed; {allowed}"
    room = MAX_ERROR_LINE - len("lmablate: error: ") - len(rest)
    if len(shown) > room:
        shown = shown[:max(room - 3, 0)] + "..."
    raise ConfigError(f"params: {key}={shown} is not allowed; {allowed}")


def _real(value: Any) -> bool:
    """A finite int or float, not a bool (YAML's ``true`` is an int to Python)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _within(maximum: float | None) -> str:
    if maximum is None:
        return ""
    return f" and <= {maximum:,}" if isinstance(maximum, int) else f" and <= {maximum:g}"


def _integer_text(minimum: int, maximum: int | None) -> str:
    return f"an integer >= {minimum}{_within(maximum)}"


def _number_text(allow_zero: bool, maximum: float | None) -> str:
    return f"a finite number {'>= 0' if allow_zero else '> 0'}{_within(maximum)}"


def _range_text(maximum: float) -> str:
    return f"[low, high] with 0 < low < high <= {maximum:g}"


FRACTION_TEXT = "a number in [0, 1)"


def _check_choice(key: str, value: Any, choices: tuple[str, ...]) -> None:
    if not isinstance(value, str) or value not in choices:
        fail(key, value, f"choose one of {', '.join(choices)}")


def _check_bool(key: str, value: Any) -> None:
    """``value`` must be YAML's ``true`` or ``false``: a quoted ``"false"`` or ``"no"`` is a
    non-empty string, which Python would read as true."""
    if not isinstance(value, bool):
        fail(key, value, "expected true or false (unquoted)")


def _check_str(key: str, value: Any) -> None:
    """``value`` must be a non-empty string."""
    if not isinstance(value, str) or not value:
        fail(key, value, "expected a non-empty string")


def _check_positive(key: str, value: Any, *, allow_zero: bool = False,
                   maximum: float | None = None) -> None:
    """``value`` must be a finite number > 0 (>= 0 with ``allow_zero``), and at most
    ``maximum`` if given."""
    ok = _real(value) and (value >= 0 if allow_zero else value > 0)
    ok = ok and (maximum is None or value <= maximum)
    if not ok:
        fail(key, value, f"expected {_number_text(allow_zero, maximum)}")


def _check_fraction(key: str, value: Any) -> None:
    """``value`` must be a number in [0, 1)."""
    if not (_real(value) and 0.0 <= value < 1.0):
        fail(key, value, f"expected {FRACTION_TEXT}")


def _check_int(key: str, value: Any, *, minimum: int = 1, maximum: int | None = None) -> None:
    """``value`` must be an integer (not a bool, not a float) in [``minimum``, ``maximum``]."""
    if (not isinstance(value, int) or isinstance(value, bool) or value < minimum
            or (maximum is not None and value > maximum)):
        fail(key, value, f"expected {_integer_text(minimum, maximum)}")


def _check_range(key: str, value: Any, maximum: float) -> None:
    """``value`` must be a list [low, high] of finite numbers with 0 < low < high <= maximum."""
    if (not isinstance(value, (list, tuple)) or len(value) != 2
            or not all(_real(v) for v in value) or not 0 < value[0] < value[1] <= maximum):
        fail(key, list(value) if isinstance(value, tuple) else value,
             f"expected {_range_text(maximum)}")


def _rungs_text(max_trials: int) -> str:
    return ("a list of [trials, share of the budget] pairs, e.g. [[8, 0.125], [2, 1.0]]: "
            f"trials whole numbers from 1 to {max_trials:,} that do not grow, shares that grow "
            "from above 0 to exactly 1.0 at the last rung")


def _check_rungs(key: str, value: Any, max_trials: int) -> tuple[tuple[int, float], ...]:
    """Successive-halving rungs, lowest first: a non-empty list of [trials, share of the budget]
    pairs whose trials (whole numbers, 1..``max_trials``) do not grow and whose shares grow from
    above 0 to exactly 1.0 at the last rung. Returns them as a tuple of (int, float) pairs.

    Raises:
        ConfigError: anything else, naming ``key``, the value and the rule.
    """
    rule = f"expected {_rungs_text(max_trials)}"
    if not isinstance(value, (list, tuple)) or not value or not all(
            isinstance(r, (list, tuple)) and len(r) == 2 for r in value):
        fail(key, value, rule)
    trials, shares = [r[0] for r in value], [r[1] for r in value]
    if (not all(isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= max_trials
                for n in trials)
            or not all(_real(f) and 0 < f <= 1 for f in shares)
            or any(b > a for a, b in zip(trials, trials[1:]))
            or any(b <= a for a, b in zip(shares, shares[1:])) or shares[-1] != 1):
        fail(key, [list(r) for r in value], rule)
    return tuple((n, float(f)) for n, f in value)


def check_types(cls: type, data: Mapping[str, Any], prefix: str) -> None:
    """Check each value of ``data`` against the type its field of dataclass ``cls`` declares,
    without coercion: a ``bool`` field takes only ``true``/``false``, a ``str`` field only a
    string, an ``int`` field only an integer, a ``float`` field only a finite number, a
    ``tuple[...]`` field only a list, a mapping or dataclass field only a mapping; ``None`` only
    where the type allows it. Ranges are checked by the dataclass itself.

    Raises:
        ConfigError: naming ``prefix.key``, the value and the type expected.
    """
    hints = typing.get_type_hints(cls)
    for name, value in data.items():
        hint = hints.get(name)
        if hint is None:
            continue
        args = typing.get_args(hint)
        optional = type(None) in args
        if optional:
            if value is None:
                continue
            hint = next(a for a in args if a is not type(None))
        key = f"{prefix}.{name}"
        origin = typing.get_origin(hint) or hint
        if hint is bool:
            _check_bool(key, value)
        elif hint is str:
            _check_str(key, value)
        elif hint is int:
            if not isinstance(value, int) or isinstance(value, bool):
                fail(key, value, "expected an integer" + (" or null" if optional else ""))
        elif hint is float:
            if not _real(value):
                fail(key, value, "expected a finite number" + (" or null" if optional else ""))
        elif origin is tuple:
            if not isinstance(value, (list, tuple)):
                fail(key, value, "expected a list, e.g. [1, 2]")
        elif origin in (dict, collections.abc.Mapping) or is_dataclass(origin):
            if not isinstance(value, Mapping):
                fail(key, value, "expected a mapping")


def from_mapping(cls: type, data: Mapping[str, Any] | None, prefix: str, **fixed: Any) -> Any:
    """Build dataclass ``cls`` from ``data`` (and the ``fixed`` fields, e.g. a dataset's name),
    rejecting keys that are not among its :func:`param` fields, values not of their declared
    type (:func:`check_types`) and a missing key that has no default."""
    if data is not None and not isinstance(data, Mapping):
        fail(prefix, data, "expected a mapping")
    data = dict(data or {})
    names = {f.name for f in fields(cls) if is_param(f)}
    unknown = sorted(set(data) - names, key=str)
    if unknown:
        raise ConfigError(
            f"params: unknown key {prefix}.{unknown[0]}; allowed keys under {prefix}: "
            f"{', '.join(sorted(names))}"
        )
    check_types(cls, data, prefix)
    for f in fields(cls):
        if (is_param(f) and f.name not in data and f.default is MISSING
                and f.default_factory is MISSING):
            rule = f.metadata.get("rule")
            raise ConfigError(f"params: missing key {prefix}.{f.name}; it has no default"
                              + (f", expected {rule.allowed}" if rule else ""))
    kwargs = dict(fixed)
    for f in fields(cls):
        if f.name not in data:
            continue
        value = data[f.name]
        if isinstance(value, list):
            value = tuple(value)
        kwargs[f.name] = value
    try:
        return cls(**kwargs)
    except TypeError as exc:  # e.g. a missing required key
        raise ConfigError(f"params: {prefix}: {exc}") from None


# ------------------------------------------------------------------ declarative field rules


@dataclass(frozen=True)
class Rule:
    """What one key of ``params.yaml`` allows, declared once next to its field (:func:`param`):
    ``allowed`` is the text the reference (``docs/params_reference.py``) shows, and ``check``
    (``check(key, value)``) raises a :class:`ConfigError` naming the key, the value and the same
    rule, returning the value to keep (``None``: the value as given). A rule with no ``check``
    is enforced by another validator from the same constants (an arithmetic dataset's format
    keys, by :class:`~lmablate.data.arithmetic.ArithmeticFormat`)."""

    allowed: str
    check: Callable[[str, Any], Any] | None = None


def integer(minimum: int = 1, maximum: int | None = None) -> Rule:
    return Rule(_integer_text(minimum, maximum),
                lambda key, value: _check_int(key, value, minimum=minimum, maximum=maximum))


def number(maximum: float | None = None, *, allow_zero: bool = False) -> Rule:
    """A finite number > 0 (>= 0 with ``allow_zero``), at most ``maximum``; kept as a float, so
    that ``30000000000`` and ``3.0e+10`` are one value and one fingerprint."""
    def check(key: str, value: Any) -> float:
        _check_positive(key, value, allow_zero=allow_zero, maximum=maximum)
        return float(value)
    return Rule(_number_text(allow_zero, maximum), check)


def choice(choices: tuple[str, ...]) -> Rule:
    return Rule(f"one of {', '.join(choices)}",
                lambda key, value: _check_choice(key, value, choices))


def choice_or_component(choices: tuple[str, ...]) -> Rule:
    """One of ``choices``, or a component's name (:data:`COMPONENT_NAME`)."""
    def check(key: str, value: Any) -> None:
        if not (value in choices or is_component(value)):
            fail(key, value, f"choose one of {', '.join(choices)}, or {COMPONENT_TEXT}")
    return Rule(f"one of {', '.join(choices)}, or {COMPONENT_TEXT}", check)


def low_high(maximum: float) -> Rule:
    """[low, high] with 0 < low < high <= ``maximum``, kept as floats (see :func:`number`)."""
    def check(key: str, value: Any) -> tuple[float, float]:
        _check_range(key, value, maximum)
        return (float(value[0]), float(value[1]))
    return Rule(_range_text(maximum), check)


def rungs(max_trials: int) -> Rule:
    return Rule(_rungs_text(max_trials), lambda key, value: _check_rungs(key, value, max_trials))


def optional(rule: Rule) -> Rule:
    """``rule``, or null."""
    check = rule.check
    return Rule(f"null, or {rule.allowed}",
                None if check is None else lambda key, value: None if value is None
                else check(key, value))


BOOLEAN = Rule("true or false", _check_bool)
STRING = Rule("a non-empty string", _check_str)
def _fraction(key: str, value: Any) -> float:
    _check_fraction(key, value)
    return float(value)  # kept as a float, as number() keeps its values


FRACTION = Rule(FRACTION_TEXT, _fraction)


def param(default: Any = MISSING, doc: str = "", rule: Rule | None = None, *,
          result: bool = True, **metadata: Any) -> Any:
    """A dataclass field for a key of ``params.yaml``: its default, a one-line ``doc`` of what it
    changes, the :class:`Rule` that validates it (:func:`check_fields`) and, with ``result=False``,
    the :data:`~lmablate.core.fingerprint.NOT_A_RESULT` mark. A mutable default (a dict or list) is
    copied per instance."""
    meta = {"doc": doc, "rule": rule, **metadata, **({} if result else NOT_A_RESULT)}
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def is_param(f: Field) -> bool:
    """Whether field ``f`` is a key of ``params.yaml`` (not a derived or fixed field)."""
    return f.init and "doc" in f.metadata


def check_fields(obj: Any, prefix: str, skip: Callable[[Field], bool] = lambda f: False) -> None:
    """Check each field of dataclass ``obj`` by its :class:`Rule`, in field order, storing the
    value a rule returns (e.g. a list made a tuple). ``skip`` leaves fields out (another kind's).

    Raises:
        ConfigError: the first value its rule does not allow (names ``prefix.key``).
    """
    for f in fields(obj):
        rule = f.metadata.get("rule")
        if rule is None or rule.check is None or skip(f):
            continue
        value = rule.check(f"{prefix}.{f.name}", getattr(obj, f.name))
        if value is not None:
            object.__setattr__(obj, f.name, value)
