"""The study's configuration: validated, frozen dataclasses, one per section of ``params.yaml``.

One config flows one way: :func:`lmablate.config.params.load` reads ``params.yaml`` once, each
section's dataclass rejects unknown keys, values of the wrong type and out-of-range values with a
message naming the key, and a :class:`StudyConfig` comes back. Stage
functions take these dataclasses, never the raw YAML dict. Component choices (``ffn``, ``norm``,
``position`` ...) stay strings so the config remains serialisable; ``lmablate.model.gpt`` resolves
them through explicit registries (litgpt's ``config.py`` style).

Every key of ``params.yaml`` is a :func:`~lmablate.core.validation.param` field of its section's
dataclass (:data:`SECTIONS`), the one source of its default (the default study's value:
``params.yaml`` gives every key at it, which ``tests/test_config.py`` checks), its one-line
description and the :class:`~lmablate.core.validation.Rule` that both validates it and says what is
allowed; ``docs/params_reference.py`` renders them as the params.yaml reference.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from lmablate.core.validation import (BOOLEAN, FRACTION, STRING, Rule, check_fields, choice,
                                      choice_or_component, fail, integer, number, optional,
                                      param)
# re-exported (the errors for the data modules and tests)
from lmablate.core.validation import (ConfigError, DataError, MAX_SEED, NAME_PATTERN, NAME_RULE,
                                      from_mapping)
# the datasets, runtime and train sections, re-exported: every section's config is importable from
# here
from lmablate.config.datasets import DATASET_KINDS, MAX_PROBLEMS, DatasetConfig, SplitConfig
from lmablate.config.runtime import DEVICE_CHOICES, MAX_WORKERS, PARALLEL_CHOICES, RuntimeConfig
from lmablate.config.train_config import (LR_SCHEDULE_CHOICES, MAX_BATCH, MAX_BUDGET,
                                          MAX_CONTEXT, MAX_COUNT, TrainConfig, budget_label)
from lmablate.config.tune_config import (MAX_LR, MAX_TRIALS, MAX_WIDTH, TuneConfig,
                                          distinct_ints)
from lmablate.config.replicates import (MAX_REPLICATES, REPLICATE_SEED_STRIDE,
                                        check_replicate_list, for_replicate)
from lmablate.core.fileio import absolute_sqlite_url

__all__ = [
    "ConfigError", "DataError", "MAX_SEED", "NAME_PATTERN", "NAME_RULE", "from_mapping",
    "DATASET_KINDS", "MAX_PROBLEMS", "DatasetConfig", "SplitConfig", "FFN_CHOICES", "GATED_FFNS",
    "NORM_CHOICES", "NORM_PLACEMENT_CHOICES", "POSITION_CHOICES", "DEVICE_CHOICES",
    "LR_SCHEDULE_CHOICES", "PARALLEL_CHOICES", "MAX_CONTEXT", "MAX_WIDTH", "MAX_LAYERS",
    "MAX_HEADS", "MAX_BATCH", "MAX_BUDGET", "MAX_TRIALS", "MAX_REPLICATES",
    "REPLICATE_SEED_STRIDE", "MAX_COUNT", "MAX_WORKERS", "MAX_LR",
    "StudySection", "ModelConfig", "TrainConfig", "RuntimeConfig", "TuneConfig", "EvaluateConfig",
    "TrackingConfig", "StudyConfig", "SECTIONS", "budget_label",
]

# Allowed component strings. The model's registries are keyed by exactly these names; a test
# checks that the two agree, so the config can validate without importing torch.
FFN_CHOICES = ("relu", "gelu", "swiglu", "geglu", "reglu", "glu")
GATED_FFNS = ("swiglu", "geglu", "reglu", "glu")
NORM_CHOICES = ("layernorm", "rmsnorm")
NORM_PLACEMENT_CHOICES = ("pre", "post")
POSITION_CHOICES = ("learned", "sinusoidal", "rope", "alibi", "none", "coupled")

# Upper limits, where a typo (an extra zero, 1e30 for 1e13) would exhaust memory or run for
# days before anything failed. Each is far above the posts' GPU scale
# (conf/profile/seed-scale.yaml).
MAX_LAYERS = 128
MAX_HEADS = 256


def _check_factors(key: str, value: Any) -> tuple[int, ...]:
    return distinct_ints(key, value, 64, "expected a non-empty list of whole multiples "
                                "of context_length, e.g. [1, 2, 4]", "factors must be distinct")


def _check_experiment(key: str, value: Any) -> None:
    # MLflow keeps an experiment's name in a column of 256 characters, and a longer one fails
    # inside the store with a message that blames the store
    if not isinstance(value, str) or not 1 <= len(value) <= 200:
        fail(key, value, "a string of 1 to 200 characters")


def _check_profile(key: str, value: Any) -> None:
    # the name of a file of conf/profile/ (or "default"): letters, digits, "-" and "_"
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}", value):
        fail(key, value, "a name of 1 to 64 letters, digits, '-' or '_'")


def _check_seeds(key: str, value: Any) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or not value:
        fail(key, value, "expected a non-empty list of integers")
    seed = integer(minimum=0, maximum=MAX_SEED)
    for s in value:
        seed.check(key, s)
    if len(set(value)) != len(value):
        fail(key, list(value), "seeds must be distinct")
    return tuple(value)


def _check_names(key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or not value:
        fail(key, value, "expected a non-empty list")
    twice = sorted({str(v) for v in value if list(value).count(v) > 1})
    if twice:  # a name twice would run, and count, its stages twice
        fail(key, list(value), f"each name once ({', '.join(twice)} given more than once)")
    return tuple(value)


@dataclass(frozen=True)
class StudySection:
    """The ``study`` section: which runs the study makes (:func:`lmablate.config.params.parse`
    checks that each name is defined in its section)."""

    profile: str = param("default", "the profile's name (conf/profile/<name>.yaml): a label of "
                         "the study in `dvc exp show` and the report, no setting",
                         Rule("a name of 1 to 64 letters, digits, '-' or '_'", _check_profile),
                         result=False)
    seeds: tuple[int, ...] = param(
        (0, 1, 2, 3, 4, 5), "the final runs' seeds: the same seed gives every variant the same "
        "init and data order", Rule("a non-empty list of distinct seeds, each "
                                    f"{integer(0, MAX_SEED).allowed}", _check_seeds))
    datasets: tuple[str, ...] = param(("shakespeare", "arithmetic"), "the datasets studied, in "
                                      "report order", Rule("a non-empty list of distinct names "
                                                           "of the datasets section",
                                                           _check_names))
    variants: tuple[str, ...] = param(("baseline", "swiglu", "rmsnorm", "rope"), "the variants "
                                      "studied, in report order",
                                      Rule("a non-empty list of distinct names of the variants "
                                           "section", _check_names))
    match_params: bool = param(False, "true: each variant's FFN hidden width is set so that its "
                               "non-embedding parameters equal the baseline's", BOOLEAN)
    replicates: int = param(1, "R, how many times the whole study is tuned, trained and "
                            "evaluated, each replicate on fresh tuning, sampler and final seeds "
                            "(1: the study once)", integer(1, MAX_REPLICATES))
    replicate_stages: tuple[int, ...] = param(
        (), "the replicates after the first, 1 .. replicates - 1, one DVC stage each (DVC's "
        "matrix takes a list and computes no range, so the list is written out)",
        Rule("a list of the integers 1 .. study.replicates - 1 in order, [] for one replicate",
             check_replicate_list))

    mixed_environments: bool = param(
        False, "true: train takes a best.json, and the report compares metrics.json files, "
        "computed with other numerics or another torch build than the rest of the study (the "
        "report's Findings say so); false refuses them, naming both", BOOLEAN)

    def __post_init__(self) -> None:
        check_fields(self, "study")
        expected = list(range(1, self.replicates))
        if list(self.replicate_stages) != expected:
            fail("study.replicate_stages", list(self.replicate_stages),
                 f"must be {expected} for study.replicates={self.replicates} (one stage per "
                 "replicate after the first)")


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of one GPT variant (litgpt-style: strings here, classes in ``model.py``).

    ``head_dim`` (d_model / n_heads) and ``n_query_groups`` (n_kv_heads, defaulting to n_heads) are
    derived in ``__post_init__``. ``ffn_hidden`` of ``None`` means the standard size: 4 * d_model
    for relu/gelu and, for the GLU family, 2/3 * 4 * d_model rounded *up* to a multiple of
    ``ffn_multiple_of`` (Shazeer 2020, sec. 2: keeps the parameter count of the two-matrix FFN).
    Each key's default, rule and meaning is its :func:`~lmablate.core.validation.param` field.

    Raises:
        ConfigError: unknown component string, a width not divisible by the head count, etc.
    """

    # not a key of params.yaml: 0 until the tokenizer fixes it
    vocab_size: int = field(default=0, metadata={"rule": integer(minimum=0, maximum=2**16)})
    # not a key either: characters per arithmetic line, from the dataset, for position coupled
    line_length: int = field(default=0,
                             metadata={"rule": integer(minimum=0, maximum=MAX_CONTEXT)})
    context_length: int = param(64, "tokens per training window, the span attention sees",
                                integer(maximum=MAX_CONTEXT))
    n_layers: int = param(2, "transformer blocks", integer(maximum=MAX_LAYERS))
    n_heads: int = param(4, "attention (query) heads; must divide d_model",
                         integer(maximum=MAX_HEADS))
    n_kv_heads: int | None = param(None, "key/value heads, dividing n_heads: null = n_heads "
                                   "(multi-head), fewer: grouped-query, 1: multi-query",
                                   optional(integer(maximum=MAX_HEADS)))
    d_model: int = param(64, "the width: every run replaces it with its tuned width",
                         integer(maximum=MAX_WIDTH))
    ffn: str = param("relu", "feed-forward activation; swiglu, geglu, reglu and glu are gated "
                     "(three matrices)", choice_or_component(FFN_CHOICES))
    ffn_hidden: int | None = param(None, "feed-forward hidden width; null: 4 x d_model, or "
                                   "8/3 x d_model when gated",
                                   optional(integer(maximum=4 * MAX_WIDTH)))
    ffn_multiple_of: int = param(1, "a gated FFN's standard hidden width is rounded up to a "
                                 "multiple of this", integer(maximum=MAX_WIDTH))
    norm: str = param("layernorm", "normalisation layer", choice_or_component(NORM_CHOICES))
    norm_eps: float = param(1e-5, "epsilon of every norm layer", number())
    norm_placement: str = param("pre", "norm before each sublayer (pre) or after its residual "
                                "sum (post)", choice(NORM_PLACEMENT_CHOICES))
    position: str = param("learned", "position encoding (none: causal attention alone)",
                          choice_or_component(POSITION_CHOICES))
    rope_base: float = param(10000.0, "RoPE's frequency base (position: rope only)", number())
    bias: bool = param(True, "bias vectors in the linear layers and LayerNorm", BOOLEAN)
    dropout: float = param(0.0, "dropout probability (0: none)", FRACTION)
    tie_weights: bool = param(False, "the output layer shares the token embedding's weights",
                              BOOLEAN)
    # derived
    head_dim: int = field(init=False)
    n_query_groups: int = field(init=False)

    def __post_init__(self) -> None:
        p = "model"
        check_fields(self, p)
        if self.d_model % self.n_heads:
            fail(f"{p}.d_model", self.d_model, f"must be divisible by n_heads={self.n_heads}")
        head_dim = self.d_model // self.n_heads
        if self.position == "rope" and head_dim % 2:
            fail(f"{p}.d_model", self.d_model,
                  f"rope needs an even head_dim; d_model/n_heads = {head_dim}")
        if self.position == "sinusoidal" and self.d_model % 2:
            fail(f"{p}.d_model", self.d_model, "sinusoidal positions need an even d_model")
        if self.position == "coupled" and self.line_length:  # bound to arithmetic lines
            width = (self.line_length - 6) / 3  # "$(" a op b ")=" c "$"
            if self.line_length < 9 or width != int(width):
                fail(f"{p}.line_length", self.line_length,
                     "position coupled needs lines $(a op b)=c$ of 6 + 3 x field width characters")
            if self.context_length < width + 2:
                fail(f"{p}.context_length", self.context_length,
                     f"position coupled needs at least field width + 2 = {int(width) + 2}")
        kv = self.n_heads if self.n_kv_heads is None else self.n_kv_heads
        if self.n_heads % kv:
            fail(f"{p}.n_kv_heads", kv, f"must divide n_heads={self.n_heads}")
        object.__setattr__(self, "head_dim", head_dim)
        object.__setattr__(self, "n_query_groups", kv)

    @property
    def gated(self) -> bool:
        """True for the GLU family (three FFN matrices instead of two)."""
        return self.ffn in GATED_FFNS

    @property
    def ffn_hidden_size(self) -> int:
        """Hidden width of the feed-forward (explicit, or the standard size; see class doc)."""
        if self.ffn_hidden is not None:
            return self.ffn_hidden
        if not self.gated:
            return 4 * self.d_model
        m = self.ffn_multiple_of
        return -(-(2 * 4 * self.d_model) // (3 * m)) * m  # ceil(8d/3) to a multiple of m

    def replace(self, **changes: Any) -> "ModelConfig":
        """A copy with ``changes`` applied and re-validated."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The init fields only (what ``ModelConfig(**d)`` accepts back)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.init}


@dataclass(frozen=True)
class EvaluateConfig:
    """Evaluation: test loss over up to ``max_batches`` batches; arithmetic greedy decoding of up
    to ``max_problems`` test problems, ``batch_size`` at a time; ``n_samples`` text samples of
    ``sample_tokens`` tokens each. Length extrapolation: the test loss on windows of each of
    ``extrapolation_factors`` x context_length tokens (sorted, distinct, >= 1), broken down into
    buckets of ``position_bucket`` positions (:func:`lmablate.evaluate.metrics.extrapolation`)."""

    max_batches: int = param(20, "test-loss batches per seed", integer(maximum=MAX_COUNT))
    batch_size: int = param(128, "sequences per evaluation batch (arithmetic problems decoded "
                            "at a time)", integer(maximum=MAX_BATCH))
    max_problems: int = param(1000, "arithmetic test problems decoded greedily per seed",
                              integer(maximum=MAX_PROBLEMS))
    n_samples: int = param(2, "text samples generated per seed", integer(0, 1000))
    sample_tokens: int = param(200, "tokens per text sample", integer(maximum=MAX_COUNT))
    temperature: float = param(0.8, "sampling temperature of the text samples", number())
    extrapolation_factors: tuple[int, ...] = param(
        (1, 2, 4), "test windows of these multiples of context_length (learned positions: 1 "
        "only)", Rule("a non-empty list of distinct multiples, each "
                      f"{integer(maximum=64).allowed}", _check_factors))
    position_bucket: int = param(16, "positions per bucket of the extrapolation breakdown",
                                 integer(maximum=MAX_COUNT))

    def __post_init__(self) -> None:
        check_fields(self, "evaluate")


@dataclass(frozen=True)
class TrackingConfig:
    """MLflow: ``uri`` (``MLFLOW_TRACKING_URI`` overrides it) and one ``experiment`` per study."""

    uri: str = param("sqlite:///mlflow.db", "MLflow tracking URI (env MLFLOW_TRACKING_URI "
                     "overrides it)", STRING, result=False)
    experiment: str = param("lmablate", "the MLflow experiment of the study's runs (at most "
                            "200 characters)", Rule("a string of 1 to 200 characters",
                                                    _check_experiment), result=False)
    enabled: bool = param(True, "log runs to MLflow (false: no tracking)", BOOLEAN,
                          result=False)

    def __post_init__(self) -> None:
        check_fields(self, "tracking")

    @property
    def tracking_uri(self) -> str:
        """``MLFLOW_TRACKING_URI`` or ``uri``; a relative SQLite path is taken under ``DVC_ROOT``
        where DVC sets it: ``dvc exp run --temp`` or ``--queue`` computes in a copy of the project
        under .dvc/tmp/exps, removed when done, and sets ``DVC_ROOT`` to the project itself."""
        uri = os.environ.get("MLFLOW_TRACKING_URI", self.uri)
        root = os.environ.get("DVC_ROOT")
        return (absolute_sqlite_url(uri, Path(root)) or uri) if root else uri


@dataclass(frozen=True)
class StudyConfig:
    """The whole study: which datasets x variants, on which seeds, with which settings.

    ``model`` is the baseline architecture; ``variants`` maps a variant name to the
    :class:`ModelConfig` fields it overrides. ``study_variants`` lists the variants to run.
    """

    seeds: tuple[int, ...]
    datasets: Mapping[str, DatasetConfig]
    model: ModelConfig
    variants: Mapping[str, Mapping[str, Any]]
    study_variants: tuple[str, ...]
    train: TrainConfig
    tune: TuneConfig
    evaluate: EvaluateConfig
    tracking: TrackingConfig
    runtime: RuntimeConfig = RuntimeConfig()
    match_params: bool = False
    profile: str = "default"
    replicates: int = 1
    replicate: int = 0  # which replicate this config computes (:meth:`for_replicate`)
    mixed_environments: bool = False  # study.mixed_environments

    def for_replicate(self, replicate: int) -> "StudyConfig":
        """This study as replicate ``replicate`` computes it, on its own seeds
        (:func:`lmablate.config.replicates.for_replicate`); replicate 0 is the study itself.

        Raises:
            ConfigError: not one of the study's replicates, or a seed past the largest.
        """
        return for_replicate(self, replicate)

    def dataset(self, name: str) -> DatasetConfig:
        """The config of dataset ``name``. Raises ConfigError naming the allowed datasets."""
        if name not in self.datasets:
            fail("dataset", name, f"choose one of {', '.join(self.datasets)}")
        return self.datasets[name]

    def check_variant(self, name: str) -> None:
        """Raise ConfigError unless ``name`` is a defined variant."""
        if name not in self.variants:
            fail("variant", name, f"choose one of {', '.join(self.variants)}")

    def budgets(self, dataset: str) -> tuple[float, ...]:
        """Dataset ``dataset``'s budgets in training FLOPs, increasing (see
        :meth:`TrainConfig.budgets`)."""
        return self.train.budgets(dataset)

    def headline_budget(self, dataset: str) -> float:
        """The budget the report's verdicts are drawn at: ``dataset``'s largest (its only one
        outside a scaling study), where each variant is closest to its converged loss."""
        return self.train.budgets(dataset)[-1]

    def for_dataset(self, dataset: str) -> "StudyConfig":
        """This study as a model on ``dataset`` sees it: ``model.context_length`` and
        ``train.batch_size`` replaced by the dataset's own ``context_length`` and
        ``batch_size`` where it sets them (:class:`DatasetConfig`); itself otherwise.

        Raises:
            ConfigError: ``dataset`` is not one of the study's.
        """
        ds = self.dataset(dataset)
        cfg = self
        if ds.context_length is not None:
            cfg = dataclasses.replace(cfg, model=cfg.model.replace(
                context_length=ds.context_length))
        if ds.batch_size is not None:
            cfg = dataclasses.replace(cfg, train=dataclasses.replace(
                cfg.train, batch_size=ds.batch_size))
        return cfg

    def at_budget(self, dataset: str, budget: float) -> "StudyConfig":
        """This study with ``dataset`` at one of its budgets, as a model on it sees it
        (:meth:`for_dataset`): the config every stage computes a budget's tuning, training
        and evaluation with, so that fingerprints and study names depend on that budget and
        that dataset alone.

        Raises:
            ConfigError: ``budget`` is not one of the dataset's budgets.
        """
        cfg = self.for_dataset(dataset)
        return dataclasses.replace(cfg, train=cfg.train.at_budget(dataset, budget))

    def model_config(self, variant: str, vocab_size: int, line_length: int = 0,
                     **overrides: Any) -> ModelConfig:
        """The baseline model with the variant's overrides, then ``overrides`` (tuned values),
        bound to a dataset of ``vocab_size`` tokens (and, for position coupled only, arithmetic
        lines of ``line_length`` characters: 0 for a text dataset).

        Raises:
            ConfigError: unknown variant, or the result is invalid (e.g. width vs heads, position
                coupled on a text dataset).
        """
        self.check_variant(variant)
        changes = {**self.variants[variant], **overrides, "vocab_size": vocab_size}
        if changes.get("position", self.model.position) == "coupled":
            changes["line_length"] = line_length
        return self.model.replace(**changes)


# Each section of params.yaml and the dataclass whose param() fields are its keys (variants: a
# mapping of name -> ModelConfig keys; datasets: of name -> DatasetConfig keys).
SECTIONS: dict[str, type] = {
    "study": StudySection, "datasets": DatasetConfig, "model": ModelConfig,
    "variants": ModelConfig, "train": TrainConfig, "tune": TuneConfig,
    "evaluate": EvaluateConfig, "tracking": TrackingConfig, "runtime": RuntimeConfig,
}
