"""The study's configuration: validated, frozen dataclasses, one per section of ``params.yaml``.

One config flows one way: :func:`lmablate.params.load` reads ``params.yaml`` once, each section's
dataclass rejects unknown keys, values of the wrong type and out-of-range values with a message
naming the key, and a :class:`StudyConfig` comes back. Stage
functions take these dataclasses, never the raw YAML dict. Component choices (``ffn``, ``norm``,
``position`` ...) stay strings so the config remains serialisable; ``lmablate.model`` resolves them
through explicit registries (litgpt's ``config.py`` style).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from .fingerprint import NOT_A_RESULT
from .validation import (ConfigError, check_bool, check_choice, check_fraction, check_int,
                         check_positive, check_range, check_rungs, check_str, fail, from_mapping)
from .validation import DataError  # noqa: F401 - re-exported for the data modules and tests
from .validation import MAX_SEED, NAME_PATTERN, NAME_RULE  # noqa: F401 - also re-exported
# the datasets section, re-exported: every section's config is importable from here
from .datasets import DATASET_KINDS, MAX_PROBLEMS, DatasetConfig, SplitConfig  # noqa: F401

# Allowed component strings. The model's registries are keyed by exactly these names; a test
# checks that the two agree, so the config can validate without importing torch.
FFN_CHOICES = ("relu", "gelu", "swiglu", "geglu", "reglu", "glu")
GATED_FFNS = ("swiglu", "geglu", "reglu", "glu")
NORM_CHOICES = ("layernorm", "rmsnorm")
NORM_PLACEMENT_CHOICES = ("pre", "post")
POSITION_CHOICES = ("learned", "sinusoidal", "rope", "alibi", "none")
DEVICE_CHOICES = ("auto", "cpu", "cuda", "mps")
LR_SCHEDULE_CHOICES = ("constant", "cosine")
PARALLEL_CHOICES = ("threads", "processes")

# Upper limits, where a typo (an extra zero, 1e30 for 1e13) would exhaust memory or run for
# days before anything failed. Each is far above the posts' GPU scale (profiles/seed-scale.yaml).
MAX_CONTEXT = 8192  # tokens; attention memory grows with its square
MAX_WIDTH = 8192  # d_model, ffn_hidden
MAX_LAYERS = 128
MAX_HEADS = 256
MAX_BATCH = 4096  # sequences of a training or evaluation batch
MAX_BUDGET = 1e20  # training FLOPs of one run: about 3 days of an H100 at 40% of its bf16 peak
MAX_TRIALS = 10_000  # tune.n_trials, trials_per_batch
MAX_COUNT = 1_000_000  # steps, evaluation batches, samples, reports: counts of loop iterations
MAX_WORKERS = 1024
# the largest learning rate a study may tune or extend to (tune.lr_limits)
MAX_LR = 1e8  # a guard against typos only


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of one GPT variant (litgpt-style: strings here, classes in ``model.py``).

    ``head_dim`` (d_model / n_heads) and ``n_query_groups`` (n_kv_heads, defaulting to n_heads) are
    derived in ``__post_init__``. ``ffn_hidden`` of ``None`` means the standard size: 4 * d_model
    for relu/gelu and, for the GLU family, 2/3 * 4 * d_model rounded *up* to a multiple of
    ``ffn_multiple_of`` (Shazeer 2020, sec. 2: keeps the parameter count of the two-matrix FFN).

    Raises:
        ConfigError: unknown component string, a width not divisible by the head count, etc.
    """

    vocab_size: int = 0  # 0 until the tokenizer fixes it
    context_length: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int | None = None
    d_model: int = 64
    ffn: str = "relu"
    ffn_hidden: int | None = None
    ffn_multiple_of: int = 1
    norm: str = "layernorm"
    norm_eps: float = 1e-5
    norm_placement: str = "pre"
    position: str = "learned"
    rope_base: float = 10000.0
    bias: bool = True
    dropout: float = 0.0
    tie_weights: bool = False
    # derived
    head_dim: int = field(init=False)
    n_query_groups: int = field(init=False)

    def __post_init__(self) -> None:
        p = "model"
        check_int(f"{p}.vocab_size", self.vocab_size, minimum=0, maximum=2**16)
        for key, maximum in (("context_length", MAX_CONTEXT), ("n_layers", MAX_LAYERS),
                             ("n_heads", MAX_HEADS), ("d_model", MAX_WIDTH),
                             ("ffn_multiple_of", MAX_WIDTH)):
            check_int(f"{p}.{key}", getattr(self, key), maximum=maximum)
        check_choice(f"{p}.ffn", self.ffn, FFN_CHOICES)
        check_choice(f"{p}.norm", self.norm, NORM_CHOICES)
        check_choice(f"{p}.norm_placement", self.norm_placement, NORM_PLACEMENT_CHOICES)
        check_choice(f"{p}.position", self.position, POSITION_CHOICES)
        check_positive(f"{p}.norm_eps", self.norm_eps)
        check_positive(f"{p}.rope_base", self.rope_base)
        check_bool(f"{p}.bias", self.bias)
        check_bool(f"{p}.tie_weights", self.tie_weights)
        check_fraction(f"{p}.dropout", self.dropout)
        if self.d_model % self.n_heads:
            fail(f"{p}.d_model", self.d_model, f"must be divisible by n_heads={self.n_heads}")
        head_dim = self.d_model // self.n_heads
        if self.position == "rope" and head_dim % 2:
            fail(f"{p}.d_model", self.d_model,
                  f"rope needs an even head_dim; d_model/n_heads = {head_dim}")
        if self.position == "sinusoidal" and self.d_model % 2:
            fail(f"{p}.d_model", self.d_model, "sinusoidal positions need an even d_model")
        kv = self.n_heads if self.n_kv_heads is None else self.n_kv_heads
        check_int(f"{p}.n_kv_heads", kv, maximum=MAX_HEADS)
        if self.n_heads % kv:
            fail(f"{p}.n_kv_heads", kv, f"must divide n_heads={self.n_heads}")
        if self.ffn_hidden is not None:
            check_int(f"{p}.ffn_hidden", self.ffn_hidden, maximum=4 * MAX_WIDTH)
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
class TrainConfig:
    """Optimisation of one run at equal training compute.

    ``budget_flops`` maps each dataset to the training FLOPs every final run of that dataset
    spends (:mod:`lmablate.budget` turns it into a step count for the run's own width:
    budget / (``flops_per_token`` x ``batch_size`` x ``context_length``)). A step is one
    optimizer step of ``batch_size`` sequences; ``warmup_fraction`` is the share of a run's
    steps over which the learning rate ramps up (so a tuning trial of a quarter of the budget
    warms up over a quarter of the steps, and every run's schedule has the same shape),
    ``eval_interval`` is in steps, ``eval_iters`` in batches per estimate. Every field changes what a run computes;
    settings that only change how fast it is computed live in :class:`RuntimeConfig`.
    """

    budget_flops: Mapping[str, float] = field(default_factory=dict)
    batch_size: int = 16
    lr: float = 3e-4
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0
    warmup_fraction: float = 0.0
    lr_schedule: str = "cosine"
    eval_interval: int = 50
    eval_iters: int = 10

    def __post_init__(self) -> None:
        # may be empty here (a library caller passes steps itself); parse() requires a budget
        # for every dataset of the study
        if not isinstance(self.budget_flops, Mapping):
            fail("train.budget_flops", self.budget_flops,
                 "expected a mapping of dataset name -> training FLOPs per run (e.g. 1.0e+12)")
        for name, flops in self.budget_flops.items():
            check_positive(f"train.budget_flops.{name}", flops, maximum=MAX_BUDGET)
        object.__setattr__(self, "budget_flops", dict(self.budget_flops))
        check_int("train.batch_size", self.batch_size, maximum=MAX_BATCH)
        for key in ("eval_interval", "eval_iters"):
            check_int(f"train.{key}", getattr(self, key), maximum=MAX_COUNT)
        # at most half: the loss a tuning trial is judged on then comes after its warm-up
        check_positive("train.warmup_fraction", self.warmup_fraction, allow_zero=True,
                       maximum=0.5)
        check_positive("train.lr", self.lr)
        check_positive("train.weight_decay", self.weight_decay, allow_zero=True)
        check_positive("train.grad_clip", self.grad_clip, allow_zero=True)
        for key in ("beta1", "beta2"):
            check_fraction(f"train.{key}", getattr(self, key))
        check_choice("train.lr_schedule", self.lr_schedule, LR_SCHEDULE_CHOICES)

    def for_dataset(self, name: str) -> "TrainConfig":
        """These settings with only dataset ``name``'s budget: what a run on ``name`` depends on,
        so that another dataset's budget never enters its fingerprint.

        Raises:
            ConfigError: ``name`` has no budget.
        """
        if name not in self.budget_flops:
            fail("train.budget_flops", dict(self.budget_flops), f"no budget for dataset {name!r}")
        return dataclasses.replace(self, budget_flops={name: self.budget_flops[name]})

    def warmup_steps(self, steps: int) -> int:
        """Warm-up steps of a run of ``steps`` steps: ``warmup_fraction`` of them, rounded up (at
        least one when the fraction is not 0), and fewer than ``steps``."""
        if self.warmup_fraction == 0 or steps <= 1:
            return 0
        return min(steps - 1, max(1, math.ceil(self.warmup_fraction * steps)))


@dataclass(frozen=True)
class RuntimeConfig:
    """Where and how concurrently the stages compute: never part of a fingerprint.

    ``workers`` concurrent seeds / Optuna trials on a CPU (0 = auto, see
    :mod:`lmablate.parallel`; each computes with one intra-op thread, as more would change the
    last bits of results), ``parallel`` whether workers are threads of the stage or spawned
    processes. ``tests/test_parallel.py`` shows these give bit-identical results. ``device`` picks
    the hardware (``auto``: CUDA, then MPS, then CPU); the device *type* a run resolved to is
    recorded with its result and enters its fingerprint, since bf16 autocast on CUDA computes
    other numbers than fp32 on a CPU.
    """

    device: str = field(default="auto", metadata=NOT_A_RESULT)
    workers: int = field(default=0, metadata=NOT_A_RESULT)
    parallel: str = field(default="threads", metadata=NOT_A_RESULT)

    def __post_init__(self) -> None:
        check_int("runtime.workers", self.workers, minimum=0, maximum=MAX_WORKERS)
        check_choice("runtime.device", self.device, DEVICE_CHOICES)
        check_choice("runtime.parallel", self.parallel, PARALLEL_CHOICES)


@dataclass(frozen=True)
class TuneConfig:
    """Optuna search per dataset x variant over the learning rate and ``d_model``, by successive
    halving (Jamieson & Talwalkar 2016; Li et al. 2018) at equal compute; the protocol is
    :mod:`lmablate.tuning`'s.

    ``rungs``: [trials, share of the budget] from the lowest rung up; the best trials of a rung,
    as many as the next has, train again from scratch on its share, up to the last rung at the
    full budget (1.0), whose best is the answer. Trials train on seed ``seed`` (not a final
    seed), report their validation loss ``reports`` times, and the first rung's train at least
    ``min_steps`` steps. The first rung is proposed ``trials_per_batch`` at a time: first the
    same learning-rate sweep for every variant (shifted by ``sampler_seed``), then TPE
    (Bergstra et al. 2011) with each study's own seed.

    Search space: the learning rate log-uniform in [``lr_low``, ``lr_high``]; the widths
    ``d_model_choices``, or when null ``n_widths`` widths with ``tokens_per_parameter`` training
    tokens per non-embedding parameter at the budget (Hoffmann et al. 2022: about 20 is
    compute-optimal). An edge extends the search: the learning rate by 10x within
    ``lr_limits``, a derived width by a step within ``tokens_per_parameter_limits``.

    ``storage`` is an Optuna storage URL (``sqlite:///optuna.db``, ``postgresql://...``); the
    environment variable ``LMABLATE_OPTUNA_STORAGE`` overrides it.
    """

    rungs: tuple[tuple[int, float], ...] = ((12, 0.125), (2, 1.0))
    trials_per_batch: int = 4
    reports: int = 8
    seed: int = 1000
    lr_low: float = 1e-3
    lr_high: float = 1e-1
    lr_limits: tuple[float, ...] = (1e-5, 1.0)
    d_model_choices: tuple[int, ...] | None = None
    tokens_per_parameter: tuple[float, ...] = (5.0, 80.0)
    tokens_per_parameter_limits: tuple[float, ...] = (2.0, 200.0)
    n_widths: int = 4
    min_steps: int = 30
    storage: str = field(default="sqlite:///optuna.db", metadata=NOT_A_RESULT)
    sampler_seed: int = 0
    # a trial silent for 4 heartbeats is failed and retried
    heartbeat_seconds: int = field(default=10, metadata=NOT_A_RESULT)

    def __post_init__(self) -> None:
        check_int("tune.trials_per_batch", self.trials_per_batch, maximum=MAX_TRIALS)
        object.__setattr__(self, "rungs", check_rungs("tune.rungs", self.rungs, MAX_TRIALS))
        check_int("tune.reports", self.reports, maximum=MAX_COUNT)
        check_int("tune.min_steps", self.min_steps, maximum=MAX_COUNT)
        check_int("tune.n_widths", self.n_widths, maximum=64)
        check_int("tune.heartbeat_seconds", self.heartbeat_seconds, maximum=3600)
        check_int("tune.seed", self.seed, minimum=0, maximum=MAX_SEED)
        check_int("tune.sampler_seed", self.sampler_seed, minimum=0, maximum=MAX_SEED)
        check_positive("tune.lr_low", self.lr_low)
        check_positive("tune.lr_high", self.lr_high)
        if self.lr_low >= self.lr_high:
            fail("tune.lr_low", self.lr_low, f"must be below tune.lr_high={self.lr_high}")
        check_range("tune.lr_limits", self.lr_limits, MAX_LR)
        lo, hi = self.lr_limits
        if not lo <= self.lr_low < self.lr_high <= hi:
            fail("tune.lr_limits", list(self.lr_limits), f"must contain [tune.lr_low, "
                 f"tune.lr_high] = [{self.lr_low:g}, {self.lr_high:g}]")
        check_range("tune.tokens_per_parameter", self.tokens_per_parameter, 1e6)
        check_range("tune.tokens_per_parameter_limits", self.tokens_per_parameter_limits, 1e6)
        lo, hi = self.tokens_per_parameter_limits
        if not lo <= self.tokens_per_parameter[0] < self.tokens_per_parameter[1] <= hi:
            fail("tune.tokens_per_parameter_limits", list(self.tokens_per_parameter_limits),
                 f"must contain tune.tokens_per_parameter={list(self.tokens_per_parameter)}")
        for key in ("lr_limits", "tokens_per_parameter", "tokens_per_parameter_limits"):
            object.__setattr__(self, key, tuple(getattr(self, key)))
        if self.d_model_choices is not None:
            if not self.d_model_choices:
                fail("tune.d_model_choices", list(self.d_model_choices),
                     "expected a non-empty list, or null to derive the widths from the budget")
            for d in self.d_model_choices:
                check_int("tune.d_model_choices", d, maximum=MAX_WIDTH)
            if len(set(self.d_model_choices)) != len(self.d_model_choices):
                fail("tune.d_model_choices", list(self.d_model_choices),
                     "widths must be distinct")
            object.__setattr__(self, "d_model_choices", tuple(sorted(self.d_model_choices)))
        check_str("tune.storage", self.storage)

    @property
    def storage_url(self) -> str:
        return os.environ.get("LMABLATE_OPTUNA_STORAGE", self.storage)

    @property
    def n_trials(self) -> int:
        """Configurations tried at the first rung."""
        return self.rungs[0][0]

    @property
    def budget_fraction(self) -> float:
        """The first rung's share of the budget: the shortest trials."""
        return self.rungs[0][1]


@dataclass(frozen=True)
class EvaluateConfig:
    """Evaluation: test loss over up to ``max_batches`` batches; arithmetic greedy decoding of up
    to ``max_problems`` test problems, ``batch_size`` at a time; ``n_samples`` text samples of
    ``sample_tokens`` tokens each. Length extrapolation: the test loss on windows of each of
    ``extrapolation_factors`` x context_length tokens (sorted, distinct, >= 1), broken down into
    buckets of ``position_bucket`` positions (:func:`lmablate.evaluation.extrapolation`)."""

    max_batches: int = 50
    batch_size: int = 256
    max_problems: int = 2000
    n_samples: int = 3
    sample_tokens: int = 300
    temperature: float = 0.8
    extrapolation_factors: tuple[int, ...] = (1, 2, 4)
    position_bucket: int = 16

    def __post_init__(self) -> None:
        for key in ("max_batches", "sample_tokens", "position_bucket"):
            check_int(f"evaluate.{key}", getattr(self, key), maximum=MAX_COUNT)
        check_int("evaluate.batch_size", self.batch_size, maximum=MAX_BATCH)
        check_int("evaluate.max_problems", self.max_problems, maximum=MAX_PROBLEMS)
        check_int("evaluate.n_samples", self.n_samples, minimum=0, maximum=1000)
        check_positive("evaluate.temperature", self.temperature)
        factors = self.extrapolation_factors
        if not isinstance(factors, (list, tuple)) or not factors:
            fail("evaluate.extrapolation_factors", factors,
                 "expected a non-empty list of whole multiples of context_length, e.g. [1, 2, 4]")
        for f in factors:
            check_int("evaluate.extrapolation_factors", f, maximum=64)
        if len(set(factors)) != len(factors):
            fail("evaluate.extrapolation_factors", list(factors), "factors must be distinct")
        object.__setattr__(self, "extrapolation_factors", tuple(sorted(factors)))


@dataclass(frozen=True)
class TrackingConfig:
    """MLflow: ``uri`` (``MLFLOW_TRACKING_URI`` overrides it) and one ``experiment`` per study."""

    uri: str = "sqlite:///mlflow.db"
    experiment: str = "lmablate"
    enabled: bool = True

    def __post_init__(self) -> None:
        check_str("tracking.uri", self.uri)
        check_str("tracking.experiment", self.experiment)
        check_bool("tracking.enabled", self.enabled)

    @property
    def tracking_uri(self) -> str:
        return os.environ.get("MLFLOW_TRACKING_URI", self.uri)


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

    def dataset(self, name: str) -> DatasetConfig:
        """The config of dataset ``name``. Raises ConfigError naming the allowed datasets."""
        if name not in self.datasets:
            fail("dataset", name, f"choose one of {', '.join(self.datasets)}")
        return self.datasets[name]

    def check_variant(self, name: str) -> None:
        """Raise ConfigError unless ``name`` is a defined variant."""
        if name not in self.variants:
            fail("variant", name, f"choose one of {', '.join(self.variants)}")

    def model_config(self, variant: str, vocab_size: int, **overrides: Any) -> ModelConfig:
        """The baseline model with the variant's overrides, then ``overrides`` (tuned values).

        Raises:
            ConfigError: unknown variant, or the result is invalid (e.g. width vs heads).
        """
        self.check_variant(variant)
        changes = {**self.variants[variant], **overrides, "vocab_size": vocab_size}
        return self.model.replace(**changes)
