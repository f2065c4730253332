"""The search space of a tuning study's first rung: learning rate and width, the widths derived
from the budget, and how the space grows past an edge.

- **Widths from the budget** (:func:`width_ladder`): unless ``tune.d_model_choices`` names them,
  the widths searched are ``tune.n_widths`` multiples of 2 ``n_heads`` whose training tokens per
  non-embedding parameter at the dataset's budget lie in ``tune.tokens_per_parameter``
  (Hoffmann et al. 2022: about 20 is compute-optimal), so the smallest width does not win by
  construction.
- **Edges** (:func:`space_for_batch`): when the best first-rung result so far sits on an edge of
  the range searched (the outer :data:`EDGE_SHARE` of the log learning-rate range, or the
  smallest or largest width), the next batch searches further that way: the learning rate by a
  factor :data:`LR_EXTENSION` up to ``tune.lr_limits``, a width derived from the budget by one
  step of its ladder while its tokens per parameter stay within
  ``tune.tokens_per_parameter_limits``. :func:`on_edge` flags a chosen value that is still on
  an edge.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial

from lmablate.config.study import MAX_WIDTH, ModelConfig, StudyConfig, TuneConfig
from lmablate.model.gpt import count_params, flops_per_token
from lmablate.train.budget import steps_for_budget
from lmablate.tune.rungs import Batch, best_trial, plan

EDGE_SHARE = 0.1  # the outer tenth of the log learning-rate range counts as its edge
LR_EXTENSION = 10.0  # an edge extends the learning-rate range by a decade


@dataclass(frozen=True)
class SearchSpace:
    """What a batch searches: the learning rate log-uniform in [``lr_low``, ``lr_high``] (per
    optimizer step, the peak of the schedule) and ``d_model`` among ``d_model_choices``
    (ascending). ``extended`` says, in words, how it grew beyond the configured range."""

    lr_low: float
    lr_high: float
    d_model_choices: tuple[int, ...]
    extended: tuple[str, ...] = ()

    def distributions(self) -> dict[str, optuna.distributions.BaseDistribution]:
        """Optuna's distributions of this space (what TPE samples from)."""
        return {"lr": FloatDistribution(self.lr_low, self.lr_high, log=True),
                "d_model": CategoricalDistribution(list(self.d_model_choices))}


def trial_distributions(tune: TuneConfig) -> dict[str, optuna.distributions.BaseDistribution]:
    """The distributions a stored trial declares for its fixed parameters: the hard limits, the
    same for every trial of a study, as Optuna refuses a parameter whose distribution changes
    within a study (a categorical whose choices grow, for instance)."""
    return {"lr": FloatDistribution(*tune.lr_limits, log=True),
            "d_model": IntDistribution(1, MAX_WIDTH, log=True)}


def tokens_per_parameter(cfg: StudyConfig, dataset: str, d_model: int) -> float:
    """Training tokens per non-embedding parameter of a final run of the baseline at
    ``d_model``: D / N with D = budget / FLOPs per token
    (:func:`lmablate.model.gpt.flops_per_token`) and N as in Kaplan et al. 2020. Hoffmann et al.
    2022 (table 3) find about 20 compute-optimal.

    Raises:
        ConfigError: no budget for ``dataset``.
    """
    cfg = cfg.for_dataset(dataset)  # its context length sets the FLOPs per token
    budget = cfg.train.for_dataset(dataset).budget_flops[dataset]
    return _tokens_per_parameter(cfg.model.replace(d_model=d_model), budget)


@functools.lru_cache(maxsize=4096)
def _tokens_per_parameter(model: ModelConfig, budget: float) -> float:
    return budget / flops_per_token(model) / count_params(model.replace(vocab_size=1))[1]


def width_ladder(cfg: StudyConfig, dataset: str) -> list[int]:
    """The widths a study may search on ``dataset`` when they are derived from the budget:
    multiples of 2 ``model.n_heads`` (a whole, even head size, as RoPE needs) whose tokens per
    parameter (:func:`tokens_per_parameter`) lie within ``tune.tokens_per_parameter_limits``
    and whose trials at the lowest rung train at least ``tune.min_steps`` steps; ascending."""
    cfg = cfg.for_dataset(dataset)
    tune, step = cfg.tune, 2 * cfg.model.n_heads
    low, high = tune.tokens_per_parameter_limits
    least = max(tune.min_steps, tune.reports)
    budget = cfg.train.for_dataset(dataset).budget_flops[dataset]
    ladder = []
    for d in range(step, MAX_WIDTH + 1, step):
        ratio = tokens_per_parameter(cfg, dataset, d)
        if ratio < low:
            break  # the ratio falls as the width grows
        model = cfg.model.replace(d_model=d)
        if ratio <= high and steps_for_budget(
                budget * tune.budget_fraction, model, cfg.train.batch_size,
                multiple_of=1) >= least:
            ladder.append(d)
    return ladder


def _derived_choices(cfg: StudyConfig, dataset: str) -> tuple[list[int], list[int]]:
    """(ladder, indices of the initial widths on it): ``tune.n_widths`` widths spread evenly
    over the ladder's widths whose tokens per parameter lie in ``tune.tokens_per_parameter``, or
    the one closest to its geometric middle if none does."""
    ladder = width_ladder(cfg, dataset)
    if not ladder:
        budget = cfg.train.for_dataset(dataset).budget_flops[dataset]
        raise ValueError(f"tune {dataset}: train.budget_flops.{dataset}={budget:.3g} buys no "
                         f"width: none is a multiple of 2 x n_heads with tokens per parameter within "
                         f"tune.tokens_per_parameter_limits="
                         f"{list(cfg.tune.tokens_per_parameter_limits)} and at least "
                         f"tune.min_steps={cfg.tune.min_steps} steps at the lowest rung; a larger "
                         "budget, or wider limits")
    low, high = cfg.tune.tokens_per_parameter
    inside = [i for i, d in enumerate(ladder)
              if low <= tokens_per_parameter(cfg, dataset, d) <= high]
    if not inside:
        middle = math.sqrt(low * high)
        inside = [min(range(len(ladder)), key=lambda i: abs(math.log(
            tokens_per_parameter(cfg, dataset, ladder[i]) / middle)))]
    n = min(cfg.tune.n_widths, len(inside))
    picks = sorted({inside[round(k * (len(inside) - 1) / max(1, n - 1))] for k in range(n)})
    return ladder, picks


def initial_space(cfg: StudyConfig, dataset: str) -> SearchSpace:
    """The space of the study's first batch: [``tune.lr_low``, ``tune.lr_high``] and either
    ``tune.d_model_choices`` or the widths derived from the budget (:func:`width_ladder`).

    Raises:
        ValueError: no width can be derived (the message names the settings to change).
    """
    tune = cfg.tune
    if tune.d_model_choices is not None:
        widths = tuple(tune.d_model_choices)
    else:
        ladder, picks = _derived_choices(cfg, dataset)
        widths = tuple(ladder[i] for i in picks)
    return SearchSpace(tune.lr_low, tune.lr_high, widths)


def _extend(cfg: StudyConfig, dataset: str, space: SearchSpace,
            best: dict[str, Any]) -> SearchSpace:
    """``space`` grown past the edge that ``best`` (params) sits on, within the hard limits."""
    tune = cfg.tune
    low, high, widths, notes = space.lr_low, space.lr_high, list(space.d_model_choices), []
    where = math.log(best["lr"] / low) / math.log(high / low)
    if where <= EDGE_SHARE and low > tune.lr_limits[0]:
        low = max(tune.lr_limits[0], low / LR_EXTENSION)
        notes.append(f"lr down to {low:.3g}")
    elif where >= 1 - EDGE_SHARE and high < tune.lr_limits[1]:
        high = min(tune.lr_limits[1], high * LR_EXTENSION)
        notes.append(f"lr up to {high:.3g}")
    if tune.d_model_choices is None and len(widths) > 1 and best["d_model"] in (
            widths[0], widths[-1]):
        ladder = width_ladder(cfg, dataset)
        index = [ladder.index(d) for d in widths]
        gap = max(1, round((index[-1] - index[0]) / (len(index) - 1)))
        new = index[0] - gap if best["d_model"] == widths[0] else index[-1] + gap
        if 0 <= new < len(ladder):
            widths = sorted(widths + [ladder[new]])
            notes.append(f"d_model {ladder[new]} added")
    if not notes:
        return space
    return SearchSpace(low, high, tuple(widths), space.extended + tuple(notes))


def space_for_batch(cfg: StudyConfig, dataset: str, results: dict[int, FrozenTrial],
                    batch: Batch) -> SearchSpace:
    """The space ``batch`` searches: the initial space, grown after each earlier batch of the
    first rung whose best result so far sat on an edge (:func:`_extend`). A later rung's batch
    gets the space of the first rung's last batch: the range that was searched. A pure
    function of the earlier batches' results.
    """
    batches = plan(cfg.tune)
    if batch.rung > 0:
        batch = [b for b in batches if b.rung == 0][-1]
    space = initial_space(cfg, dataset)
    for earlier in batches:
        if earlier.index >= batch.index:
            break
        best = best_trial(results, range(0, earlier.slots.stop))
        if best is not None:
            space = _extend(cfg, dataset, space, best.params)
    return space



def on_edge(space: SearchSpace, params: dict[str, Any], tune: TuneConfig,
            ladder: list[int] | None = None) -> list[str]:
    """The tuned values that sit on an edge of the range searched (``space``, as extended):
    ``lr`` in the outer :data:`EDGE_SHARE` of its log-range, ``d_model`` the smallest or
    largest of several widths. Such a value says the optimum may lie outside; a bound that is
    also the hard limit is named as such (``tune.lr_limits``; for derived widths, the end of
    their ``ladder``, :func:`width_ladder`, set by ``tune.tokens_per_parameter_limits``)."""
    flags = []
    where = math.log(params["lr"] / space.lr_low) / math.log(space.lr_high / space.lr_low)
    if where <= EDGE_SHARE:
        limit = " (the limit tune.lr_limits)" if space.lr_low <= tune.lr_limits[0] else ""
        flags.append(f"lr at lower bound {space.lr_low:.3g}{limit}")
    elif where >= 1 - EDGE_SHARE:
        limit = " (the limit tune.lr_limits)" if space.lr_high >= tune.lr_limits[1] else ""
        flags.append(f"lr at upper bound {space.lr_high:.3g}{limit}")
    choices = space.d_model_choices
    if len(choices) > 1 and params["d_model"] in (choices[0], choices[-1]):
        which = "smallest" if params["d_model"] == choices[0] else "largest"
        end = (ladder[0] if which == "smallest" else ladder[-1]) if ladder else None
        limit = (" (the limit tune.tokens_per_parameter_limits)"
                 if params["d_model"] == end else "")
        flags.append(f"d_model the {which} choice{limit}")
    return flags
