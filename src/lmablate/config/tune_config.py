"""The ``tune`` section of ``params.yaml``: how each dataset x variant's learning rate and width
are searched (:class:`TuneConfig`). :mod:`lmablate.config.study` re-exports it with the other
sections.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from lmablate.core.validation import (MAX_SEED, STRING, Rule, check_fields, fail, integer,
                                      low_high, number, param, rungs, choice)
from lmablate.config.train_config import MAX_COUNT

MAX_WIDTH = 8192  # d_model, ffn_hidden
MAX_TRIALS = 10_000  # tune.n_trials, trials_per_batch
# the largest learning rate a study may tune or extend to (tune.lr_limits)
MAX_LR = 1e8  # a guard against typos only
# tune.arithmetic_objective: the answer loss at a trial's last evaluation, or its mean over them
OBJECTIVE_SUMMARIES = ("final", "mean")


def distinct_ints(key: str, value: Any, maximum: int, empty: str,
                  repeated: str) -> tuple[int, ...]:
    """``value`` as a sorted tuple: a non-empty list of distinct whole numbers, 1..``maximum``.

    Raises:
        ConfigError: anything else, naming ``key``, with ``empty`` or ``repeated`` as the rule.
    """
    if not isinstance(value, (list, tuple)) or not value:
        fail(key, list(value) if isinstance(value, tuple) else value, empty)
    element = integer(maximum=maximum)
    for v in value:
        element.check(key, v)
    if len(set(value)) != len(value):
        fail(key, list(value), repeated)
    return tuple(sorted(value))


def _check_widths(key: str, value: Any) -> tuple[int, ...] | None:
    return None if value is None else distinct_ints(
        key, value, MAX_WIDTH, "expected a non-empty list, or null to derive the widths from the "
        "budget", "widths must be distinct")


def _check_factor(key: str, value: Any) -> float:
    if not 1 < value <= 4:
        fail(key, value, "expected a number above 1 and at most 4 (neighbouring learning rates "
             "within a factor of 4)")
    return float(value)


@dataclass(frozen=True)
class TuneConfig:
    """Optuna search per dataset x variant over the learning rate and ``d_model``, by successive
    halving (Jamieson & Talwalkar 2016; Li et al. 2018) at equal compute; the protocol is
    :mod:`lmablate.tune.tuning`'s.

    ``rungs``: [trials, share of the budget] from the lowest rung up; the best trials of a rung,
    as many as the next has, train again from scratch on its share, up to the last rung at the
    full budget (1.0), whose best is the answer. Trials train on seed ``seed`` (not a final
    seed), report their validation loss ``reports`` times (an arithmetic trial its answer loss,
    whose last value is its result, or with ``arithmetic_objective: mean`` its mean over the
    reports), and the first rung's train at least
    ``min_steps`` steps. The first rung is proposed ``trials_per_batch`` at a time: first the
    same learning-rate sweep for every variant (shifted by ``sampler_seed``), then TPE
    (Bergstra et al. 2011) with each study's own seed.

    Search space: the learning rate log-uniform in [``lr_low``, ``lr_high``]; the widths
    ``d_model_choices``, or when null ``n_widths`` widths with ``tokens_per_parameter`` training
    tokens per non-embedding parameter at the budget (Hoffmann et al. 2022: about 20 is
    compute-optimal). An edge extends the search: the learning rate by 10x within
    ``lr_limits``, a derived width by a step within ``tokens_per_parameter_limits``.

    ``storage`` is an Optuna storage URL (``sqlite:///optuna.db``, ``postgresql://...``); the
    environment variable ``LMABLATE_OPTUNA_STORAGE`` overrides it.
    """

    rungs: tuple[tuple[int, float], ...] = param(
        ((8, 0.125), (3, 1.0)), "successive halving: [trials, share of the budget] per rung, "
        "lowest first", rungs(MAX_TRIALS))
    trials_per_batch: int = param(4, "first-rung trials proposed at a time (the first batch: "
                                  "one lr sweep for every variant)", integer(maximum=MAX_TRIALS))
    reports: int = param(8, "validation losses a trial records, at equal fractions of its "
                         "budget", integer(maximum=MAX_COUNT))
    arithmetic_objective: str = param(
        "mean", "an arithmetic trial's value: its answer loss at the last evaluation (final), or "
        "the mean over its evaluations (mean: the area under its curve, which still ranks "
        "learning rates where one seed learns and the next does not)",
        choice(OBJECTIVE_SUMMARIES))
    seed: int = param(1000, "the trials' training seed (not one of study.seeds); the "
                      "full-budget points train on seed, seed + 1, ...", integer(0, MAX_SEED))
    bracket_seeds: int = param(1, "tuning seeds each full-budget learning rate trains on (the "
                               "bracket's points are their mean)", integer(maximum=16))
    bracket_factor: float = param(2.0, "ratio of neighbouring learning rates at the full "
                                  "budget", Rule("a number above 1 and at most 4",
                                                 lambda key, value: _check_factor(key, value)))
    bracket_points: int = param(5, "the most learning rates trained at the full budget, "
                                "extensions past an end of the bracket included",
                                integer(maximum=64))
    lr_low: float = param(1e-3, "lowest learning rate of the initial log-uniform range",
                          number())
    lr_high: float = param(1e-1, "highest learning rate of the initial range", number())
    lr_limits: tuple[float, ...] = param((1e-5, 1.0), "how far an edge may extend the "
                                         "learning-rate range (by 10x at a time)", low_high(MAX_LR))
    d_model_choices: tuple[int, ...] | None = param(
        None, "the widths searched; null: n_widths of them derived from the budget",
        Rule("null, or a non-empty list of distinct widths, each "
             f"{integer(maximum=MAX_WIDTH).allowed} and divisible by model.n_heads", _check_widths))
    tokens_per_parameter: tuple[float, ...] = param(
        (50.0, 200.0), "training tokens per non-embedding parameter the derived widths span",
        low_high(1e6))
    tokens_per_parameter_limits: tuple[float, ...] = param(
        (5.0, 200.0), "how far an edge may extend tokens_per_parameter", low_high(1e6))
    n_widths: int = param(4, "widths derived when d_model_choices is null",
                          integer(maximum=64))
    min_steps: int = param(30, "the fewest steps a first-rung trial trains",
                           integer(maximum=MAX_COUNT))
    storage: str = param("sqlite:///optuna.db", "Optuna storage URL (env "
                         "LMABLATE_OPTUNA_STORAGE overrides it)", STRING, result=False)
    sampler_seed: int = param(0, "seed of the first batch's sweep and of TPE (a re-tuning adds "
                              "its replicate number)", integer(0, MAX_SEED))
    heartbeat_seconds: int = param(10, "a trial silent for 4 heartbeats is failed and retried",
                                   integer(maximum=3600), result=False)

    def __post_init__(self) -> None:
        check_fields(self, "tune")
        if self.lr_low >= self.lr_high:
            fail("tune.lr_low", self.lr_low, f"must be below tune.lr_high={self.lr_high}")
        lo, hi = self.lr_limits
        if not lo <= self.lr_low < self.lr_high <= hi:
            fail("tune.lr_limits", list(self.lr_limits), f"must contain [tune.lr_low, "
                 f"tune.lr_high] = [{self.lr_low:g}, {self.lr_high:g}]")
        if len(self.rungs) > 1 and self.bracket_points < self.rungs[-1][0]:
            fail("tune.bracket_points", self.bracket_points, f"must be at least the full-budget "
                 f"rung's {self.rungs[-1][0]} learning rates (tune.rungs)")
        lo, hi = self.tokens_per_parameter_limits
        if not lo <= self.tokens_per_parameter[0] < self.tokens_per_parameter[1] <= hi:
            fail("tune.tokens_per_parameter_limits", list(self.tokens_per_parameter_limits),
                 f"must contain tune.tokens_per_parameter={list(self.tokens_per_parameter)}")

    @property
    def storage_url(self) -> str:
        return os.environ.get("LMABLATE_OPTUNA_STORAGE", self.storage)

    @property
    def n_trials(self) -> int:
        """Configurations tried at the first rung."""
        return self.rungs[0][0]

    @property
    def budget_fraction(self) -> float:
        """The first rung's share of the budget: the shortest trials."""
        return self.rungs[0][1]
