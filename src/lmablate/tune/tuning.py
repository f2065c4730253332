"""The tuning protocol: what a study proposes next, what it chose, and its place in the storage,
deterministic at any number of workers.

One study per dataset x variant (and per re-tuning replicate). Every decision is a pure
function of the config and the results of the study's earlier batches, spread over small
modules: :mod:`lmablate.tune.rungs` (slots, batches, promotions), :mod:`lmablate.tune.
search_space` (the first rung's learning rates and widths, grown past an edge),
:mod:`lmablate.tune.bracket` (the full-budget bracket, where the choice is made) and this one
(:func:`propose`: the shared first design, then TPE). :mod:`lmablate.tune.trials` only trains the
trials they ask for, and :mod:`lmablate.stages.tune` records them. Why rungs train from scratch,
why the variants share a first design and how the result stays deterministic: the handbook's
Study design, "Tuning"."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import warnings
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from lmablate.config.study import StudyConfig, TrainConfig, TuneConfig
from lmablate.core.fingerprint import RUN_CODE, code_version, component_code, fingerprint
from lmablate.evaluate.answer_probe import objective_name
from lmablate.tune.bracket import bracket_proposals, bracket_widths
from lmablate.tune.rungs import (DIVERGED, OUTCOME, SLOT, Batch, best_trial, is_bracket, plan,
                            promote)
from lmablate.tune.search_space import (SearchSpace, initial_space, space_for_batch,
                                   tokens_per_parameter)

# The code that decides a trial's result: the training code (RUN_CODE), the tuning package and
# the stage that runs it.
TUNE_CODE = RUN_CODE + ("tune", "stages/tune.py")
optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


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


def next_batch(cfg: StudyConfig, dataset: str, variant: str, results: dict[int, FrozenTrial],
               sampler_seed: int) -> tuple[Batch, dict[int, dict[str, Any]]] | None:
    """The first batch with a proposed slot that has no result, with its proposals; None when
    the study is done."""
    for batch in plan(cfg.tune):
        params = propose(cfg, dataset, variant, results, batch, sampler_seed)
        if any(s not in results for s in params):
            return batch, params
    return None


def runs_alongside(cfg: StudyConfig, dataset: str, results: dict[int, FrozenTrial],
                   batch: Batch) -> tuple[Batch, dict[int, dict[str, Any]]] | None:
    """The batch that may train at the same time as ``batch``, with its proposals, or None.

    That is the bracket's second batch, when ``batch`` is its first and both of its widths are
    one (:func:`lmablate.tune.bracket.bracket_widths`): the first batch then trains a single
    learning rate, and the second batch's learning rates and width do not depend on its result,
    so they are the proposals :func:`next_batch` would make after it. Run together, the bracket's
    first learning rates fill the cores instead of one trial training alone; every trial and
    result is the same (a pure function of the results before ``batch``)."""
    tune = cfg.tune
    bracket = [b for b in plan(tune) if is_bracket(tune, b.rung)]
    if len(bracket) < 2 or batch.index != bracket[0].index or tune.rungs[batch.rung][0] < 2:
        return None
    widths = bracket_widths(cfg, dataset, results, batch.rung)
    if widths is None or widths[0] != widths[1]:
        return None
    params = bracket_proposals(cfg, dataset, results, bracket[1])
    return (bracket[1], params) if any(s not in results for s in params) else None


# ------------------------------------------------------------------------------------ result


def study_objective(cfg: StudyConfig, dataset: str) -> str:
    """The name of ``dataset``'s tuning objective (:func:`lmablate.evaluate.answer_probe.
    objective_name`, with ``tune.arithmetic_objective``)."""
    return objective_name(cfg.dataset(dataset).kind, cfg.tune.arithmetic_objective)


def trial_value(objective: str, reports: dict[int, float], final: float) -> float:
    """A trial's value: ``final`` (the objective at its last evaluation), or for
    ``val_answer_loss_mean`` the mean of its ``reports`` (report index -> answer loss, nats per
    answer character), in index order: evaluations at equal shares of the trial's compute, so
    the mean is the area under its answer-loss curve per unit of compute. A seed that learns
    late and one that never learns then differ by how far their curves fell, where the final
    losses of one learning rate jump between ~0 and ~1 from seed to seed."""
    if objective != "val_answer_loss_mean" or not reports:
        return final
    return math.fsum(reports[k] for k in sorted(reports)) / len(reports)




def chosen(tune: TuneConfig, results: dict[int, FrozenTrial]) -> FrozenTrial | None:
    """The study's answer: the best completed trial of the highest rung that has one (the full
    budget unless every trial there diverged); None when no trial completed."""
    for batch in reversed(plan(tune)):
        rung = [b for b in plan(tune) if b.rung == batch.rung]
        best = best_trial(results, range(rung[0].slots.start, rung[-1].slots.stop))
        if best is not None:
            return best
    return None


# ----------------------------------------------------------------------- study in the storage


def trial_train_config(cfg: StudyConfig, dataset: str, steps: int) -> TrainConfig:
    """The training settings of a trial of ``steps`` steps on ``dataset``: ``train`` with a
    validation loss every ``steps / tune.reports`` steps (recorded, for the curves)."""
    return dataclasses.replace(cfg.for_dataset(dataset).train.for_dataset(dataset),
                               eval_interval=max(1, steps // cfg.tune.reports))


def study_name(cfg: StudyConfig, dataset: str, variant: str, data_fingerprint: str,
               sampler_seed: int, numerics: str) -> str:
    """``<dataset>-<variant>-<fingerprint>``. The fingerprint (:func:`lmablate.core.fingerprint`)
    covers every input of the objective: the dataset, the baseline model and the variant's
    overrides, the training settings with the dataset's budget, the tune settings (with
    ``sampler_seed``, which a re-tuning replaces), ``study.match_params``, the code of
    :data:`TUNE_CODE`, the training data and the numerics the trials compute with
    (:func:`lmablate.train.numerics.numerics_kind`, e.g. ``cpu AVX512 numerics 6f1286420fc4``). So
    an edit of ``model.py`` starts a new study instead of returning trials trained by the old code,
    and machines with other kernels sharing one storage never mix their trials. A variant with a
    user's component adds its files' sha256 (:func:`lmablate.core.fingerprint.component_code`;
    nothing for a built-in), so an edited component starts a new study too."""
    # a trial validates tune.reports times, whatever train.eval_interval says
    train = dataclasses.replace(cfg.train.for_dataset(dataset), eval_interval=1)
    fp = fingerprint(cfg.dataset(dataset), cfg.model, cfg.variants[variant], train,
                     dataclasses.replace(cfg.tune, sampler_seed=sampler_seed), cfg.match_params,
                     code_version(TUNE_CODE), data_fingerprint, numerics,
                     *component_code(cfg.model, cfg.variants[variant]))
    return f"{dataset}-{variant}-{fp}"


def describe_study(study: optuna.Study, cfg: StudyConfig, dataset: str, variant: str,
                   sampler_seed: int) -> None:
    """Name the objective (:func:`lmablate.evaluate.answer_probe.objective_name`: ``val_loss`` in
    nats/char, or an arithmetic dataset's ``val_answer_loss``) and record what the study
    tunes as its user attributes: dataset, variant, the dataset's budget (FLOPs), the rungs
    (trials, share of the budget), the initial search space and the sampler seed, so that the
    storage alone
    (optuna-dashboard, a PostgreSQL shared by workers) says what a study is. Setting them again
    writes the same values; nothing here changes a trial."""
    with warnings.catch_warnings():  # set_metric_names is marked experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names([study_objective(cfg, dataset)])
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
