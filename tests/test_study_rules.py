"""The rules across sections of params.yaml (lmablate.config.study_rules): one registry, each rule
broken by one edit of the defaults, and every rule checked by parse."""

from __future__ import annotations

import copy
import inspect
from pathlib import Path

import pytest
import yaml

from lmablate.config import params, study_rules
from lmablate.core.validation import ConfigError

ROOT = Path(__file__).resolve().parents[1]

# Each rule with one edit of the committed params that breaks it alone, and the key its error
# names.
BREAKS = {
    "tuning_never_sees_a_final_seed": ({"tune": {"seed": 2}}, "tune.seed=2"),
    # replicate 1's final seed 100,000 is replicate 0's
    "replicates_draw_disjoint_seeds": (
        {"study": {"seeds": [0, 100_000], "replicates": 2, "replicate_stages": [1]}},
        "study.seeds=[0, 100000]"),
    "every_dataset_has_a_budget": (
        {"train": {"budget_flops": {"shakespeare": 1e12}}}, "train.budget_flops="),
    "a_window_holds_a_whole_problem": (
        {"datasets": {"arithmetic": {"context_length": 12}}}, "datasets.arithmetic="),
    "coupled_positions_need_arithmetic": (
        {"study": {"variants": ["baseline", "coupled"]}}, "study.variants="),
    "every_tuned_width_suits_every_variant": (
        {"tune": {"d_model_choices": [32, 50]}}, "tune.d_model_choices=50"),
}


def edited(edit: dict) -> dict:
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    out = copy.deepcopy(raw)
    for section, values in edit.items():  # a dataset's entry merges too
        out[section] = {**out[section], **{
            k: {**out[section][k], **v} if section == "datasets" else v
            for k, v in values.items()}}
    return out


def test_a_problem_longer_than_the_dataset_s_own_window_names_that_key():
    with pytest.raises(ConfigError, match=r"its problems are 15 characters \(fields of 3\), "
                                          r"more than datasets\.arithmetic\.context_length=12 "
                                          r"holds"):
        params.parse(edited({"datasets": {"arithmetic": {"context_length": 12}}}))
    with pytest.raises(ConfigError, match=r"more than model\.context_length=12 holds"):
        params.parse(edited({"datasets": {"arithmetic": {"context_length": None}},
                             "model": {"context_length": 12}}))


def test_every_rule_of_the_module_is_in_the_registry_once():
    public = [name for name, obj in inspect.getmembers(study_rules, inspect.isfunction)
              if obj.__module__ == study_rules.__name__ and name != "check_study"]
    registered = [rule.__name__ for rule in study_rules.STUDY_RULES]
    assert sorted(public) == sorted(registered) == sorted(BREAKS)
    assert len(set(registered)) == len(registered)


def test_the_committed_params_break_no_rule():
    cfg = params.parse(edited({}))
    assert study_rules.check_study(cfg) is cfg


@pytest.mark.parametrize("rule", sorted(BREAKS))
def test_parse_reports_a_broken_rule_by_its_key(rule):
    edit, key = BREAKS[rule]
    with pytest.raises(ConfigError) as info:
        params.parse(edited(edit))
    assert key in str(info.value) and str(info.value).count("\n") == 0


@pytest.mark.parametrize("rule", sorted(BREAKS))
def test_each_edit_breaks_its_own_rule_and_no_earlier_one(rule, monkeypatch):
    """Without ``rule`` in the registry, its edit parses: the error came from that rule."""
    edit, _ = BREAKS[rule]
    others = tuple(r for r in study_rules.STUDY_RULES if r.__name__ != rule)
    monkeypatch.setattr(study_rules, "STUDY_RULES", others)
    try:
        params.parse(edited(edit))
    except ConfigError as exc:  # a later check of a section (not a study rule) may still object
        pytest.fail(f"{rule}'s edit breaks another check too: {exc}")
