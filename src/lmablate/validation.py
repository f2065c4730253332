"""How bad input is reported: the typed errors, and the checks that name key, value and what is
allowed (``params: train.lr=0 is not allowed; expected a number > 0``).

The CLI turns these errors into one line and exit status 2; every check runs before any work.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Mapping


class ConfigError(ValueError):
    """A value in ``params.yaml`` (or an override) is missing, unknown or out of range.

    The message names the dotted key, the offending value and what is allowed.
    """


class DataError(ValueError):
    """Bad dataset input or an unusable source (a malformed arithmetic problem, a corpus that is
    missing, empty or not UTF-8, a failed download); the message names the key, file or URL."""


def fail(key: str, value: Any, allowed: str) -> None:
    raise ConfigError(f"params: {key}={value!r} is not allowed; {allowed}")


def check_choice(key: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        fail(key, value, f"choose one of {', '.join(choices)}")


def check_positive(key: str, value: Any, *, allow_zero: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = ok and (value >= 0 if allow_zero else value > 0)
    if not ok:
        fail(key, value, "expected a number >= 0" if allow_zero else "expected a number > 0")


def check_interval(key: str, value: Any, low: float, high: float, *,
                   include_high: bool = False) -> None:
    """``value`` must be a number with ``low < value < high`` (``<= high`` with
    ``include_high``); else a :class:`ConfigError` naming ``key``, the value and the interval."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = ok and low < value and (value <= high if include_high else value < high)
    if not ok:
        fail(key, value, f"expected a number in ({low:g}, {high:g}{']' if include_high else ')'}")


def check_int(key: str, value: Any, *, minimum: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        fail(key, value, f"expected an integer >= {minimum}")


def from_mapping(cls: type, data: Mapping[str, Any] | None, prefix: str) -> Any:
    """Build dataclass ``cls`` from ``data``, rejecting keys it does not declare."""
    if data is not None and not isinstance(data, Mapping):
        fail(prefix, data, "expected a mapping")
    data = dict(data or {})
    names = {f.name for f in fields(cls) if f.init}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(
            f"params: unknown key {prefix}.{unknown[0]}; allowed keys under {prefix}: "
            f"{', '.join(sorted(names))}"
        )
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
