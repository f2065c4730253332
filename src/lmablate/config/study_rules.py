"""The rules that span sections of ``params.yaml``, in one place: each a function of the parsed
:class:`~lmablate.config.study.StudyConfig` that raises a
:class:`~lmablate.core.validation.ConfigError` naming the key, its value and what is allowed.
A section's own keys are checked by its dataclass (:func:`~lmablate.core.validation.param`
rules); :func:`check_study` runs these after every section parsed."""

from __future__ import annotations

from typing import Callable

from lmablate.config.study import REPLICATE_SEED_STRIDE, StudyConfig
from lmablate.core.validation import ConfigError, fail, short_repr


def tuning_never_sees_a_final_seed(cfg: StudyConfig) -> None:
    """``tune.seed`` and the ``tune.bracket_seeds - 1`` seeds after it are none of
    ``study.seeds``: a final seed seen by tuning would flatter its variant."""
    tuning_seeds = range(cfg.tune.seed, cfg.tune.seed + cfg.tune.bracket_seeds)
    if any(s in cfg.seeds for s in tuning_seeds):
        fail("tune.seed", cfg.tune.seed, "must not be one of study.seeds "
             f"{short_repr(list(cfg.seeds))}, "
             f"nor the next tune.bracket_seeds={cfg.tune.bracket_seeds} - 1 seeds after it: a "
             "final seed would then have been seen by tuning")


def replicates_draw_disjoint_seeds(cfg: StudyConfig) -> None:
    """No seed, final or tuning, is drawn by two replicates (``study.replicates``,
    :meth:`~lmablate.config.study.StudyConfig.for_replicate`), and no replicate's tuning sees
    another's final seed: a replicate is a fresh draw, or it replicates nothing."""
    seen: dict[int, tuple[int, str]] = {}
    for r in range(cfg.replicates):
        rep = cfg.for_replicate(r)
        drawn = [(s, "final") for s in rep.seeds] + [
            (s, "tuning") for s in range(rep.tune.seed, rep.tune.seed + rep.tune.bracket_seeds)]
        for seed, kind in drawn:
            if seed in seen and seen[seed][0] != r:
                other, other_kind = seen[seed]
                fail("study.seeds", list(cfg.seeds),
                     f"replicate {r}'s {kind} seed {seed} is replicate {other}'s "
                     f"{other_kind} seed: replicate r adds r x {REPLICATE_SEED_STRIDE:,} to every "
                     f"seed, so study.seeds and tune.seed must span less than "
                     f"{REPLICATE_SEED_STRIDE:,}")
            seen[seed] = (r, kind)


def every_dataset_has_a_budget(cfg: StudyConfig) -> None:
    """``train.budget_flops`` names every dataset of ``study.datasets``."""
    missing = [d for d in cfg.datasets if d not in cfg.train.budget_flops]
    if missing:
        fail("train.budget_flops", cfg.train.budget_flops,
             f"give a budget for every dataset of the study (missing: {', '.join(missing)})")


def a_window_holds_a_whole_problem(cfg: StudyConfig) -> None:
    """An arithmetic dataset's lines (:attr:`~lmablate.data.arithmetic.ArithmeticFormat.
    line_length` characters) fit in its context length (its own ``context_length``, or
    ``model.context_length``)."""
    for name, ds in cfg.datasets.items():
        context = cfg.for_dataset(name).model.context_length
        if ds.kind == "arithmetic" and ds.format.line_length > context:
            key = (f"datasets.{name}.context_length={context}" if ds.context_length is not None
                   else f"model.context_length={context}")
            f = ds.format
            fail(f"datasets.{name}", {"digits": f.digits, "max_operand": f.max_operand,
                                      "decimals": f.decimals, "operations": list(f.operations),
                                      "length_digits": list(ds.length_digits)},
                 f"its problems are {f.line_length} characters (fields of {f.width}), more than "
                 f"{key} holds; fewer digits, fewer decimals, no length split or a longer "
                 "context")


def coupled_positions_need_arithmetic(cfg: StudyConfig) -> None:
    """A variant with ``position: coupled`` runs in a study of arithmetic datasets only: the
    scheme reads arithmetic lines, and text has none."""
    coupled = [v for v in cfg.study_variants
               if cfg.model_config(v, vocab_size=1).position == "coupled"]
    text = [name for name, ds in cfg.datasets.items() if ds.kind != "arithmetic"]
    if coupled and text:
        fail("study.variants", list(cfg.study_variants),
             f"{', '.join(coupled)} (position coupled) needs arithmetic datasets only; "
             f"study.datasets has {', '.join(text)}: run it in a study of arithmetic datasets "
             "(conf/profile/length.yaml)")


def every_tuned_width_suits_every_variant(cfg: StudyConfig) -> None:
    """Each of ``tune.d_model_choices`` is divisible by ``model.n_heads`` and makes a valid
    model of every variant of the study (e.g. RoPE's even head dimension)."""
    for d in cfg.tune.d_model_choices or ():
        if d % cfg.model.n_heads:
            fail("tune.d_model_choices", d,
                 f"every width must be divisible by n_heads={cfg.model.n_heads}")
    for vname in cfg.study_variants:
        for d in cfg.tune.d_model_choices or ():
            try:
                cfg.model_config(vname, vocab_size=1, d_model=d)
            except ConfigError as exc:
                raise ConfigError(f"{exc} (variant {vname} at tune.d_model_choices={d})") from None


# In the order they are checked: the first rule a study breaks is the error it gets.
STUDY_RULES: tuple[Callable[[StudyConfig], None], ...] = (
    tuning_never_sees_a_final_seed,
    replicates_draw_disjoint_seeds,
    every_dataset_has_a_budget,
    a_window_holds_a_whole_problem,
    coupled_positions_need_arithmetic,
    every_tuned_width_suits_every_variant,
)


def check_study(cfg: StudyConfig) -> StudyConfig:
    """Run every rule of :data:`STUDY_RULES` on ``cfg``; returns ``cfg``.

    Raises:
        ConfigError: the first rule ``cfg`` breaks.
    """
    for rule in STUDY_RULES:
        rule(cfg)
    return cfg
