"""Equal training compute: a dataset's FLOPs budget turned into a run's step count.

Variants are compared at equal training compute, not at equal steps: at a fixed step count the
wider model nearly always wins, so a width chosen by tuning would decide the verdict. Every final
run of a dataset spends ``train.budget_flops[dataset]``; every tuning trial spends
its rung's share of it (``tune.rungs``). A run's step count follows from its own width:

    steps = budget / (flops_per_token x batch_size x context_length)

with ``flops_per_token`` = 6 N + 6 n_layers n_ctx d_model (Kaplan et al. 2020, Table 1; see
:func:`lmablate.model.gpt.flops_per_token`), so a narrow model trains more steps, not fewer.
"""

from __future__ import annotations

from lmablate.config.study import ModelConfig, StudyConfig, budget_label
from lmablate.core.validation import ConfigError
from lmablate.model.gpt import flops_per_token


def tokens_per_step(model_cfg: ModelConfig, batch_size: int) -> int:
    """Tokens per optimizer step: ``batch_size`` sequences of ``context_length`` tokens."""
    return batch_size * model_cfg.context_length


def training_flops(model_cfg: ModelConfig, batch_size: int, steps: int) -> int:
    """Training FLOPs of ``steps`` optimizer steps (forward + backward, Kaplan et al. 2020)."""
    return steps * tokens_per_step(model_cfg, batch_size) * flops_per_token(model_cfg)


def steps_for_budget(budget_flops: float, model_cfg: ModelConfig, batch_size: int, *,
                     multiple_of: int = 1, what: str = "run", source: str | None = None) -> int:
    """The step count whose training FLOPs come closest to ``budget_flops``, rounded to a
    multiple of ``multiple_of`` (tuning trials report at equal fractions of their budget).

    The rounding misses the budget by at most half a step (times ``multiple_of``): under 1% from
    50 steps on, which every run of the shipped profiles exceeds (tests/test_budget.py).

    ``source`` says where the budget came from in the user's own terms (e.g.
    ``train.budget_flops.arithmetic=1000 x tune.rungs[0] share 0.5``), for the error.

    Raises:
        ConfigError: the budget buys less than one step (names the budget as the user wrote it,
            the model width and the FLOPs of one step).
    """
    per_step = tokens_per_step(model_cfg, batch_size) * flops_per_token(model_cfg)
    steps = multiple_of * round(budget_flops / (per_step * multiple_of))
    if steps < multiple_of:
        source = source or f"train.budget_flops={budget_flops:.3g}"
        raise ConfigError(
            f"params: {source} buys no {what} of d_model={model_cfg.d_model} "
            f"({per_step * multiple_of:.3g} FLOPs for {multiple_of} step(s)); allowed: a larger "
            "budget")
    return steps


def run_steps(cfg: StudyConfig, dataset: str, model_cfg: ModelConfig) -> int:
    """Steps of a final run of ``model_cfg`` on ``dataset``: the dataset's whole budget.

    Raises:
        ConfigError: no budget for ``dataset``, or too small a one (see :func:`steps_for_budget`).
    """
    budget = cfg.train.for_dataset(dataset).budget_flops[dataset]
    return steps_for_budget(budget, model_cfg, cfg.for_dataset(dataset).train.batch_size,
                            what="final run",
                            source=f"train.budget_flops.{dataset}={budget:.3g}")


def trial_steps(cfg: StudyConfig, dataset: str, model_cfg: ModelConfig,
                fraction: float | None = None) -> int:
    """Steps of a tuning trial of ``model_cfg`` on ``dataset`` that spends ``fraction`` of the
    dataset's budget (default: the lowest rung's, the first of ``tune.rungs``). Its
    ``tune.reports`` validation losses fall every ``steps // reports`` steps, at the same
    fractions of its compute whatever its width.

    Raises:
        ConfigError: no budget for ``dataset``, too small a one (see :func:`steps_for_budget`),
            or a trial of the lowest rung shorter than ``tune.min_steps`` (or ``tune.reports``)
            steps: it would be judged on its warm-up rather than its loss.
    """
    budget = cfg.train.for_dataset(dataset).budget_flops[dataset]
    lowest = cfg.tune.budget_fraction
    fraction = lowest if fraction is None else fraction
    source = f"train.budget_flops.{dataset}={budget:.3g} x tune.rungs[0] share {lowest:g}"
    steps = steps_for_budget(budget * fraction, model_cfg,
                             cfg.for_dataset(dataset).train.batch_size,
                             what="tuning trial", source=source if fraction == lowest else
                             f"train.budget_flops.{dataset}={budget:.3g} x {fraction:g}")
    least = max(cfg.tune.min_steps, cfg.tune.reports)
    if fraction == lowest and steps < least:
        key = "tune.min_steps" if cfg.tune.min_steps >= cfg.tune.reports else "tune.reports"
        raise ConfigError(
            f"params: {source} buys {steps} steps of a tuning trial at "
            f"d_model={model_cfg.d_model}; allowed: at least {key}={least} steps (a larger "
            "share at the first of tune.rungs, a larger budget, or narrower widths)")
    return steps


def stage_budgets(cfg: StudyConfig, dataset: str, replicate: int = 0
                  ) -> list[tuple[float, str | None]]:
    """The budgets (training FLOPs per final run) a tune, train or evaluate stage computes on
    ``dataset``, increasing, each with the folder its checkpoints go to in a scaling study
    (:func:`lmablate.config.study.budget_label`, e.g. ``1.1e10``) or None where there is one.

    Every budget of the dataset; for a re-tuning (``replicate`` > 0) the headline budget alone
    (:meth:`~lmablate.config.study.StudyConfig.headline_budget`): it measures how much the verdicts,
    drawn there, owe to the tuner's luck.

    Raises:
        ConfigError: no budget for ``dataset``.
    """
    budgets = cfg.budgets(dataset)
    if replicate:
        budgets = budgets[-1:]
    return [(b, budget_label(b) if len(budgets) > 1 else None) for b in budgets]
