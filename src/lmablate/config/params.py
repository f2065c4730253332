"""``params.yaml`` -> :class:`~lmablate.config.study.StudyConfig`: the file read strictly, its
sections validated (each by its dataclass in :mod:`lmablate.config.study`), then the rules that
span sections (:mod:`lmablate.config.study_rules`: every dataset has a budget, the tuning seed is
no final seed, every tuned width suits every variant).

YAML is read with a loader that refuses a key given twice (PyYAML keeps the last value without
a word), and every error is one line naming the file, the key or the line.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import os
from pathlib import Path
from typing import Any, Mapping

import yaml

from lmablate.config.datasets import DATASET_KINDS as KINDS
from lmablate.config.study import (NAME_PATTERN, NAME_RULE, SECTIONS, DatasetConfig, EvaluateConfig,
                             ModelConfig, RuntimeConfig, StudyConfig, StudySection, TrackingConfig,
                             TrainConfig, TuneConfig)
from lmablate.config.study_rules import check_study
from lmablate.core.validation import (ConfigError, check_types, fail, from_mapping, is_param,
                                 short_repr)

TOP_LEVEL_KEYS = ("study", "datasets", "model", "variants", "train", "tune", "evaluate", "tracking",
                  "runtime")


def parse(raw: Mapping[str, Any]) -> StudyConfig:
    """Validate a parsed ``params.yaml`` mapping and return the study config: each section by
    its dataclass, then the rules across sections (:func:`~lmablate.config.study_rules.
    check_study`).

    Raises:
        ConfigError: unknown key at any level, wrong type, out-of-range value, unknown variant or
            component, heads not dividing width, empty seed list, ... (message names the key).
    """
    if not isinstance(raw, Mapping):
        raise ConfigError("params: the file must hold a mapping of sections")
    unknown = sorted(set(raw) - set(TOP_LEVEL_KEYS), key=str)
    if unknown:
        raise ConfigError(f"params: unknown key {unknown[0]}; allowed: {', '.join(TOP_LEVEL_KEYS)}")
    study = _study_section(raw.get("study") or {})
    datasets = _datasets(raw.get("datasets") or {})
    model = from_mapping(ModelConfig, raw.get("model"), "model")
    variants = _variants(raw.get("variants") or {}, model)

    def names(key: str, pool: Mapping[str, Any]) -> tuple[str, ...]:
        chosen = getattr(study, key)
        for n in chosen:
            if n not in pool:
                fail(f"study.{key}", n, f"choose from {', '.join(pool)}")
        return chosen

    study_datasets = names("datasets", datasets)
    cfg = StudyConfig(
        seeds=study.seeds,
        datasets={n: datasets[n] for n in study_datasets},
        model=model,
        variants=variants,
        study_variants=names("variants", variants),
        train=from_mapping(TrainConfig, raw.get("train"), "train"),
        tune=from_mapping(TuneConfig, raw.get("tune"), "tune"),
        evaluate=from_mapping(EvaluateConfig, raw.get("evaluate"), "evaluate"),
        tracking=from_mapping(TrackingConfig, raw.get("tracking"), "tracking"),
        runtime=from_mapping(RuntimeConfig, raw.get("runtime"), "runtime"),
        match_params=study.match_params,
        profile=study.profile,
        replicates=study.replicates,
        mixed_environments=study.mixed_environments,
    )
    return check_study(cfg)


def _study_section(study: Any) -> StudySection:
    if not isinstance(study, Mapping):
        fail("study", study, "expected a mapping of profile, seeds, datasets, variants, "
             "match_params, replicates, replicate_stages, mixed_environments")
    allowed_study = sorted(f.name for f in dataclasses.fields(StudySection))
    bad = sorted(set(study) - set(allowed_study), key=str)
    if bad:
        raise ConfigError(f"params: unknown key study.{bad[0]}; allowed: {', '.join(allowed_study)}")
    return StudySection(**study)


def _datasets(raw_datasets: Any) -> dict[str, DatasetConfig]:
    """Every dataset entry, by name; a key of the other kind of dataset is an error (it would be
    ignored)."""
    if not isinstance(raw_datasets, Mapping) or not raw_datasets:
        fail("datasets", raw_datasets, "expected a mapping of dataset name -> settings")
    for name, spec in raw_datasets.items():
        if spec is not None and not isinstance(spec, Mapping):
            fail(f"datasets.{name}", spec, "expected a mapping of the dataset's settings")
        kind = (spec or {}).get("kind")
        for f in dataclasses.fields(DatasetConfig):
            if f.name in (spec or {}) and f.metadata.get("kind", kind) != kind and kind in KINDS:
                own = sorted(g.name for g in dataclasses.fields(DatasetConfig)
                             if is_param(g) and g.metadata.get("kind", kind) == kind)
                raise ConfigError(f"params: datasets.{name}.{f.name} is a key of "
                                  f"{f.metadata['kind']} datasets; a {kind} dataset takes "
                                  f"{', '.join(own)}")
    return {name: from_mapping(DatasetConfig, spec, f"datasets.{name}", name=name)
            for name, spec in raw_datasets.items()}


def _variants(variants: Any, model: ModelConfig) -> dict[str, dict[str, Any]]:
    """Every variant's model overrides, by name: keys of ``model`` other than the width, each
    making a valid model from the baseline."""
    if not isinstance(variants, Mapping):
        fail("variants", variants, "expected a mapping of variant name -> model overrides")
    model_keys = set(model.to_dict()) - {"vocab_size"}
    for vname, overrides in variants.items():
        if not isinstance(vname, str) or not NAME_PATTERN.fullmatch(vname):
            fail("variants", vname, f"a variant needs {NAME_RULE}")
        overrides = overrides or {}
        if not isinstance(overrides, Mapping):
            fail(f"variants.{vname}", overrides, "expected a mapping of model overrides")
        bad = sorted(set(overrides) - model_keys, key=str)
        if bad:
            raise ConfigError(f"params: unknown key variants.{vname}.{bad[0]}; allowed: "
                              f"{', '.join(sorted(model_keys))}")
        if "d_model" in overrides:
            # the tuner sets every variant's width: an override would be replaced without a word
            fail(f"variants.{vname}.d_model", overrides["d_model"],
                 "the width is tuned for every variant from tune.d_model_choices (give that a "
                 "single value to fix it)")
        check_types(ModelConfig, overrides, f"variants.{vname}")
        try:
            model.replace(**overrides)
        except ConfigError as exc:
            raise ConfigError(f"{exc} (in variants.{vname})") from None
    return {k: dict(v or {}) for k, v in variants.items()}


def load(path: str | os.PathLike = "params.yaml") -> StudyConfig:
    """Read and validate ``params.yaml``.

    Raises:
        ConfigError: the file is missing, is not YAML, or fails validation (see :func:`parse`).
    """
    return parse(read(path))


def defaults_taken(raw: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The keys a parsed params file leaves to their defaults, each as ``(key, default)`` (the
    value written as in errors, shortened), in section and field order: of the ``study`` section, of
    every settings section and of each dataset entry (the keys of its kind). A file that gives
    every key, as ``params.yaml`` does, gives an empty list. Call after :func:`parse` succeeded.
    """
    out = []
    for section in ("study", *TOP_LEVEL_KEYS[4:]):
        given = raw.get(section) or {}
        out += [(f"{section}.{f.name}", _shown(_default(f))) for f in dataclasses.fields(
            SECTIONS[section]) if is_param(f) and f.name not in given]
    for name, spec in (raw.get("datasets") or {}).items():
        spec = spec or {}
        out += [(f"datasets.{name}.{f.name}", _shown(_default(f)))
                for f in dataclasses.fields(DatasetConfig)
                if is_param(f) and f.metadata.get("kind", spec.get("kind")) == spec.get("kind")
                and f.name not in spec]
    return out


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _shown(value: Any) -> str:
    """A default as an error shows a value (tuples as lists, None as YAML's null), shortened."""
    if value is None:
        return "null"
    if isinstance(value, (tuple, list)):
        value = [list(v) if isinstance(v, tuple) else v for v in value]
    elif dataclasses.is_dataclass(value):
        value = dataclasses.asdict(value)
    return short_repr(value)


def read(path: str | os.PathLike = "params.yaml") -> Mapping[str, Any]:
    """``params.yaml`` parsed but not validated: its mapping (empty for an empty file).

    Raises:
        ConfigError: the file is missing, no regular file, not UTF-8 or not YAML (a key given
            twice included).
    """
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"params: {path} is a folder; --params names a params.yaml file")
    if path.exists() and not path.is_file():
        raise ConfigError(f"params: {path} is no regular file (a device or a pipe); --params "
                          "names a params.yaml file")
    if not path.is_file():
        raise ConfigError(f"params: file {path} not found")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"params: {path} is not UTF-8 text: byte 0x{exc.object[exc.start]:02x} "
                          f"at byte offset {exc.start}") from None
    try:
        raw = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ConfigError(f"params: {path} is not valid YAML: {_yaml_problem(exc)}") from None
    return raw or {}


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's error on one line: what is wrong and where (1-based line and column)."""
    mark = getattr(exc, "problem_mark", None)
    if getattr(exc, "problem", None) and mark is not None:
        context = f"{exc.context}: " if exc.context else ""
        return f"{context}{exc.problem} at line {mark.line + 1}, column {mark.column + 1}"
    return " ".join(str(exc).split())


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping: PyYAML keeps the last
    value without a word, so an edit further up a section would silently not count."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, collections.abc.Hashable):
                continue  # the safe loader's own error follows
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (given first at line {seen[key]}; a key "
                    "may appear once in a mapping)", key_node.start_mark)
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)
