"""The ``train`` section of ``params.yaml``: how one run is optimised, at equal training compute.

``train.budget_flops`` gives each dataset one budget, or several (a scaling study: every variant
tuned and trained at each, :meth:`TrainConfig.at_budget`). :mod:`lmablate.config.study` re-exports
:class:`TrainConfig` with the other sections.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping

from lmablate.core.validation import (FRACTION, Rule, check_fields, choice, fail,
                                 integer, number, param)

LR_SCHEDULE_CHOICES = ("constant", "cosine")
MAX_BATCH = 4096  # sequences of a training or evaluation batch
MAX_CONTEXT = 8192  # tokens; attention memory grows with its square
MAX_BUDGET = 1e20  # training FLOPs of one run: about 3 days of an H100 at 40% of its bf16 peak
MAX_BUDGETS = 16  # budgets of one dataset in a scaling study: each is tuned and trained on its own
MAX_COUNT = 1_000_000  # steps, evaluation batches, samples, reports: counts of loop iterations


BUDGET = number(maximum=MAX_BUDGET)  # one dataset's training FLOPs per run


def _check_budgets(key: str, value: Any) -> dict[str, float | tuple[float, ...]]:
    if not isinstance(value, Mapping):
        fail(key, value, "expected a mapping of dataset name -> training FLOPs per run (e.g. "
             "1.0e+12), or a list of them in increasing order (a scaling study)")
    out: dict[str, float | tuple[float, ...]] = {}
    for name, flops in value.items():
        if not isinstance(flops, (list, tuple)):
            # 30000000000 and 3.0e+10: one value, one fingerprint (the rule keeps a float)
            out[name] = BUDGET.check(f"{key}.{name}", flops)
            continue
        if not flops or len(flops) > MAX_BUDGETS:
            fail(f"{key}.{name}", list(flops), "expected a number or a list of 1 to "
                 f"{MAX_BUDGETS} numbers (each budget is a study of its own)")
        flops = [BUDGET.check(f"{key}.{name}[{i}]", f) for i, f in enumerate(flops)]
        labels = [budget_label(f) for f in flops]
        if any(b >= a for a, b in zip(flops[1:], flops)) or len(set(labels)) < len(labels):
            fail(f"{key}.{name}", list(flops), "expected budgets in increasing order, distinct "
                 "in their first two significant digits, e.g. [1.1e+10, 3.3e+10, 1.0e+11]")
        # one budget is the one-budget study it names: the same fingerprints and files
        out[name] = flops[0] if len(flops) == 1 else tuple(flops)
    return out


def budget_label(flops: float) -> str:
    """A budget as its run folders and MLflow names write it: two significant digits, no
    ``+`` (``1.1e10`` for 1.1e+10 FLOPs, ``3e9`` for 3.0e+09)."""
    mantissa, exponent = f"{flops:.1e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation of one run at equal training compute.

    ``budget_flops`` maps each dataset to the training FLOPs every final run of that dataset
    spends (:mod:`lmablate.train.budget` turns it into a step count for the run's own width:
    budget / (``flops_per_token`` x ``batch_size`` x ``context_length``)), or to a list of
    them in increasing order: a scaling study, in which every variant is tuned and trained at
    each budget on its own (:meth:`at_budget`; the report's verdicts are drawn at the largest,
    its scaling section from all). A step is one
    optimizer step of ``batch_size`` sequences; ``warmup_fraction`` is the share of a run's
    steps over which the learning rate ramps up (so a tuning trial of a quarter of the budget
    warms up over a quarter of the steps, and every run's schedule has the same shape),
    ``eval_interval`` is in steps, ``eval_iters`` in batches per estimate. Every field changes
    what a run computes; settings that only change how fast it is computed live in
    :class:`RuntimeConfig`.
    """

    budget_flops: Mapping[str, float | tuple[float, ...]] = param(
        {"shakespeare": 1.0e11, "arithmetic": 2.25e11},
        "training FLOPs of every final run, per dataset (its steps follow from its width); a "
        "list of them: a scaling study, every variant tuned and trained at each",
        Rule(f"a mapping of dataset name -> {number(MAX_BUDGET).allowed}, or a list of such "
             "numbers in increasing order", _check_budgets))
    batch_size: int = param(16, "sequences per optimizer step", integer(maximum=MAX_BATCH))
    lr: float = param(3e-4, "learning rate outside tuning (final runs use the tuned lr)",
                      number())
    weight_decay: float = param(0.1, "AdamW weight decay of the weight matrices",
                                number(allow_zero=True))
    beta1: float = param(0.9, "AdamW beta1", FRACTION)
    beta2: float = param(0.99, "AdamW beta2", FRACTION)
    grad_clip: float = param(1.0, "gradient-norm clipping threshold (0: none)",
                             number(allow_zero=True))
    # at most half: the loss a tuning trial is judged on then comes after its warm-up
    warmup_fraction: float = param(0.05, "share of a run's steps over which the lr ramps up",
                                   number(0.5, allow_zero=True))
    lr_schedule: str = param("cosine", "learning-rate decay after the warm-up",
                             choice(LR_SCHEDULE_CHOICES))
    eval_interval: int = param(100, "steps between validation losses of a final run (a trial "
                               "validates tune.reports times)", integer(maximum=MAX_COUNT))
    eval_iters: int = param(8, "batches per validation-loss estimate",
                            integer(maximum=MAX_COUNT))

    def __post_init__(self) -> None:
        # may name other datasets than the study's; parse() requires a budget for each of them
        check_fields(self, "train")

    def budgets(self, name: str) -> tuple[float, ...]:
        """Dataset ``name``'s budgets (training FLOPs per final run), increasing: one, or
        several in a scaling study, each tuned and trained on its own.

        Raises:
            ConfigError: ``name`` has no budget.
        """
        if name not in self.budget_flops:
            fail("train.budget_flops", dict(self.budget_flops), f"no budget for dataset {name!r}")
        value = self.budget_flops[name]
        return tuple(value) if isinstance(value, tuple) else (value,)

    def at_budget(self, name: str, budget: float) -> "TrainConfig":
        """These settings with dataset ``name`` at one of its budgets, ``budget`` (FLOPs): what
        a run of that budget computes with. A one-budget study is its own view.

        Raises:
            ConfigError: ``budget`` is not one of ``name``'s budgets.
        """
        if budget not in self.budgets(name):
            fail(f"train.budget_flops.{name}", list(self.budgets(name)),
                 f"has no budget {budget:.3g}")
        return dataclasses.replace(self, budget_flops={**self.budget_flops, name: budget})

    def for_dataset(self, name: str) -> "TrainConfig":
        """These settings with only dataset ``name``'s budget: what a run on ``name`` depends on,
        so that another dataset's budget never enters its fingerprint.

        Raises:
            ConfigError: ``name`` has no budget, or several (a scaling study: take one first
                with :meth:`at_budget`).
        """
        if len(self.budgets(name)) > 1:
            fail(f"train.budget_flops.{name}", list(self.budgets(name)),
                 "one budget is needed here; a run takes one of a scaling study's budgets "
                 "(TrainConfig.at_budget)")
        return dataclasses.replace(self, budget_flops={name: self.budget_flops[name]})

    def run_params(self, name: str) -> dict[str, Any]:
        """Every setting of these that changes what a run on dataset ``name`` computes, as its
        MLflow params: each field of this class under its own name, ``budget_flops`` the
        dataset's one budget (FLOPs); ``lr`` is left out, since a run logs the tuned peak as
        ``peak_lr``.

        Raises:
            ConfigError: as :meth:`for_dataset`.
        """
        mine = self.for_dataset(name)
        out = {f.name: getattr(mine, f.name) for f in dataclasses.fields(self)
               if f.init and f.name != "lr" and f.metadata.get("fingerprint", True)}
        out["budget_flops"] = mine.budget_flops[name]
        return out

    def warmup_steps(self, steps: int) -> int:
        """Warm-up steps of a run of ``steps`` steps: ``warmup_fraction`` of them, rounded up (at
        least one when the fraction is not 0), and fewer than ``steps``."""
        if self.warmup_fraction == 0 or steps <= 1:
            return 0
        return min(steps - 1, max(1, math.ceil(self.warmup_fraction * steps)))
