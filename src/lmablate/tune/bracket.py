"""The full-budget bracket: the last of several ``tune.rungs``, where a study's learning rate and
width are chosen from trials at the whole of the dataset's budget.

Each learning rate trains on ``tune.bracket_seeds`` tuning seeds
(:func:`lmablate.tune.rungs.slot_seed`). Batch 1 trains the middle learning rate, one
``tune.bracket_factor`` below the first rung's best (short runs favour high ones), at two widths
(:func:`bracket_widths`); batch 2 the rung's other learning rates at the width with the lower mean
(:func:`bracket_width`); each later batch one learning rate past the end the best point sits on,
until the best has a worse point on each side (:func:`lmablate.tune.lr_minimum.next_lr`). The answer
is the minimum of a curve fitted through the points (:func:`bracket_outcome`,
:func:`lmablate.tune.lr_minimum.fit_minimum`). Pure functions of the config and the results, like
:mod:`lmablate.tune.rungs`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from lmablate.config.study import StudyConfig, TuneConfig
from lmablate.tune.lr_minimum import (OUT_OF_POINTS, Fit, Point, Uncertainty, fit_minimum, next_lr,
                                 tuning_uncertainty)
from lmablate.tune.rungs import FRACTION, Batch, best_trial, next_batch_after, plan, rung_slots
from lmablate.tune.search_space import width_ladder

WIDTH_EXPONENT = 0.25  # compute-optimal d_model ~ C^0.25 at a fixed depth (bracket_widths)


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
    below = best_trial(results, rung_slots(cfg.tune, rung - 1))
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
    at = {d: p.loss for d, p in _bracket_trials(cfg.tune, results, next_batch_after(cfg.tune, first))}
    if len(at) < 2 or not at[below] < at[scaled]:
        return scaled, at
    return below, at


def _centre(tune: TuneConfig, results: dict[int, FrozenTrial], rung: int) -> float:
    """The first batch's middle learning rate: one factor below the best lr of the rung below,
    since a share of the budget favours a higher lr than the whole (the short-horizon bias,
    Bjorck et al. 2024, "Scaling Optimal LR Across Token Horizons")."""
    return best_trial(results, rung_slots(tune, rung - 1)).params["lr"] / tune.bracket_factor


def bracket_points(tune: TuneConfig, results: dict[int, FrozenTrial], width: int,
                   before: Batch | None = None) -> list[Point]:
    """The full-budget points (:class:`lmablate.tune.lr_minimum.Point`) at ``width`` of the
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
    (:func:`lmablate.tune.lr_minimum.next_lr`), or nothing once the bracket is closed or at
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
    """What the full-budget bracket chose: the ``fit`` (:class:`lmablate.tune.lr_minimum.Fit`,
    whose ``lr`` is the answer), the ``width`` it trained past its first batch and the mean
    losses that chose it (``widths``: d_model -> loss at the first batch's middle lr, empty
    when there was one candidate), its ``points`` at that width, how it ended (``state``:
    bracketed, at the limit, or out of points) and the ``uncertainty`` of the tuned loss
    (:func:`lmablate.tune.lr_minimum.tuning_uncertainty`; None when not measurable)."""

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
