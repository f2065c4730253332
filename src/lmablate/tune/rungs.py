"""Rungs, slots and batches of a tuning study: where each trial sits, what share of the budget
it trains, on which seed, and which trials a rung promotes.

Successive halving (``tune.rungs``; Jamieson & Talwalkar 2016, Li et al. 2018): the first
rung's configurations train its share of the dataset's budget, the best of them train again on
the next rung's share, and so on up to the full budget. Trials are numbered by slot, rung by
rung; the first rung is proposed ``tune.trials_per_batch`` at a time, each later rung below the
full budget is one batch of promotions (:func:`promote`), and the last of several rungs is the
full-budget bracket (:mod:`lmablate.tune.bracket`). A batch is computed from the results of earlier
batches only, in slot order, so the same history gives the same batch, whoever computes it and
whenever. Pure functions of ``tune`` and the results (no storage, no training).
"""

from __future__ import annotations

from dataclasses import dataclass

from optuna.trial import FrozenTrial, TrialState

from lmablate.config.study import TuneConfig

SLOT = "slot"  # user attribute: the trial's place in the study (0 .. n_slots - 1)
RUNG = "rung"  # user attribute: the rung of the trial's slot
FRACTION = "budget_fraction"  # user attribute: the share of the budget the trial trains
OUTCOME = "outcome"  # user attribute "diverged": a FAIL that is a result, not a lost worker
DIVERGED = "diverged"
TRIAL_SEED = "seed"  # user attribute: the trial's training seed (tune.seed + k in the bracket)


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
    (:func:`lmablate.tune.bracket.bracket_proposals`), each learning rate on ``tune.bracket_seeds``
    slots: a batch of its middle learning rate at two widths, a batch of its other learning rates,
    then up to ``tune.bracket_points`` minus its learning rates extension batches of one learning
    rate, which stay empty once the bracket is closed."""
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



def best_trial(results: dict[int, FrozenTrial], slots: range) -> FrozenTrial | None:
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


def rung_slots(tune: TuneConfig, rung: int) -> range:
    """The slots of every batch of ``rung``."""
    batches = [b for b in plan(tune) if b.rung == rung]
    return range(batches[0].slots.start, batches[-1].slots.stop)


def next_batch_after(tune: TuneConfig, batch: Batch) -> Batch | None:
    """The batch after ``batch`` in :func:`plan`; None after the last."""
    batches = plan(tune)
    return batches[batch.index + 1] if batch.index + 1 < len(batches) else None
