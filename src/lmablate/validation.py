"""How bad input is reported: the typed errors, and the checks that name key, value and what is
allowed (``params: train.lr=0 is not allowed; expected a number > 0``).

The CLI turns these errors into one line and exit status 2; every check runs before any work.
"""

from __future__ import annotations

import collections.abc
import math
import typing
from dataclasses import fields, is_dataclass
import re
from typing import Any, Mapping, NoReturn

MAX_SEED = 2**31 - 1  # every generator here (torch, numpy, random) takes it
# Variant and dataset names name DVC stages (tune@<dataset>-<variant>), folders and MLflow runs.
NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
NAME_RULE = ("a name of letters, digits and _ that does not start with a digit (it names DVC "
             "stages, folders and MLflow runs)")


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


def fail(key: str, value: Any, allowed: str) -> NoReturn:
    raise ConfigError(f"params: {key}={value!r} is not allowed; {allowed}")


def _real(value: Any) -> bool:
    """A finite int or float, not a bool (YAML's ``true`` is an int to Python)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _within(maximum: float | None) -> str:
    if maximum is None:
        return ""
    return f" and <= {maximum:,}" if isinstance(maximum, int) else f" and <= {maximum:g}"


def check_choice(key: str, value: Any, choices: tuple[str, ...]) -> None:
    if not isinstance(value, str) or value not in choices:
        fail(key, value, f"choose one of {', '.join(choices)}")


def check_bool(key: str, value: Any) -> None:
    """``value`` must be YAML's ``true`` or ``false``: a quoted ``"false"`` or ``"no"`` is a
    non-empty string, which Python would read as true."""
    if not isinstance(value, bool):
        fail(key, value, "expected true or false (unquoted)")


def check_str(key: str, value: Any) -> None:
    """``value`` must be a non-empty string."""
    if not isinstance(value, str) or not value:
        fail(key, value, "expected a non-empty string")


def check_positive(key: str, value: Any, *, allow_zero: bool = False,
                   maximum: float | None = None) -> None:
    """``value`` must be a finite number > 0 (>= 0 with ``allow_zero``), and at most
    ``maximum`` if given."""
    ok = _real(value) and (value >= 0 if allow_zero else value > 0)
    ok = ok and (maximum is None or value <= maximum)
    if not ok:
        fail(key, value, f"expected a finite number {'>= 0' if allow_zero else '> 0'}"
             f"{_within(maximum)}")


def check_interval(key: str, value: Any, low: float, high: float, *,
                   include_high: bool = False) -> None:
    """``value`` must be a number with ``low < value < high`` (``<= high`` with
    ``include_high``); else a :class:`ConfigError` naming ``key``, the value and the interval."""
    ok = _real(value) and low < value and (value <= high if include_high else value < high)
    if not ok:
        fail(key, value, f"expected a number in ({low:g}, {high:g}{']' if include_high else ')'}")


def check_fraction(key: str, value: Any) -> None:
    """``value`` must be a number in [0, 1)."""
    if not (_real(value) and 0.0 <= value < 1.0):
        fail(key, value, "expected a number in [0, 1)")


def check_int(key: str, value: Any, *, minimum: int = 1, maximum: int | None = None) -> None:
    """``value`` must be an integer (not a bool, not a float) in [``minimum``, ``maximum``]."""
    if (not isinstance(value, int) or isinstance(value, bool) or value < minimum
            or (maximum is not None and value > maximum)):
        fail(key, value, f"expected an integer >= {minimum}{_within(maximum)}")


def check_range(key: str, value: Any, maximum: float) -> None:
    """``value`` must be a list [low, high] of finite numbers with 0 < low < high <= maximum."""
    if (not isinstance(value, (list, tuple)) or len(value) != 2
            or not all(_real(v) for v in value) or not 0 < value[0] < value[1] <= maximum):
        fail(key, list(value) if isinstance(value, tuple) else value,
             f"expected [low, high] with 0 < low < high <= {maximum:g}")


def check_rungs(key: str, value: Any, max_trials: int) -> tuple[tuple[int, float], ...]:
    """Successive-halving rungs, lowest first: a non-empty list of [trials, share of the budget]
    pairs whose trials (whole numbers, 1..``max_trials``) do not grow and whose shares grow from
    above 0 to exactly 1.0 at the last rung. Returns them as a tuple of (int, float) pairs.

    Raises:
        ConfigError: anything else, naming ``key``, the value and the rule.
    """
    rule = ("expected a list of [trials, share of the budget] pairs, e.g. [[8, 0.125], [2, "
            f"1.0]]: trials whole numbers from 1 to {max_trials:,} that do not grow, shares "
            "that grow from above 0 to exactly 1.0 at the last rung")
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
            check_bool(key, value)
        elif hint is str:
            check_str(key, value)
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


def from_mapping(cls: type, data: Mapping[str, Any] | None, prefix: str) -> Any:
    """Build dataclass ``cls`` from ``data``, rejecting keys it does not declare and values not
    of their declared type (:func:`check_types`)."""
    if data is not None and not isinstance(data, Mapping):
        fail(prefix, data, "expected a mapping")
    data = dict(data or {})
    names = {f.name for f in fields(cls) if f.init}
    unknown = sorted(set(data) - names, key=str)
    if unknown:
        raise ConfigError(
            f"params: unknown key {prefix}.{unknown[0]}; allowed keys under {prefix}: "
            f"{', '.join(sorted(names))}"
        )
    check_types(cls, data, prefix)
    kwargs = {}
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
