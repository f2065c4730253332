"""lmablate.report.collect: runs/ read into typed tables, in the study's order (the synthetic
study of synthetic_study.py)."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from lmablate.report import collect

from synthetic_study import DATASETS, EM_BY_DIGITS, NA_4, OPS, VARIANTS, make_cfg, true_answer_loss


def test_collect_returns_typed_run_outputs_in_default_order(study_root):
    runs = collect.collect(study_root / "runs")
    assert isinstance(runs, collect.RunOutputs) and dataclasses.is_dataclass(runs)
    with pytest.raises(dataclasses.FrozenInstanceError):
        runs.ablation = pd.DataFrame()
    for name in ("ablation", "history", "trials", "grad", "per_op"):
        frame = getattr(runs, name)
        assert isinstance(frame, pd.DataFrame) and len(frame), name
        for col in ("dataset", "variant"):
            assert isinstance(frame[col].dtype, pd.CategoricalDtype), (name, col)
            assert frame[col].cat.ordered, (name, col)
    assert list(runs.ablation.columns) == collect.ABLATION_COLUMNS
    assert list(runs.per_op.columns) == collect.PER_OP_COLUMNS
    assert len(runs.ablation) == 2 * 3 * 3 + 3  # the study plus the stale "old" variant
    assert len(runs.per_op) == 3 * 3 * len(OPS)  # arithmetic only
    # without a config: datasets alphabetically, baseline first, other variants alphabetically
    assert list(runs.ablation["dataset"].cat.categories) == sorted(DATASETS)
    assert list(runs.ablation["variant"].cat.categories) == ["baseline", "gelu", "old", "rmsnorm"]
    assert list(runs.ablation[["dataset", "variant", "seed"]].itertuples(index=False)) == sorted(
        runs.ablation[["dataset", "variant", "seed"]].itertuples(index=False),
        key=lambda r: (sorted(DATASETS).index(r[0]),
                       ["baseline", "gelu", "old", "rmsnorm"].index(r[1]), r[2]))
    assert set(runs.samples) == {("shakespeare", v) for v in (*VARIANTS, "old")}
    assert set(runs.predictions) == {("arithmetic", v) for v in VARIANTS}
    assert runs.predictions[("arithmetic", "gelu")]["seed_1"][1]["prediction"] == "6310000000$"
    assert runs.samples[("shakespeare", "rmsnorm")]["seed_2"][1] == "second"


def test_restrict_to_study_sets_config_order_with_baseline_first(study_root):
    cfg = make_cfg(variants=("rmsnorm", "baseline", "gelu"))
    runs, notes = collect.restrict_to_study(cfg, collect.collect(study_root / "runs"))
    want = ["baseline", "rmsnorm", "gelu"]
    for name in ("ablation", "history", "trials", "grad", "per_op"):
        frame = getattr(runs, name)
        assert list(frame["dataset"].cat.categories) == list(DATASETS), name
        assert list(frame["variant"].cat.categories) == want, name
        assert "old" not in set(frame["variant"]), name
    assert collect.present(runs.ablation["variant"]) == want
    assert list(pd.unique(runs.ablation["variant"].astype(str))) == want
    assert ("shakespeare", "old") not in runs.samples
    assert len(notes) == 1 and "shakespeare/old/seed 0" in notes[0]


def test_restrict_to_study_keeps_tuning_trials_whatever_their_tuning_seed(study_root):
    """trials.csv's ``seed`` is a trial's tuning seed (tune.seed, and tune.seed + 1 ... in the
    full-budget bracket), never one of study.seeds: the configured variants' trials are all
    kept, at every budget."""
    runs = collect.collect(study_root / "runs")
    tuning_seeds = [1000 + i % 2 for i in range(len(runs.trials))]
    runs = dataclasses.replace(runs, trials=runs.trials.assign(seed=tuning_seeds),
                               scaling_trials=runs.trials.assign(seed=tuning_seeds))
    kept, _ = collect.restrict_to_study(make_cfg(), runs)
    configured = runs.trials["variant"].isin(VARIANTS)
    assert len(kept.trials) == len(kept.scaling_trials) == configured.sum() > 0
    assert set(kept.trials["seed"]) == {1000, 1001}


def test_variant_order_helpers():
    assert collect.variant_order(["z", "a", "baseline", "m", "a"], ["m", "z"]) == [
        "baseline", "m", "z", "a"]
    assert collect.variant_order(["b", "a"]) == ["a", "b"]
    cat = pd.Series(pd.Categorical(["y", "x", "y"], categories=["z", "y", "x"], ordered=True))
    assert collect.present(cat) == ["y", "x"]  # unobserved "z" left out, category order kept
    assert collect.present(pd.Series(["y", "x", "y"])) == ["y", "x"]  # plain: first appearance
    with pytest.raises(ValueError, match="not among"):
        collect.with_order(pd.DataFrame({"variant": ["a", "b"]}), variants=["a"])


def test_collect_reads_the_answer_loss_and_the_results_by_operand_and_answer_digits(study_root):
    runs, _ = collect.restrict_to_study(make_cfg(), collect.collect(study_root / "runs"))
    a = runs.ablation[runs.ablation["dataset"] == "arithmetic"]
    assert a["answer_loss"].tolist() == pytest.approx(
        [true_answer_loss(v, i) for v in VARIANTS for i in range(3)])
    assert list(runs.per_op.columns) == collect.PER_OP_COLUMNS
    assert runs.per_op["n"].eq(50).all()
    assert runs.per_op.loc[runs.per_op["op"] == "mul", "answer_loss"].tolist() == \
        pytest.approx([true_answer_loss(v, i) + 0.2 for v in VARIANTS for i in range(3)])
    digits = runs.by_operand_digits
    assert list(digits.columns) == collect.OPERAND_DIGITS_COLUMNS
    assert len(digits) == len(VARIANTS) * 3 * len(EM_BY_DIGITS)
    assert list(digits["variant"].cat.categories) == list(VARIANTS)
    assert digits[["variant", "seed", "digits"]].values.tolist() == [
        [v, s, d] for v in VARIANTS for s in (0, 1, 2) for d in EM_BY_DIGITS]
    na = digits[digits["note"] != ""]
    assert na[["variant", "digits", "note"]].drop_duplicates().values.tolist() == [
        ["rmsnorm", 4, NA_4]]
    assert na["exact_match"].isna().all() and na["split"].isna().all()
    ok = digits[digits["note"] == ""]
    assert set(zip(ok["digits"], ok["split"])) == {(1, "test"), (2, "test"), (3, "length"),
                                                  (4, "length")}
    answers = runs.by_answer_digits
    assert list(answers.columns) == collect.ANSWER_DIGITS_COLUMNS
    assert len(answers) == len(VARIANTS) * 3 * 3 and answers["n"].tolist()[:3] == [10, 20, 30]
    # empty frames, with their columns, where no run wrote any
    bare = collect.RunOutputs(*(pd.DataFrame(),) * 5, samples={}, predictions={})
    assert list(bare.by_operand_digits.columns) == collect.OPERAND_DIGITS_COLUMNS


@pytest.mark.parametrize("name", ["metrics.json", "best.json"])
def test_a_file_copied_into_another_variant_s_folder_is_refused_naming_both(
        study_root, tmp_path, name):
    """rope's metrics (or tuning) in the baseline's folder would be reported as the baseline's."""
    import shutil
    runs = tmp_path / "runs"
    shutil.copytree(study_root / "runs", runs)
    shutil.copy(runs / "arithmetic" / "rmsnorm" / name, runs / "arithmetic" / "baseline" / name)
    made = "evaluated for arithmetic rmsnorm" if name == "metrics.json" else \
        "tuned as Optuna study arithmetic-rmsnorm-0123456789, not for"
    with pytest.raises(ValueError, match=f"arithmetic/baseline/{name}: {made}.* arithmetic "
                                         r"baseline \(its folder\)"):
        collect.collect(runs)
