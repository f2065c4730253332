"""A variant of the study as a model: its config at a given width, and the causality pre-flight
every stage runs before its first step."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from lmablate.config.study import ConfigError, ModelConfig, StudyConfig
from lmablate.core.component_files import named_components
from lmablate.model.components import ComponentError, component_path, load_component
from lmablate.model.gpt import Position, check_causality, match_ffn_hidden


def resolve_model_config(cfg: StudyConfig, variant: str, vocab_size: int, d_model: int,
                         line_length: int = 0) -> ModelConfig:
    """The variant's model at width ``d_model`` on a dataset of ``vocab_size`` tokens (and
    arithmetic lines of ``line_length`` characters, which position coupled needs; 0: text);
    with ``study.match_params`` its FFN hidden size is adjusted so its non-embedding parameter
    count is within 2% of the baseline's.

    Raises:
        ConfigError: unknown variant, or an invalid result (e.g. width vs heads).
        ValueError: ``match_params`` cannot reach the baseline's count, or a user's component
            cannot be loaded to count it (the message names the variant).
    """
    model_cfg = cfg.model_config(variant, vocab_size, line_length, d_model=d_model)
    if model_cfg.position == "coupled" and not line_length:
        raise ConfigError(f"params: variant {variant!r} has position 'coupled', which needs an "
                          "arithmetic dataset (fixed-width lines $(a op b)=c$); this dataset "
                          "has none: drop the variant from study.variants or the dataset")
    if cfg.match_params:
        reference = cfg.model.replace(vocab_size=vocab_size, d_model=d_model)
        try:  # counts the parameters of a built model: a user's component is imported here
            model_cfg = match_ffn_hidden(model_cfg, reference)
        except ValueError as exc:  # ComponentError included: one line naming the variant
            raise ValueError(f"variant {variant!r}: {exc}") from None
    return model_cfg


def preflight(model_cfg: ModelConfig, what: str) -> None:
    """Refuse to train a model whose components break their contract
    (:func:`check_component`, a user's own only) or that can see
    future tokens (the seeds' leaked-mask bug).

    Raises:
        ValueError: a component fails its check, or the model fails
            :func:`lmablate.model.gpt.check_causality` (the message names ``what``, and the
            component and file or the leaking position).
    """
    for kind, name in named_components(model_cfg).items():
        try:
            check_component(kind, name, model_cfg)
        except ComponentError as exc:
            raise ValueError(f"{what}: {kind} {exc}") from None
    try:
        check_causality(model_cfg)
    except ValueError as exc:
        raise ValueError(f"{what}: pre-flight causality check failed: {exc}") from None


def check_component(kind: str, name: str, cfg: ModelConfig, root: Path | None = None) -> None:
    """Try component ``name`` as ``cfg``'s ``kind`` (ffn, norm or position) before any work: it
    imports and builds with ``cfg``; an FFN or a norm keeps the shape of a (2, 5, C) input,
    gives finite outputs and passes a gradient to every parameter; a position scheme subclasses
    :class:`~lmablate.model.gpt.Position`. Whether the model then sees the future is
    :func:`~lmablate.model.gpt.check_causality`'s to say.

    Raises:
        ComponentError: what failed, with the name and file.
    """
    cls = load_component(name, root)
    where = f"{name} ({component_path(name, root)})"
    if kind == "position" and not issubclass(cls, Position):
        raise ComponentError(f"{where}: a position scheme must subclass "
                             "lmablate.model.gpt.Position")
    try:
        module = cls(cfg)
    except Exception as exc:
        raise ComponentError(f"{where}: {cls.__name__}(cfg) fails: "
                             f"{type(exc).__name__}: {exc}") from None
    if kind == "position":
        return
    x = torch.randn(2, 5, cfg.d_model, requires_grad=True)
    try:
        y = module(x)
    except Exception as exc:
        raise ComponentError(f"{where}: its forward on (2, 5, {cfg.d_model}) fails: "
                             f"{type(exc).__name__}: {exc}") from None
    if not isinstance(y, torch.Tensor) or tuple(y.shape) != tuple(x.shape):
        shape = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
        raise ComponentError(f"{where}: maps (2, 5, {cfg.d_model}) to {shape}; an {kind} keeps "
                             "(B, T, C)")
    if not torch.isfinite(y).all():
        raise ComponentError(f"{where}: gives non-finite outputs on a standard normal input")
    y.square().sum().backward()
    for pname, p in module.named_parameters():
        if p.requires_grad and (p.grad is None or not math.isfinite(float(p.grad.abs().sum()))):
            raise ComponentError(f"{where}: parameter {pname} gets no finite gradient")
