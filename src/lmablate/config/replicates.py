"""Replicates of a study (``study.replicates``): how replicate r draws its seeds, and the checks
of the two keys that set them."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from lmablate.core.validation import MAX_SEED, fail, integer

if TYPE_CHECKING:
    from lmablate.config.study import StudyConfig

MAX_REPLICATES = 16  # study.replicates: each is the whole study's compute again
# Replicate r of a study adds r x REPLICATE_SEED_STRIDE to every final and tuning seed and r to
# the sampler seed: a fresh draw of everything random, and the same draw on every machine.
REPLICATE_SEED_STRIDE = 100_000


def check_replicate_list(key: str, value: Any) -> tuple[int, ...]:
    """``study.replicate_stages`` as a tuple, each element one of 1 .. MAX_REPLICATES - 1 (the
    study section checks that it is exactly 1 .. replicates - 1).

    Raises:
        ConfigError: not a list, or an element out of range (naming ``key``).
    """
    if not isinstance(value, (list, tuple)):
        fail(key, value, "expected a list of integers, [] for one replicate")
    element = integer(1, MAX_REPLICATES - 1)
    for v in value:
        element.check(key, v)
    return tuple(value)


def for_replicate(cfg: "StudyConfig", replicate: int) -> "StudyConfig":
    """``cfg`` as replicate ``replicate`` computes it: every final seed and the tuning seed
    plus ``replicate`` x :data:`REPLICATE_SEED_STRIDE`, the sampler seed plus ``replicate``;
    replicate 0 is ``cfg`` itself (the same object).

    Raises:
        ConfigError: ``replicate`` is not one of 0 .. ``cfg.replicates`` - 1, or a shifted seed
            (final, tuning or sampler) exceeds :data:`~lmablate.core.validation.MAX_SEED`: the
            message names ``study.replicates``, checked before any shifted value is built.
    """
    if not isinstance(replicate, int) or not 0 <= replicate < cfg.replicates:
        fail("--replicate", replicate, f"a replicate of the study, 0 .. study.replicates - 1"
             f" = {cfg.replicates - 1}")
    if replicate == 0:
        return cfg
    shift = replicate * REPLICATE_SEED_STRIDE
    seeds = tuple(s + shift for s in cfg.seeds)
    tune_seed, sampler_seed = cfg.tune.seed + shift, cfg.tune.sampler_seed + replicate
    highest = max(*seeds, tune_seed + cfg.tune.bracket_seeds - 1, sampler_seed)
    if highest > MAX_SEED:
        fail("study.replicates", cfg.replicates, f"replicate {replicate} would draw seed "
             f"{highest:,}, above {MAX_SEED:,}; lower study.seeds, tune.seed or "
             "tune.sampler_seed")
    tune = dataclasses.replace(cfg.tune, seed=tune_seed, sampler_seed=sampler_seed)
    return dataclasses.replace(cfg, seeds=seeds, tune=tune, replicate=replicate)
