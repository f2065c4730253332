"""The tuning protocol: successive halving over learning rate and width, deterministic at any
number of workers.

One study per dataset x variant (and per re-tuning replicate). Its search space is declared
here once (:func:`initial_space`, :func:`space_for_batch`), and so is every decision the study
makes; :mod:`lmablate.trials` only trains the trials this module asks for, and
:mod:`lmablate.stages.tune` records them.

- **Rungs** (``tune.rungs``, successive halving: Jamieson & Talwalkar 2016; Li et al. 2018):
  the first rung's configurations train its share of the dataset's budget; the best of them
  train again on the next rung's share, and so on up to a rung at the full budget, the one the
  final runs spend.
  Each rung trains from scratch: with a cosine schedule, the loss a quarter of the way through a
  full run is not the loss of a run of a quarter of the budget, so Optuna's in-trial
  ``SuccessiveHalvingPruner`` would judge a different thing. Short runs favour high learning
  rates (the short-horizon bias); the last rung is where the choice is made, at the full
  budget.
- **Slots and batches** (:func:`plan`): trials are numbered by slot, rung by rung. The first
  rung is proposed ``tune.trials_per_batch`` at a time; each later rung is one batch of
  promotions (:func:`promote`). A batch is computed from the results of earlier batches only,
  in slot order, so the same history gives the same batch, whoever computes it and whenever.
- **Proposals** (:func:`propose`): the first batch is a shared design (:func:`design`): a
  learning-rate sweep, evenly spaced in log over the configured range, at the width nearest the
  compute-optimal one (:func:`design_width`), shifted by ``tune.sampler_seed`` alone. Every
  variant is tried at the same points, so their learning-rate curves are paired (the report's
  learning-rate sensitivity comes from them). Later batches of the first rung come from TPE
  (Bergstra et al. 2011, multivariate, constant liar) over learning rate and width, seeded per
  study (:func:`study_seed`), so each study explores on its own.
- **Edges** (:func:`space_for_batch`): when the best first-rung result so far sits on an edge of
  the range searched (the outer :data:`EDGE_SHARE` of the log learning-rate range, or the
  smallest or largest width), the next batch searches further that way: the learning rate by a
  factor :data:`LR_EXTENSION` up to ``tune.lr_limits``, a width derived from the budget by one
  step of its ladder while its tokens per parameter stay within
  ``tune.tokens_per_parameter_limits``. :func:`on_edge` flags a chosen value that is still on
  an edge.
- **Widths from the budget** (:func:`width_ladder`): unless ``tune.d_model_choices`` names them,
  the widths searched are ``tune.n_widths`` multiples of 2 ``n_heads`` whose training tokens per
  non-embedding parameter at the dataset's budget lie in ``tune.tokens_per_parameter``
  (Hoffmann et al. 2022: about 20 is compute-optimal), so the smallest width does not win by
  construction.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import warnings
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.distributions import (CategoricalDistribution, FloatDistribution,
                                  IntDistribution)
from optuna.trial import FrozenTrial, TrialState

from lmablate.budget import steps_for_budget
from lmablate.config import MAX_WIDTH, ModelConfig, StudyConfig, TrainConfig, TuneConfig
from lmablate.fingerprint import RUN_MODULES, code_version, fingerprint
from lmablate.lr_bracket import (OUT_OF_POINTS, Fit, Point, Uncertainty, fit_minimum, next_lr,
                                 tuning_uncertainty)
from lmablate.model import count_params, flops_per_token

SLOT = "slot"  # user attribute: the trial's place in the study (0 .. n_slots - 1)
RUNG = "rung"  # user attribute: the rung of the trial's slot
FRACTION = "budget_fraction"  # user attribute: the share of the budget the trial trains
OUTCOME = "outcome"  # user attribute "diverged": a FAIL that is a result, not a lost worker
DIVERGED = "diverged"
TRIAL_SEED = "seed"  # user attribute: the trial's training seed (tune.seed + k in the bracket)
EDGE_SHARE = 0.1  # the outer tenth of the log learning-rate range counts as its edge
LR_EXTENSION = 10.0  # an edge extends the learning-rate range by a decade
WIDTH_EXPONENT = 0.25  # compute-optimal d_model ~ C^0.25 at a fixed depth (bracket_widths)
# Modules whose code decides a trial's result besides the training code (RUN_MODULES).
TUNE_MODULES = RUN_MODULES + ("budget.py", "lr_bracket.py", "tuning.py", "trials.py", "variants.py",
                               "stages/tune.py")
optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


# ---------------------------------------------------------------------------- rungs and slots


@dataclass(frozen=True)
class Batch:
    """Slots proposed together: ``index`` in the study's order, the ``rung`` they belong to and
    the share of the budget (``fraction``) each of their trials trains."""

    index: int
    rung: int
    fraction: float
    slots: range


def plan(tune: TuneConfig) -> list[Batch]:
    """Every batch of the study, in order: the first rung in batches of
    ``tune.trials_per_batch``, each later rung below the full budget as one batch (its
    promotions), and, when there is more than one rung, the full-budget bracket
    (:func:`bracket_proposals`), each learning rate on ``tune.bracket_seeds`` slots: a batch of
    its middle learning rate at two widths, a batch of its other learning rates, then up to
    ``tune.bracket_points`` minus its learning rates extension batches of one learning rate,
    which stay empty once the bracket is closed."""
    batches: list[Batch] = []
    start = 0
    for rung, (n, fraction) in enumerate(tune.rungs):
        if is_bracket(tune, rung):
            seeds = tune.bracket_seeds
            # the middle learning rate at two widths (the width comparison), then the rung's
            # other learning rates at the width kept, then one more a batch
            sizes = [2 * seeds] + ([(n - 1) * seeds] if n > 1 else [])
            sizes += [seeds] * (tune.bracket_points - n)
            for size in sizes:
                batches.append(Batch(len(batches), rung, fraction, range(start, start + size)))
                start += size
            continue
        size = tune.trials_per_batch if rung == 0 else n
        for first in range(start, start + n, size):
            batches.append(Batch(len(batches), rung, fraction,
                                 range(first, min(first + size, start + n))))
        start += n
    return batches


def is_bracket(tune: TuneConfig, rung: int) -> bool:
    """Whether ``rung`` is the full-budget bracket: the last of several rungs."""
    return len(tune.rungs) > 1 and rung == len(tune.rungs) - 1


def n_slots(tune: TuneConfig) -> int:
    """How many trials the study has room for, over all rungs."""
    return plan(tune)[-1].slots.stop


def slot_seed(tune: TuneConfig, slot: int) -> int:
    """The training seed of ``slot``'s trial: ``tune.seed``, or in the bracket ``tune.seed`` +
    the slot's place among the ``tune.bracket_seeds`` seeds of its learning rate."""
    batch = batch_of(tune, slot)
    if not is_bracket(tune, batch.rung):
        return tune.seed
    return tune.seed + (slot - batch.slots.start) % tune.bracket_seeds


def batch_of(tune: TuneConfig, slot: int) -> Batch:
    """The batch that holds ``slot``.

    Raises:
        ValueError: ``slot`` is not a slot of the study.
    """
    for batch in plan(tune):
        if slot in batch.slots:
            return batch
    raise ValueError(f"slot {slot} is not one of the study's {n_slots(tune)} slots")


# ------------------------------------------------------------------------------ search space


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
    ``d_model``: D / N with D = budget / FLOPs per token (:func:`lmablate.model.flops_per_token`)
    and N as in Kaplan et al. 2020. Hoffmann et al. 2022 (table 3) find about 20 compute-optimal.

    Raises:
        ConfigError: no budget for ``dataset``.
    """
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
        raise ValueError(f"tune {dataset}: no width is a multiple of 2 x n_heads with tokens per "
                         f"parameter within tune.tokens_per_parameter_limits="
                         f"{list(cfg.tune.tokens_per_parameter_limits)} and at least "
                         f"tune.min_steps={cfg.tune.min_steps} steps at the lowest rung")
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
        best = _best(results, range(0, earlier.slots.stop))
        if best is not None:
            space = _extend(cfg, dataset, space, best.params)
    return space


# --------------------------------------------------------------------------------- proposals


def study_seed(sampler_seed: int, dataset: str, variant: str, batch: int) -> int:
    """TPE's seed for ``batch`` of the study of ``dataset`` x ``variant``: a hash of the four,
    below 2**32, so that studies do not propose the same points and a re-tuning replicate
    (another ``sampler_seed``) proposes others."""
    text = f"{sampler_seed}/{dataset}/{variant}/{batch}".encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:4], "big")


def design_width(cfg: StudyConfig, dataset: str, space: SearchSpace) -> int:
    """The width of the shared design: of ``space``'s widths, the one whose tokens per parameter
    (:func:`tokens_per_parameter`) is closest, in log, to the geometric middle of
    ``tune.tokens_per_parameter`` (20 for [5, 80], Chinchilla's ratio)."""
    middle = math.sqrt(cfg.tune.tokens_per_parameter[0] * cfg.tune.tokens_per_parameter[1])
    return min(space.d_model_choices, key=lambda d: (
        abs(math.log(tokens_per_parameter(cfg, dataset, d) / middle)), d))


def design(space: SearchSpace, width: int, n: int, sampler_seed: int) -> list[dict[str, Any]]:
    """The shared design: ``n`` learning rates evenly spaced in log over [``lr_low``,
    ``lr_high``], one in each of ``n`` equal slices, all shifted by the same random share of a
    slice drawn from ``sampler_seed`` (a randomised grid), at one ``width``. The same for every
    variant of a dataset, so their learning-rate curves are paired point by point (Wortsman et
    al. 2023 sweep the learning rate at fixed size the same way)."""
    import numpy as np

    shift = float(np.random.default_rng(sampler_seed).random())
    span = math.log(space.lr_high / space.lr_low)
    return [{"lr": space.lr_low * math.exp((i + shift) / n * span), "d_model": width}
            for i in range(n)]


def _history_study(space: SearchSpace, history: list[FrozenTrial],
                   sampler=None) -> optuna.Study:
    """An in-memory study holding ``history`` in order: what TPE may see. A diverged trial
    stays FAIL (TPE leaves it out; the edge rule and promotion rank it last)."""
    study = optuna.create_study(direction="minimize", sampler=sampler,
                                pruner=optuna.pruners.NopPruner())
    dists = space.distributions()
    for t in history:
        study.add_trial(optuna.trial.create_trial(
            state=t.state, params=t.params, distributions=dists,
            value=t.value if t.state == TrialState.COMPLETE else None))
    return study


def _best(results: dict[int, FrozenTrial], slots: range) -> FrozenTrial | None:
    """The completed trial of ``slots`` with the lowest value (the lower slot on a tie)."""
    done = [results[s] for s in slots if s in results and results[s].state == TrialState.COMPLETE]
    return min(done, key=lambda t: (t.value, t.user_attrs[SLOT]), default=None)


def promote(tune: TuneConfig, results: dict[int, FrozenTrial], rung: int) -> list[FrozenTrial]:
    """The trials of rung ``rung`` - 1 that go on to ``rung``: its completed trials in order of
    value (then slot), as many as ``rung`` has slots. Fewer when fewer completed."""
    batches = [b for b in plan(tune) if b.rung == rung - 1]
    slots = range(batches[0].slots.start, batches[-1].slots.stop)
    done = sorted((results[s] for s in slots
                   if s in results and results[s].state == TrialState.COMPLETE),
                  key=lambda t: (t.value, t.user_attrs[SLOT]))
    return done[:tune.rungs[rung][0]]


def propose(cfg: StudyConfig, dataset: str, variant: str, results: dict[int, FrozenTrial],
            batch: Batch, sampler_seed: int) -> dict[int, dict[str, Any]]:
    """Parameters (``lr``, ``d_model``) for the slots of ``batch``, from the results of the
    slots before it: the shared design for the first batch, TPE for the first rung's later
    batches, the promotions for a later rung. A slot missing from the answer stays empty (a
    rung with fewer completed trials below it than slots).

    Raises:
        RuntimeError: a slot of an earlier batch has no result yet.
    """
    proposed = _proposed(cfg, dataset, results, batch)
    missing = [s for s in range(batch.slots.start) if s not in results and s in proposed]
    if missing:
        raise RuntimeError(f"tune {dataset}/{variant}: batch {batch.index} proposed before "
                           f"slots {missing} of earlier batches finished")
    tune = cfg.tune
    if is_bracket(tune, batch.rung):
        return bracket_proposals(cfg, dataset, results, batch)
    if batch.rung > 0:
        return {slot: dict(t.params) for slot, t in zip(batch.slots, promote(
            tune, results, batch.rung))}
    space = space_for_batch(cfg, dataset, results, batch)
    if batch.index == 0:
        width = design_width(cfg, dataset, space)
        return dict(zip(batch.slots, design(space, width, len(batch.slots), sampler_seed)))
    sampler = optuna.samplers.TPESampler(
        seed=study_seed(sampler_seed, dataset, variant, batch.index),
        n_startup_trials=tune.trials_per_batch, multivariate=True, constant_liar=True)
    history = [results[s] for s in range(batch.slots.start) if s in results]
    study = _history_study(space, history, sampler)
    return {slot: study.ask(space.distributions()).params for slot in batch.slots}


def _proposed(cfg: StudyConfig, dataset: str, results: dict[int, FrozenTrial],
              before: Batch) -> set[int]:
    """The slots of batches before ``before`` that hold a proposal (a later rung's slots can
    stay empty)."""
    slots: set[int] = set()
    for batch in plan(cfg.tune):
        if batch.index >= before.index:
            break
        if is_bracket(cfg.tune, batch.rung):
            slots |= set(bracket_proposals(cfg, dataset, results, batch))
        else:
            slots |= set(batch.slots) if batch.rung == 0 else set(
                list(batch.slots)[:len(promote(cfg.tune, results, batch.rung))])
    return slots


# ------------------------------------------------------------------- the full-budget bracket


def _rung_slots(tune: TuneConfig, rung: int) -> range:
    batches = [b for b in plan(tune) if b.rung == rung]
    return range(batches[0].slots.start, batches[-1].slots.stop)


def bracket_widths(cfg: StudyConfig, dataset: str, results: dict[int, FrozenTrial],
                   rung: int) -> tuple[int, int] | None:
    """``(scaled, below)``: the widths the bracket compares at the full budget. ``below`` is the
    best width of the rung below; ``scaled`` is it scaled to the full budget by (1 / its
    share) ** :data:`WIDTH_EXPONENT` and snapped, in log, to the nearest of
    ``tune.d_model_choices`` or the derived ladder (:func:`width_ladder`). At a fixed depth the
    non-embedding parameters grow as d_model^2 and the compute-optimal ones as C^0.5 (Hoffmann
    et al. 2022), so the compute-optimal width grows as C^0.25: a width chosen on a share of the
    budget is likely too narrow for the whole of it, unless the objective says otherwise,
    which the bracket's first batch measures. None when no trial of the rung below
    completed."""
    below = _best(results, _rung_slots(cfg.tune, rung - 1))
    if below is None:
        return None
    width = below.params["d_model"]
    target = width * (1 / below.user_attrs[FRACTION]) ** WIDTH_EXPONENT
    widths = (list(cfg.tune.d_model_choices) if cfg.tune.d_model_choices is not None
              else width_ladder(cfg, dataset)) or [width]
    return min(widths, key=lambda d: (abs(math.log(d / target)), d)), width


def _first_lrs(tune: TuneConfig, centre: float, n: int) -> list[float]:
    """``n`` learning rates ``tune.bracket_factor`` apart, centred (in log) on ``centre`` and
    moved as a whole inside ``tune.lr_limits``."""
    factor, (low, high) = tune.bracket_factor, tune.lr_limits
    lrs = [centre * factor ** (k - (n - 1) / 2) for k in range(n)]
    if lrs[0] < low:
        lrs = [lr * low / lrs[0] for lr in lrs]
    if lrs[-1] > high:
        lrs = [lr * high / lrs[-1] for lr in lrs]
    return [min(high, max(low, lr)) for lr in lrs]


def _bracket_trials(tune: TuneConfig, results: dict[int, FrozenTrial],
                    before: Batch | None = None) -> list[tuple[int, Point]]:
    """``(d_model, point)`` of every full-budget point of the bracket's batches before
    ``before`` (all when None) whose seeds have all finished, in slot order: the final
    validation loss of each tuning seed (``inf`` for one that diverged)."""
    rung = len(tune.rungs) - 1
    seeds = tune.bracket_seeds
    groups: dict[tuple[int, int], list[FrozenTrial | None]] = {}
    for batch in plan(tune):
        if batch.rung != rung or (before is not None and batch.index >= before.index):
            continue
        for slot in batch.slots:
            point = (batch.index, (slot - batch.slots.start) // seeds)
            groups.setdefault(point, []).append(results.get(slot))
    out = []
    for trials in groups.values():
        if any(t is None for t in trials):
            continue
        out.append((trials[0].params["d_model"], Point(trials[0].params["lr"], tuple(
            t.value if t.state == TrialState.COMPLETE else math.inf for t in trials))))
    return out


def bracket_width(cfg: StudyConfig, dataset: str, results: dict[int, FrozenTrial],
                  rung: int) -> tuple[int, dict[int, float]] | None:
    """The width the bracket trains past its first batch, and the losses that chose it:
    ``(width, {d_model: mean loss at the middle learning rate})``. The first batch trains that
    lr at both of :func:`bracket_widths`, each on ``tune.bracket_seeds`` seeds; the lower mean
    wins (the scaled width on a tie or while the other has not finished). None when no trial
    of the rung below completed."""
    widths = bracket_widths(cfg, dataset, results, rung)
    if widths is None:
        return None
    scaled, below = widths
    if scaled == below:
        return scaled, {}
    first = next(b for b in plan(cfg.tune) if b.rung == rung)
    at = {d: p.loss for d, p in _bracket_trials(cfg.tune, results, _next_batch(cfg.tune, first))}
    if len(at) < 2 or not at[below] < at[scaled]:
        return scaled, at
    return below, at


def _next_batch(tune: TuneConfig, batch: Batch) -> Batch | None:
    """The batch after ``batch`` in :func:`plan`; None after the last."""
    batches = plan(tune)
    return batches[batch.index + 1] if batch.index + 1 < len(batches) else None


def _centre(tune: TuneConfig, results: dict[int, FrozenTrial], rung: int) -> float:
    """The first batch's middle learning rate: one factor below the best lr of the rung below,
    since a share of the budget favours a higher lr than the whole (the short-horizon bias,
    Bjorck et al. 2024, "Scaling Optimal LR Across Token Horizons")."""
    return _best(results, _rung_slots(tune, rung - 1)).params["lr"] / tune.bracket_factor


def bracket_points(tune: TuneConfig, results: dict[int, FrozenTrial], width: int,
                   before: Batch | None = None) -> list[Point]:
    """The full-budget points (:class:`lmablate.lr_bracket.Point`) at ``width`` of the
    bracket's batches before ``before`` (all when None), sorted by lr. A point whose seeds
    have not all finished is left out."""
    return sorted((p for d, p in _bracket_trials(tune, results, before) if d == width),
                  key=lambda p: p.lr)


def bracket_proposals(cfg: StudyConfig, dataset: str, results: dict[int, FrozenTrial],
                      batch: Batch) -> dict[int, dict[str, Any]]:
    """Parameters for the slots of a bracket ``batch``, each learning rate on
    ``tune.bracket_seeds`` seeds (:func:`slot_seed`). The rung's learning rates lie
    ``tune.bracket_factor`` apart, centred one factor below the best lr of the rung below. The
    first batch trains the middle one at both widths of :func:`bracket_widths` (once when they
    are equal); the second the others at the width kept (:func:`bracket_width`); each later
    batch one more learning rate there, one factor past the end its best point sits on
    (:func:`lmablate.lr_bracket.next_lr`), or nothing once the bracket is closed or at
    ``tune.lr_limits``."""
    tune = cfg.tune
    widths = bracket_widths(cfg, dataset, results, batch.rung)
    if widths is None:
        return {}
    batches = [b for b in plan(tune) if b.rung == batch.rung]
    n = tune.rungs[batch.rung][0]
    lrs = _first_lrs(tune, _centre(tune, results, batch.rung), n)
    middle = lrs[(n - 1) // 2]
    if batch.index == batches[0].index:
        points = [(middle, d) for d in dict.fromkeys(widths)]
    else:
        width, _ = bracket_width(cfg, dataset, results, batch.rung)
        if n > 1 and batch.index == batches[1].index:
            points = [(lr, width) for lr in lrs if lr != middle]
        else:
            before = bracket_points(tune, results, width, batch)
            done = batch.index - batches[0].index - (2 if n > 1 else 1)  # extensions before
            if len(before) < n + done:
                return {}  # an earlier extension was not needed (or has not finished)
            state, lr = next_lr(before, tune.bracket_factor, tune.lr_limits)
            if lr is None:
                return {}
            points = [(lr, width)]
    slots = iter(batch.slots)
    return {next(slots): {"lr": lr, "d_model": d}
            for lr, d in points for _ in range(tune.bracket_seeds)}


@dataclass(frozen=True)
class BracketOutcome:
    """What the full-budget bracket chose: the ``fit`` (:class:`lmablate.lr_bracket.Fit`,
    whose ``lr`` is the answer), the ``width`` it trained past its first batch and the mean
    losses that chose it (``widths``: d_model -> loss at the first batch's middle lr, empty
    when there was one candidate), its ``points`` at that width, how it ended (``state``:
    bracketed, at the limit, or out of points) and the ``uncertainty`` of the tuned loss
    (:func:`lmablate.lr_bracket.tuning_uncertainty`; None when not measurable)."""

    fit: Fit
    width: int
    widths: dict[int, float]
    points: list[Point]
    state: str
    uncertainty: Uncertainty | None


def bracket_outcome(cfg: StudyConfig, dataset: str,
                    results: dict[int, FrozenTrial]) -> BracketOutcome | None:
    """The bracket's answer, or None when the study has no bracket or none of its points at
    the chosen width has a finite loss (every full-budget trial there diverged)."""
    tune = cfg.tune
    if len(tune.rungs) < 2:
        return None
    chosen_width = bracket_width(cfg, dataset, results, len(tune.rungs) - 1)
    if chosen_width is None:
        return None
    width, compared = chosen_width
    points = bracket_points(tune, results, width)
    if not any(math.isfinite(p.loss) for p in points):
        return None
    state, _ = next_lr(points, tune.bracket_factor, tune.lr_limits)
    if state == "extend":
        state = OUT_OF_POINTS
    fit = fit_minimum(points)
    return BracketOutcome(fit, width, compared, points, state,
                          tuning_uncertainty(points, fit.lr))


def next_batch(cfg: StudyConfig, dataset: str, variant: str, results: dict[int, FrozenTrial],
               sampler_seed: int) -> tuple[Batch, dict[int, dict[str, Any]]] | None:
    """The first batch with a proposed slot that has no result, with its proposals; None when
    the study is done."""
    for batch in plan(cfg.tune):
        params = propose(cfg, dataset, variant, results, batch, sampler_seed)
        if any(s not in results for s in params):
            return batch, params
    return None


# ------------------------------------------------------------------------------------ result


def chosen(tune: TuneConfig, results: dict[int, FrozenTrial]) -> FrozenTrial | None:
    """The study's answer: the best completed trial of the highest rung that has one (the full
    budget unless every trial there diverged); None when no trial completed."""
    for batch in reversed(plan(tune)):
        rung = [b for b in plan(tune) if b.rung == batch.rung]
        best = _best(results, range(rung[0].slots.start, rung[-1].slots.stop))
        if best is not None:
            return best
    return None


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


# ----------------------------------------------------------------------- study in the storage


def trial_train_config(cfg: StudyConfig, dataset: str, steps: int) -> TrainConfig:
    """The training settings of a trial of ``steps`` steps on ``dataset``: ``train`` with a
    validation loss every ``steps / tune.reports`` steps (recorded, for the curves)."""
    return dataclasses.replace(cfg.train.for_dataset(dataset),
                               eval_interval=max(1, steps // cfg.tune.reports))


def study_name(cfg: StudyConfig, dataset: str, variant: str, data_fingerprint: str,
               sampler_seed: int, device_kind: str) -> str:
    """``<dataset>-<variant>-<fingerprint>``. The fingerprint (:func:`lmablate.fingerprint`)
    covers every input of the objective: the dataset, the baseline model and the variant's
    overrides, the training settings with the dataset's budget, the tune settings (with
    ``sampler_seed``, which a re-tuning replaces), ``study.match_params``, the code of
    :data:`TUNE_MODULES`, the training data and the kind of device the trials compute on
    (:func:`lmablate.device.device_kind`, e.g. ``cpu AVX512``). So an edit of ``model.py``
    starts a new study instead of returning trials trained by the old code, and machines with
    other kernels sharing one storage never mix their trials."""
    # a trial validates tune.reports times, whatever train.eval_interval says
    train = dataclasses.replace(cfg.train.for_dataset(dataset), eval_interval=1)
    fp = fingerprint(cfg.dataset(dataset), cfg.model, cfg.variants[variant], train,
                     dataclasses.replace(cfg.tune, sampler_seed=sampler_seed), cfg.match_params,
                     code_version(TUNE_MODULES), data_fingerprint, device_kind)
    return f"{dataset}-{variant}-{fp}"


def describe_study(study: optuna.Study, cfg: StudyConfig, dataset: str, variant: str,
                   sampler_seed: int) -> None:
    """Name the objective (``val_loss``, nats/char) and record what the study tunes as its
    user attributes: dataset, variant, the dataset's budget (FLOPs), the rungs (trials, share
    of the budget), the initial search space and the sampler seed, so that the storage alone
    (optuna-dashboard, a PostgreSQL shared by workers) says what a study is. Setting them again
    writes the same values; nothing here changes a trial."""
    with warnings.catch_warnings():  # set_metric_names is marked experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(["val_loss"])
    space = initial_space(cfg, dataset)
    for key, value in {"dataset": dataset, "variant": variant,
                       "budget_flops": cfg.train.budget_flops[dataset],
                       "rungs": [list(r) for r in cfg.tune.rungs],
                       "lr_range": [space.lr_low, space.lr_high],
                       "d_model_choices": list(space.d_model_choices),
                       "sampler_seed": sampler_seed}.items():
        study.set_user_attr(key, value)


def slot_results(study: optuna.Study) -> dict[int, FrozenTrial]:
    """Each slot's result: its first finished trial (COMPLETE, or FAIL because the run
    diverged), by trial number. Later finished trials of a slot (a retry, or a proposal queued
    twice) computed the same thing and are ignored."""
    done: dict[int, FrozenTrial] = {}
    for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        slot = t.user_attrs.get(SLOT)
        if slot is None or slot in done:
            continue
        if t.state == TrialState.COMPLETE or (
                t.state == TrialState.FAIL and t.user_attrs.get(OUTCOME) == DIVERGED):
            done[slot] = t
    return done
