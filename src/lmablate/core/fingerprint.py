"""The one fingerprint rule: what identifies a result, so that it is reused exactly when its
inputs are the same (Optuna studies by name, finished seeds, resume states), and the version of
the code that computes it (:func:`code_version`)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any, Mapping

from lmablate.core.component_files import component_hashes, named_components

# Field metadata for settings that cannot change a result (where results are stored, how often a
# heartbeat is sent, how many threads compute them): :func:`fingerprint` skips these fields.
# Every other init field of a config dataclass is part of the fingerprint it is passed to.
NOT_A_RESULT = {"fingerprint": False}

# The code that defines what a training run computes, as parts of the package (a folder: every
# module under it): a finished seed or resume state of other code is not reused (code_version).
RUN_CODE = ("data", "model", "train", "evaluate")


def fingerprint(*parts: Any) -> str:
    """First 10 hex digits of the sha256 of ``parts`` as canonical JSON.

    The one rule for every fingerprint (Optuna study names, finished seeds, resume states): a
    config dataclass contributes each init field except those marked :data:`NOT_A_RESULT`
    (nested dataclasses likewise); mappings, lists and scalars contribute their JSON.

    Raises:
        TypeError: a part that is neither JSON-serialisable nor a dataclass or mapping.
    """
    blob = json.dumps(parts, sort_keys=True, default=_jsonable)
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


def result_fields(config: Any) -> dict[str, Any]:
    """A config dataclass's init fields that can change a result (those :func:`fingerprint`
    takes: every one not marked :data:`NOT_A_RESULT`), by name: what its MLflow run records."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
            if f.init and f.metadata.get("fingerprint", True)}


def run_params(cfg: Any, dataset: str, train: Any = None) -> dict[str, Any]:
    """Every setting outside the model that can change what a run on ``dataset`` computes, as the
    MLflow params of its run (``cfg`` a :class:`lmablate.config.study.StudyConfig`; ``train`` its
    own :class:`~lmablate.config.train_config.TrainConfig` if not the study's, as a tuning trial's):
    each training setting under its own name
    (:meth:`~lmablate.config.train_config.TrainConfig.run_params`, ``budget_flops`` in FLOPs), the
    dataset's as ``data.<key>``, the evaluation's as ``evaluate.<key>``, and ``match_params``. The
    model's fields are logged beside these (``ModelConfig.to_dict``). Raises ConfigError for a
    dataset the study does not have."""
    out = dict((train or cfg.train).run_params(dataset))
    out.update({f"data.{k}": dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v
                for k, v in result_fields(cfg.dataset(dataset)).items()})
    out.update({f"evaluate.{k}": v for k, v in result_fields(cfg.evaluate).items()})
    out["match_params"] = cfg.match_params
    return out


def tuned_settings(cfg: Any, dataset: str, variant: str, data_fingerprint: str,
                   sampler_seed: int) -> str:
    """What a tuning result was tuned for, as its ``best.json`` records it (``settings``): the
    :func:`fingerprint` of the dataset, the model and the variant's overrides, the training
    settings at the dataset's budget, the tune settings with ``sampler_seed``,
    ``study.match_params`` and the training data (``cfg`` a :class:`lmablate.config.study.
    StudyConfig`). The Optuna study's name adds the code and the device to these; this leaves
    them out, so that the train stage can refuse a ``best.json`` tuned for other settings or
    data and still take one tuned on a cluster's workers."""
    train = dataclasses.replace(cfg.train.for_dataset(dataset), eval_interval=1)
    return fingerprint(cfg.dataset(dataset), cfg.model, cfg.variants[variant], train,
                       dataclasses.replace(cfg.tune, sampler_seed=sampler_seed),
                       cfg.match_params, data_fingerprint)


def _jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)
                if f.init and f.metadata.get("fingerprint", True)}
    if isinstance(obj, Mapping):
        return dict(obj)
    raise TypeError(type(obj))


def code_version(parts: tuple[str, ...] = RUN_CODE) -> str:
    """First 16 hex digits of the sha256 of the modules of ``parts`` (paths relative to the
    package: a subpackage's folder stands for every ``.py`` under it, in sorted order), their
    paths and bytes; by default :data:`RUN_CODE`. Part of every training fingerprint and every
    Optuna study name.

    Raises:
        FileNotFoundError: a part of ``parts`` does not exist.
    """
    root = Path(__file__).parents[1]
    h = hashlib.sha256()
    for part in parts:
        path = root / part
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such module or package of lmablate")
        for module in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            h.update(module.relative_to(root).as_posix().encode())
            h.update(module.read_bytes())
    return h.hexdigest()[:16]


def component_code(model: Any, overrides: Mapping[str, Any] | None = None) -> list[dict]:
    """The part a user's components add to a fingerprint beside :func:`code_version`:
    ``[{"components": {file: sha256}}]`` for the files of ``components/`` that ``model`` with a
    variant's ``overrides`` names (:func:`lmablate.core.component_files.component_hashes`, in
    the working directory), and ``[]`` for a built-in model, so that a built-in variant's
    fingerprints are the bytes they were before components existed."""
    names = named_components(model, overrides)
    return [{"components": component_hashes(names)}] if names else []
