"""The params.yaml reference, generated from the code: ``render()`` returns it as Markdown.

Every row comes from the section's dataclass in :mod:`lmablate.config.study` (:data:`SECTIONS`): the
type from the field's annotation, the default from the field, the allowed values from the
:class:`~lmablate.core.validation.Rule` that validates it and the description from its ``doc``
(:func:`lmablate.core.validation.param`). Which fingerprints a key enters is found by changing it
and computing the fingerprints the stages compute (:func:`lmablate.tune.tuning.study_name`,
:func:`lmablate.stages.train.seed_fingerprint`); which DVC stages re-run is read from
``dvc.yaml``. Run ``python docs/params_reference.py > params_reference.md`` to write the page.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # this checkout's code, whatever else is installed

from lmablate.config import params as params_module  # noqa: E402
from lmablate.config.study import SECTIONS, SplitConfig, StudyConfig  # noqa: E402
from lmablate.core.validation import is_param  # noqa: E402

TITLE = "params.yaml reference"
SECTION_TEXT = {
    "study": "Which runs the study makes: seeds, and names from the datasets and variants "
             "sections.",
    "datasets": "One entry per dataset, under its name (letters, digits and _). A key marked "
                "*arithmetic* or *text* applies to that kind only; an entry of params.yaml "
                "gives every key of its kind, and a key of the other kind is an error.",
    "model": "The baseline architecture every variant starts from.",
    "variants": "Named overrides of `model`: any model key but `d_model` (every width is tuned).",
    "train": "Optimisation of a run; every final run of a dataset spends its `budget_flops`.",
    "tune": "The Optuna search over learning rate and width, by successive halving "
            "(`lmablate.tune.tuning`).",
    "evaluate": "The test-set evaluation of every final run.",
    "tracking": "MLflow tracking.",
    "runtime": "Where and how concurrently the stages compute: no stage's DVC param, and of "
               "these settings only the kind of device a run resolves to (the device type with "
               "its CPU kernels or GPU) enters a fingerprint.",
}
# the dataset a datasets key is tried on, by the kind it applies to
_DATASET_FOR_KIND = {None: "arithmetic", "arithmetic": "arithmetic", "text": "shakespeare"}
# changed values where doubling (or negating) a default would break a rule
_OTHER: dict[str, Any] = {
    "study.profile": "full", "study.seeds": [5, 6], "study.datasets": ["arithmetic"], "study.variants": ["baseline"],
    "datasets.split": {"val": 0.2, "test": 0.0},
    "datasets.digits": 1, "datasets.max_operand": 50, "datasets.operations": ["+"],
    "datasets.length_digits": [3], "datasets.source": "corpus.txt", "datasets.sampling": "carries",
    "datasets.sha256": "0" * 64, "model.ffn": "gelu", "model.norm": "rmsnorm",
    "model.norm_placement": "post", "model.position": "rope", "model.n_kv_heads": 2,
    "model.ffn_hidden": 100, "model.d_model": 128, "train.lr_schedule": "constant",
    "tune.rungs": [[8, 0.25], [2, 1.0]], "tune.lr_limits": [1e-6, 1.0],
    "tune.tokens_per_parameter": [40.0, 180.0], "tune.tokens_per_parameter_limits": [4.0, 3000.0],
    "tune.bracket_factor": 3.0, "tune.seed": 2000, "tune.arithmetic_objective": "final",
    "tune.d_model_choices": [32], "evaluate.extrapolation_factors": [1, 2],
    "tracking.uri": "sqlite:///other.db", "tracking.experiment": "other",
    "tune.storage": "sqlite:///other.db", "runtime.device": "cpu", "runtime.parallel": "processes",
    "runtime.cluster": "tcp://127.0.0.1:8786",
}
# the variants a key is tried on: the baseline, and one with a gated FFN (which
# study.match_params resizes and which overrides model.ffn)
VARIANTS = ("baseline", "swiglu")
# keys whose change needs the whole entry replaced
_OTHER_ENTRY = {"datasets.kind": {"kind": "text", "source": "corpus.txt",
                                  "split": {"val": 0.1, "test": 0.1}},
                # 1 digit has 162 problems: fewer test problems, and a 2-digit length split
                "datasets.digits": {"kind": "arithmetic", "digits": 1, "n_test": 50,
                                    "length_digits": [2], "strip_newlines": True,
                                    "split": {"val": 0.1, "test": 0.0}}}
# changed alongside a key whose other value makes the default arithmetic's problems longer than
# its own 16-token window
_ALONGSIDE = {"datasets.decimals": {"context_length": 32},
              "datasets.length_digits": {"context_length": 32}}
# study.replicates and study.replicate_stages change together (one stage per replicate after
# the first): a second replicate, of the study section as params.yaml has it
_REPLICATED = {"replicates": 2, "replicate_stages": [1]}
# what a change of the key reaches besides the fingerprints it enters as a setting
_ALSO = {
    "datasets": "the seeds too where it changes the train or validation tokens",
    "runtime.device": "seed and tune, as the kind of device it resolves to (e.g. cpu AVX512, "
                      "cuda NVIDIA H200)",
}


def section_fields(section: str) -> list[dataclasses.Field]:
    """The keys of ``section`` as dataclass fields, in the order params.yaml gives them."""
    return [f for f in dataclasses.fields(SECTIONS[section]) if is_param(f)]


def default_of(f: dataclasses.Field) -> Any:
    """The field's default; :data:`dataclasses.MISSING` for a key without one."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def yaml_value(value: Any, nested: bool = False) -> str:
    """``value`` as YAML flow text that reads back as the same value (strings in a list or
    mapping quoted unless they are plain names)."""
    if dataclasses.is_dataclass(value):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {yaml_value(v, True)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(yaml_value(v, True) for v in value) + "]"
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, float):
        if value and not 1e-3 <= abs(value) < 1e6:
            # YAML 1.1 reads a float only with a point and a signed exponent: 1.0e+11
            mantissa, exponent = f"{value:.10e}".split("e")
            mantissa = mantissa.rstrip("0")
            return f"{mantissa}{'0' if mantissa.endswith('.') else ''}e{exponent}"
        return repr(value)
    if isinstance(value, str) and (yaml.safe_load(value) != value or not nested
                                   or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value)):
        return json.dumps(value) if nested or yaml.safe_load(value) != value else value
    return str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


# ------------------------------------------------------------------ fingerprints, by trying


def _fingerprints(raw: dict, dataset: str, variant: str) -> dict[str, str]:
    """The tuning study's name and the first seed's fingerprint of ``dataset`` x ``variant``
    under params ``raw``, as the tune and train stages compute them (with fixed tuned values
    and data)."""
    from lmablate.train.budget import run_steps
    from lmablate.stages.train import SeedJob, seed_fingerprint
    from lmablate.tune.tuning import study_name
    from lmablate.model.variants import resolve_model_config

    class Data:  # the tokens' hash stands in for the data (datasets: see _ALSO)
        def fingerprint(self) -> str:
            return "data"

    cfg: StudyConfig = params_module.parse(raw)
    model_cfg = resolve_model_config(cfg, variant, vocab_size=20, d_model=32)
    job = SeedJob(cfg, dataset, variant, model_cfg, 1e-3, cfg.seeds[0],
                  run_steps(cfg, dataset, model_cfg), Path("tokens"), Path("seed"))
    return {"tune": study_name(cfg, dataset, variant, "data", cfg.tune.sampler_seed, "cpu"),
            "seed": seed_fingerprint(job, Data())}


def _other(key: str, value: Any) -> Any:
    """A valid value other than ``value`` for ``key`` (``section.name``; datasets without the
    dataset's name)."""
    if key in _OTHER:
        return _OTHER[key]
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value * 2 if value else 1
    if isinstance(value, float):
        return value * 0.5 if value else 0.1
    if isinstance(value, dict):
        return {k: v * 0.5 for k, v in value.items()}
    raise ValueError(f"no other value for {key}: add one to _OTHER")


def enters(section: str, name: str, raw: dict) -> list[str]:
    """The fingerprints that change when key ``name`` of ``section`` changes in ``raw``: tune
    (the Optuna study's name) and seed (a final run's result)."""
    import copy
    dataset = "arithmetic"
    if section == "datasets":
        kind = next(f for f in section_fields("datasets") if f.name == name).metadata.get("kind")
        dataset = _DATASET_FOR_KIND[kind]
        node = raw["datasets"][dataset]
    else:
        node = raw[section]
    key = f"{section}.{name}"
    changed = copy.deepcopy(raw)
    target = changed["datasets"] if section == "datasets" else changed
    where = dataset if section == "datasets" else section
    if key in ("study.replicates", "study.replicate_stages"):
        target[where] = {**node, **_REPLICATED}
    else:
        target[where] = _OTHER_ENTRY.get(key) or {**node, name: _other(key, node[name]),
                                                  **_ALONGSIDE.get(key, {})}
    reached = []
    for variant in VARIANTS:
        memo = (json.dumps(raw, sort_keys=True, default=str), dataset, variant)
        if memo not in _UNCHANGED:
            _UNCHANGED[memo] = _fingerprints(raw, dataset, variant)
        before, after = _UNCHANGED[memo], _fingerprints(changed, dataset, variant)
        reached += [w for w in before if before[w] != after[w] and w not in reached]
    return reached


_UNCHANGED: dict[tuple, dict[str, str]] = {}  # the fingerprints of unchanged params


# ------------------------------------------------------------------ DVC stages, from dvc.yaml


def dvc_params() -> dict[str, list[list[str]]]:
    """Each stage of ``dvc.yaml`` and the params it depends on, as key paths (``*`` for a
    templated part such as ``${item}``)."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    out = {}
    for name, stage in stages.items():
        body = stage.get("do", stage)
        out[name] = [re.sub(r"\$\{[^}]*\}", "*", str(p)).split(".")
                     for p in body.get("params", [])]
    # the check stage takes every section and writes the same bytes while they are valid:
    # it re-runs for any key, and no other stage re-runs because of it (the page says so)
    out.pop("check", None)
    return out


def rerun_by(path: list[str], stages: dict[str, list[list[str]]]) -> list[str]:
    """The stages whose params cover key ``path`` (a param covers its keys and sub-keys)."""
    def covers(param: list[str]) -> bool:
        return len(param) <= len(path) and all(p in ("*", k) for p, k in zip(param, path))
    return [name for name, ps in stages.items() if any(covers(p) for p in ps)]


# ------------------------------------------------------------------ the page


def _row(section: str, f: dataclasses.Field, prefix: str, raw: dict,
         stages: dict[str, list[list[str]]], fingerprint: Callable[[], list[str]]) -> str:
    rule = f.metadata.get("rule")
    default = default_of(f)
    kind = f.metadata.get("kind")
    doc = (f"*{kind}*: " if kind else "") + f.metadata["doc"]
    path = [section] + (["*"] if section == "datasets" else []) + prefix.split(".")[:-1] + [f.name]
    reached = fingerprint()
    also = _ALSO.get(f"{section}.{f.name}") or _ALSO.get(section)
    fp = ", ".join(reached) + ("; " if reached and also else "") + (also or "")
    return ("| " + " | ".join(_cell(c) for c in (
        f"`{prefix}{f.name}`", f"`{f.type}`",
        "(none)" if default is dataclasses.MISSING else f"`{yaml_value(default)}`",
        rule.allowed if rule else "any", doc, fp or "no",
        ", ".join(rerun_by(path, stages)) or "none")) + " |")


HEADER = ("| key | type | default | allowed | what it changes | fingerprint | re-runs (DVC) |\n"
          "|---|---|---|---|---|---|---|")


def render() -> str:
    """The reference page, Markdown: one table per section of params.yaml, with the defined
    variants, and how profiles and environment overrides apply."""
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    stages = dvc_params()
    lines = [
        f"# {TITLE}", "",
        "Generated by `docs/params_reference.py` from the dataclasses of `lmablate.config.study` "
        "(defaults, types, rules, descriptions) and `dvc.yaml`; do not edit by hand.", "",
        "`conf/config.yaml`, and `params.yaml` composed from it, give every key below, each at "
        "its default (a test pins the two). A deleted key takes the default shown, and a key "
        "without one is required; an unknown key, a value of the wrong type or outside what is "
        "allowed is an error naming the key, the value and what is allowed.", "",
        "**fingerprint**: which identity of a result changes with the key, found by changing it: "
        "*tune* is the Optuna study's name (its trials are reused while it stays the same), "
        "*seed* a final run's fingerprint (a finished seed is kept, an interrupted one resumes, "
        "while it stays the same). What enters *tune* reaches the seeds through the tuned "
        "learning rate and width as well. **re-runs (DVC)**: the stages of `dvc.yaml` whose "
        "params hold the key, re-run by `dvc repro` when it changes (the stages after them re-run "
        "when their outputs change). Any key also re-runs `check`, the first stage, which "
        "validates the params and writes the same bytes while they are valid, so it is left "
        "out of the column.", "",
        "**Profiles**: the files of `conf/profile/` hold what a profile changes, e.g. `full` "
        "(all 13 variants), `scaling` (six variants at four budgets: "
        "`train.budget_flops.shakespeare` is a list) and `seed-scale` (seed 000's sizes, for a "
        "GPU). Run one as a DVC experiment, `dvc exp run --temp -S profile=<name>` (more keys "
        "with more `-S`), or write its `params.yaml` with `lmablate compose --profile <name>`.",
        "",
        "**Environment**: `LMABLATE_OPTUNA_STORAGE` replaces `tune.storage` and "
        "`MLFLOW_TRACKING_URI` replaces `tracking.uri`; neither enters a fingerprint.", "",
    ]
    for section in params_module.TOP_LEVEL_KEYS:
        lines += [f"## {section}", "", SECTION_TEXT[section], ""]
        if section == "variants":
            lines += _variants(raw, stages)
            continue
        lines.append(HEADER)
        for f in section_fields(section):
            def tried(name: str = f.name) -> list[str]:
                return enters(section, name, raw)
            lines.append(_row(section, f, "", raw, stages, tried))
            if f.name == "split":  # its own keys
                for sf in dataclasses.fields(SplitConfig):
                    lines.append(_row(section, sf, "split.", raw, stages, tried))
        lines.append("")
    return "\n".join(lines)


def _variants(raw: dict, stages: dict[str, list[list[str]]]) -> list[str]:
    """The variants defined in params.yaml: name, overrides, whether the study runs them."""
    import copy
    chosen = raw["study"]["variants"]
    changed = copy.deepcopy(raw)
    changed["variants"]["swiglu"] = {"ffn": "geglu"}
    before, after = (_fingerprints(r, "arithmetic", "swiglu") for r in (raw, changed))
    reached = [which for which in before if before[which] != after[which]]
    some = rerun_by(["variants", "some_variant", "ffn"], stages)
    baseline = [s for s in rerun_by(["variants", "baseline", "ffn"], stages) if s not in some]
    lines = [f"The variants params.yaml defines. A change of a variant's overrides re-runs "
             f"{', '.join(some)} for it (the baseline's also {', '.join(baseline) or 'nothing'}); "
             f"fingerprints it enters: {', '.join(reached) or 'none'}.", "",
             "| variant | overrides of model | in study.variants |", "|---|---|---|"]
    for name, overrides in raw["variants"].items():
        lines.append(f"| `{name}` | `{yaml_value(overrides or {})}` | "
                     f"{'yes' if name in chosen else 'no'} |")
    return lines + [""]


if __name__ == "__main__":
    sys.stdout.write(render())
