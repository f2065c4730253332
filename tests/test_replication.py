"""Replicates of the study (study.replicates): disjoint seeds per replicate, the agreement of
their verdicts, the combined interval that counts the tuning draw (checked by simulation against
a known between-replicate variance), and the report's Replication section."""

from __future__ import annotations

import gc
import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from lmablate.config import params
from lmablate.config.study import REPLICATE_SEED_STRIDE, ConfigError
from lmablate.report.stats import replication as rep
from lmablate.report.stats.statistics import (VERDICT_BETTER, VERDICT_NSD,
                                              VERDICT_UNDECIDED_TUNING, VERDICT_WORSE)

from conftest import tiny_params
from synthetic_study import REPLICATE_1_SEEDS


def replicated(r: int, **study) -> dict:
    return tiny_params({"study": {"replicates": r, "replicate_stages": list(range(1, r)),
                                  **study}})


# ---- seeds ------------------------------------------------------------------------------------

def test_replicate_zero_is_the_study_itself_and_every_other_draws_fresh_seeds():
    cfg = params.parse(replicated(3, seeds=[0, 1, 2]))
    assert cfg.for_replicate(0) is cfg
    drawn = []
    for r in range(3):
        rc = cfg.for_replicate(r)
        tuning = range(rc.tune.seed, rc.tune.seed + rc.tune.bracket_seeds)
        drawn.append((set(rc.seeds), set(tuning), rc.tune.sampler_seed))
        assert rc.seeds == tuple(s + r * REPLICATE_SEED_STRIDE for s in cfg.seeds)
        assert rc.replicate == r and rc.model == cfg.model and rc.train == cfg.train
    finals = [f for f, _, _ in drawn]
    every = [s for f, t, _ in drawn for s in (*f, *t)]
    assert len(every) == len(set(every))  # no seed drawn twice, final or tuning
    assert [s for _, _, s in drawn] == [cfg.tune.sampler_seed + r for r in range(3)]
    assert all(not (a & b) for i, a in enumerate(finals) for b in finals[i + 1:])


@pytest.mark.parametrize("r", [-1, 3])
def test_a_replicate_outside_the_study_is_refused_naming_the_range(r):
    cfg = params.parse(replicated(3))
    with pytest.raises(ConfigError, match=r"--replicate=.* 0 \.\. study\.replicates - 1 = 2"):
        cfg.for_replicate(r)


def test_replicate_stages_must_list_the_replicates_after_the_first():
    raw = replicated(3)
    raw["study"]["replicate_stages"] = [1]
    with pytest.raises(ConfigError) as err:
        params.parse(raw)
    assert str(err.value) == ("params: study.replicate_stages=[1] is not allowed; must be [1, 2] "
                              "for study.replicates=3 (one stage per replicate after the first)")


def test_a_seed_pushed_past_the_largest_by_a_replicate_is_refused():
    raw = replicated(2)
    raw["study"]["seeds"] = [2**31 - 10]
    with pytest.raises(ConfigError, match="replicate 1 would draw seed"):
        params.parse(raw)


# ---- agreement and the combined comparison ----------------------------------------------------

def verdict_rows(spec: dict[str, list[tuple[float, str]]], n: int = 5) -> pd.DataFrame:
    """Replicate rows of one dataset: variant -> [(mean_diff, verdict) per replicate]."""
    return pd.DataFrame([
        {"dataset": "d", "metric": "test_loss", "variant": v, "replicate": r, "n_pairs": n,
         "lr": 0.01, "d_model": 32, "baseline_lr": 0.01, "baseline_d_model": 32,
         "mean_diff": d, "ci_holm_low": d - 0.01, "ci_holm_high": d + 0.01, "p_holm": 0.01,
         "tuning_uncertainty": 0.005, "verdict": verdict}
        for v, reps in spec.items() for r, (d, verdict) in enumerate(reps)],
        columns=rep.REPLICATE_COLUMNS)


def test_verdicts_agree_only_when_every_replicate_gives_the_same_one():
    rows = verdict_rows({
        "same": [(-0.05, VERDICT_BETTER)] * 3,
        "flip": [(-0.05, VERDICT_BETTER), (-0.01, VERDICT_NSD), (-0.04, VERDICT_BETTER)],
        "tuning": [(0.2, VERDICT_WORSE), (0.1, VERDICT_UNDECIDED_TUNING), (0.2, VERDICT_WORSE)],
        "signs": [(0.01, VERDICT_NSD), (-0.01, VERDICT_NSD), (0.02, VERDICT_NSD)]})
    c = rep.combine_replicates(rows).set_index("variant")
    assert c["agree"].to_dict() == {"same": True, "flip": False, "tuning": False, "signs": True}
    assert c["same_sign"].to_dict() == {"same": True, "flip": True, "tuning": True,
                                        "signs": False}
    assert c.loc["flip", "verdicts"] == "better / no significant difference / better"
    assert list(c.index[~c["agree"]]) == ["flip", "tuning"]  # those the Findings name


def test_the_combined_interval_is_the_t_interval_of_the_replicate_means_with_r_minus_1_df():
    means = [-0.05, -0.02, -0.08]
    c = rep.combine_replicates(verdict_rows({"v": [(m, VERDICT_BETTER) for m in means]}))
    row = c.iloc[0]
    low, high = stats.t.interval(0.95, 2, loc=np.mean(means), scale=stats.sem(means))
    assert row["df"] == 2 and row["replicates"] == 3 and row["n_pairs"] == 15
    assert row["mean_diff"] == pytest.approx(np.mean(means))
    assert row["sd_between"] == pytest.approx(np.std(means, ddof=1))
    assert (row["ci95_low"], row["ci95_high"]) == (pytest.approx(low), pytest.approx(high))
    assert row["p_value"] == pytest.approx(stats.ttest_1samp(means, 0).pvalue)
    # one variant: Holm changes nothing, and its interval excludes 0 exactly when it rejects
    assert row["p_holm"] == pytest.approx(row["p_value"])
    assert (row["verdict"] == VERDICT_BETTER) == (row["ci_holm_high"] < 0)


def test_holm_runs_over_a_datasets_variants_and_one_replicate_gives_no_verdict():
    rows = verdict_rows({"a": [(-0.10, VERDICT_BETTER), (-0.11, VERDICT_BETTER),
                               (-0.09, VERDICT_BETTER)],
                         "b": [(-0.02, VERDICT_NSD), (0.03, VERDICT_NSD), (-0.01, VERDICT_NSD)]})
    c = rep.combine_replicates(rows).set_index("variant")
    raw = sorted(c["p_value"])
    assert sorted(c["p_holm"]) == pytest.approx([min(1, 2 * raw[0]), max(2 * raw[0], raw[1])])
    assert c.loc["a", "verdict"] == VERDICT_BETTER and c.loc["b", "verdict"] == VERDICT_NSD
    one = rep.combine_replicates(verdict_rows({"a": [(-0.1, VERDICT_BETTER)]}))
    assert one.iloc[0]["verdict"] == rep.VERDICT_FEW_REPLICATES
    assert math.isnan(one.iloc[0]["ci_holm_low"])


def simulate(rng, sd_between: float, sd_within: float, replicates: int, seeds: int,
             mu: float) -> tuple[pd.DataFrame, pd.DataFrame, np.ndarray]:
    """Paired differences d_rs = mu + u_r + e_rs: replicate rows (their means) and SDs, and
    every d_rs."""
    u = rng.normal(0, sd_between, replicates)
    d = mu + u[:, None] + rng.normal(0, sd_within, (replicates, seeds))
    rows = verdict_rows({"v": [(float(x), VERDICT_NSD) for x in d.mean(axis=1)]}, n=seeds)
    within = pd.DataFrame({"dataset": "d", "variant": "v", "replicate": range(replicates),
                           "sd_diff": d.std(axis=1, ddof=1)})
    return rows, within, d


def test_the_combined_interval_covers_the_true_effect_where_the_seeds_interval_does_not(
        monkeypatch):
    """A known between-replicate SD (the tuning draw) 2.5 times the seeds' standard error: the
    combined interval covers the true mean in 95% of studies; an interval over all seeds that
    ignores the replicates covers it far less often."""
    # statsmodels' multipletests (Holm) runs a full garbage collection on every call: a tenth
    # of a second in this process, which the 2,000 simulated studies need not pay
    monkeypatch.setattr(gc, "collect", lambda *args: 0)
    rng = np.random.default_rng(7)
    mu, sd_b, sd_w, k, n, trials = -0.05, 0.02, 0.018, 3, 5, 2000
    combined = pooled = 0
    draws = []
    for _ in range(trials):
        rows, within, d = simulate(rng, sd_b, sd_w, k, n, mu)
        row = rep.combine_replicates(rows, within).iloc[0]
        combined += row["ci95_low"] <= mu <= row["ci95_high"]
        low, high = stats.t.interval(0.95, k * n - 1, loc=d.mean(), scale=stats.sem(d.ravel()))
        pooled += low <= mu <= high
        draws.append(row["sd_tuning_draw"] ** 2)
    assert abs(combined / trials - 0.95) < 0.015
    assert pooled / trials < 0.80
    # the ANOVA estimate of the draw's variance, truncated at 0, is close to the truth on average
    assert np.mean(draws) == pytest.approx(sd_b ** 2, rel=0.15)


def test_the_tuning_spread_separates_the_draw_from_the_seeds():
    ablation, tuned = {}, {}
    for r, shift in enumerate((0.0, 0.1, 0.2)):
        ablation[r] = pd.DataFrame({"dataset": "d", "variant": "v", "seed": range(4),
                                    "test_loss": [2.0 + shift + x for x in (0, .01, -.01, 0)]})
        tuned[r] = pd.DataFrame({"dataset": ["d"], "variant": ["v"], "lr": [0.01 * (r + 1)],
                                 "d_model": [32], "val_loss": [2.1 + shift],
                                 "tuning_uncertainty": [0.05]})
    row = rep.tuning_spread(tuned, ablation, {"d": "test_loss"}).iloc[0]
    se = np.std([0, .01, -.01, 0], ddof=1) / 2
    assert row["final_sd_between"] == pytest.approx(0.1)
    assert row["seed_se"] == pytest.approx(se)
    assert row["sd_tuning_draw"] == pytest.approx(math.sqrt(0.01 - se ** 2))
    assert row["tuned_lr"] == "0.01 / 0.02 / 0.03" and row["tuned_d_model"] == "32 / 32 / 32"
    assert row["tuned_loss_range"] == pytest.approx(0.2)
    assert row["covered"] == False  # noqa: E712 (numpy's bool): 0.05 < 1.96 x 0.0999
    # tuned on the mean answer loss over a run, the uncertainty is in another unit than the
    # headline answer loss: it is left out and covers nothing
    mean = {r: t.assign(objective="val_answer_loss_mean") for r, t in tuned.items()}
    answer = {r: a.rename(columns={"test_loss": "answer_loss"}) for r, a in ablation.items()}
    row = rep.tuning_spread(mean, answer, {"d": "answer_loss"}).iloc[0]
    assert math.isnan(row["tuning_uncertainty"]) and row["covered"] is None
    assert row["sd_tuning_draw"] == pytest.approx(math.sqrt(0.01 - se ** 2))
    final = {r: t.assign(objective="val_answer_loss") for r, t in tuned.items()}
    assert rep.tuning_spread(final, answer, {"d": "answer_loss"}).iloc[0][
        "tuning_uncertainty"] == 0.05


def speed_rows(spec: dict[str, list[tuple[float, str]]]) -> dict[int, pd.DataFrame]:
    """Learning-speed comparisons per replicate: variant -> [(ratio, verdict) per replicate]."""
    from lmablate.report.stats.learning_speed import COMPARISON_COLUMNS
    reps = max(len(v) for v in spec.values())
    return {r: pd.DataFrame([
        {"dataset": "d", "variant": v, "threshold": 0.5, "n_pairs": 5, "variant_first": 0,
         "baseline_first": 0, "ties": 5, "p_value": 0.5, "p_holm": 0.5, "n_both": 5,
         "ratio": runs[r][0], "ratio_low": math.nan, "ratio_high": math.nan,
         "mde_ratio": math.nan, "verdict": runs[r][1]} for v, runs in spec.items()],
        columns=COMPARISON_COLUMNS) for r in range(reps)}


def test_learning_speed_replicates_combine_as_the_losses_do_on_the_log_scale():
    from lmablate.report.stats.learning_speed import VERDICT_FASTER, VERDICT_SLOWER
    slow, fast = [1.60, 1.35, 1.20], [0.50, 0.52, 0.49]
    c = rep.combine_speed(speed_rows({
        "slow": [(slow[0], VERDICT_SLOWER), (slow[1], VERDICT_NSD), (slow[2], VERDICT_NSD)],
        "fast": [(x, VERDICT_FASTER) for x in fast]}))
    assert list(c.columns) == rep.SPEED_REPLICATION_COLUMNS
    c = c.set_index("variant")
    logs = np.log(slow)
    low, high = stats.t.interval(0.95, 2, loc=logs.mean(), scale=stats.sem(logs))
    row = c.loc["slow"]
    assert row["ratio"] == pytest.approx(math.exp(logs.mean()))
    assert (row["ratio_low"], row["ratio_high"]) == (pytest.approx(math.exp(low)),
                                                     pytest.approx(math.exp(high)))
    assert row["p_value"] == pytest.approx(stats.ttest_1samp(logs, 0).pvalue)
    assert (row["agree"], row["same_direction"]) == (False, True)
    assert row["ratios"] == "1.60 / 1.35 / 1.20" and row["n_both"] == 15
    assert row["verdict"] == VERDICT_NSD  # slower in one replicate, not over the three
    assert c.loc["fast", "verdict"] == VERDICT_FASTER and c.loc["fast", "agree"]


def test_a_replicate_where_no_pair_learned_is_left_out_of_the_combined_ratio():
    c = rep.combine_speed(speed_rows({"v": [(2.0, VERDICT_NSD), (math.nan, VERDICT_NSD),
                                            (8.0, VERDICT_NSD)]}))
    row = c.iloc[0]
    assert row["ratios"] == "2.00 / - / 8.00" and row["df"] == 1
    assert row["ratio"] == pytest.approx(4.0) and not row["same_direction"]


# ---- the report -------------------------------------------------------------------------------

def test_the_report_names_the_verdict_that_did_not_replicate(built_replicated):
    _, out_dir, out = built_replicated
    per = pd.read_csv(out["replicates"])
    assert list(per.columns) == rep.REPLICATE_COLUMNS
    assert sorted(set(per["replicate"])) == [0, 1]
    combined = pd.read_csv(out["replication"]).set_index(["dataset", "variant"])
    # synthetic_study.REPLICATE_1_SHIFT moves shakespeare's rmsnorm alone
    assert combined["agree"].to_dict() == {
        ("shakespeare", "gelu"): True, ("shakespeare", "rmsnorm"): False,
        ("arithmetic", "gelu"): True, ("arithmetic", "rmsnorm"): True}
    assert combined.loc[("shakespeare", "rmsnorm"), "verdicts"] == (
        "no significant difference / better")
    assert combined.loc[("arithmetic", "rmsnorm"), "metric"] == "answer_loss"
    md = out["report"].read_text()
    findings = md.split("## Findings")[1].split("## Replication")[0]
    assert findings.count("**Not replicated:") == 1
    assert ("- **Not replicated: rmsnorm.** Its verdicts in the 2 replicates: no significant "
            "difference / better.") in findings
    section = md.split("## Replication")[1].split("## What this study can and cannot say")[0]
    assert "### shakespeare: test loss (nats/char)" in section
    assert "![replication_shakespeare](figures/replication_shakespeare.png)" in section
    assert (out_dir / "figures" / "replication_shakespeare.png").is_file()
    metrics = json.loads((out_dir / "metrics" / "shakespeare" / "rmsnorm.json").read_text())
    assert (metrics["replicated"], metrics["verdict_combined"]) == (
        "no", combined.loc[("shakespeare", "rmsnorm"), "verdict"])
    datasets = {d: json.loads((out_dir / "metrics" / f"{d}.json").read_text())["replication"]
                for d in ("shakespeare", "arithmetic")}
    assert datasets == {"shakespeare": "not replicated: rmsnorm",
                        "arithmetic": "all replicated"}


def test_the_report_combines_each_replicates_learning_speed(built_replicated):
    _, out_dir, out = built_replicated
    speed = pd.read_csv(out["speed_replication"])
    assert list(speed.columns) == rep.SPEED_REPLICATION_COLUMNS
    assert list(speed["variant"]) == ["gelu", "rmsnorm"] and (speed["dataset"] == "arithmetic").all()
    ratios = speed.set_index("variant")["ratios"].str.split(" / ", expand=True).astype(float)
    # synthetic_study.learn_step: rmsnorm learns 50 steps later in replicate 1 than in 0
    assert ratios.loc["rmsnorm", 1] > ratios.loc["rmsnorm", 0]
    assert speed.set_index("variant").loc["rmsnorm", "ratio"] == pytest.approx(
        math.sqrt(ratios.loc["rmsnorm", 0] * ratios.loc["rmsnorm", 1]), rel=1e-2)
    md = out["report"].read_text()
    section = md.split("## Replication")[1].split("### arithmetic")[1]
    assert "| variant | ratio by replicate | verdicts by replicate | agree |" in section
    findings = md.split("## Findings")[1].split("## Replication")[0]
    assert findings.count("- **Learning speed over all 2 replicates**") == 1
    doc = json.loads((out_dir / "metrics" / "arithmetic" / "rmsnorm.json").read_text())
    assert doc["speed_verdict_combined"] == speed.set_index("variant").loc["rmsnorm", "verdict"]
    assert doc["speed_replicated"] in ("yes", "no")


def test_a_replicates_runs_are_its_own_seeds_and_never_replicate_zeros(built_replicated):
    _, _, out = built_replicated
    ablation = pd.read_csv(out["ablation"])
    assert set(ablation["seed"]) == {0, 1, 2}  # replicate 0 alone in the study's tables
    per = pd.read_csv(out["replicates"])
    assert (per["n_pairs"] == 3).all()
    assert REPLICATE_1_SEEDS[0] == REPLICATE_SEED_STRIDE


def test_one_replicate_leaves_the_report_as_it_was(built):
    _, out_dir, out = built
    md = out["report"].read_text()
    findings = md.split("## Findings")[1].split("## What this study")[0]
    assert "## Replication" not in md
    assert not any(f"- **{x}" in findings for x in ("Replicated", "Not replicated", "Over all"))
    assert pd.read_csv(out["replication"]).empty
    assert pd.read_csv(out["speed_replication"]).empty  # its header only
    metrics = json.loads((out_dir / "metrics" / "shakespeare" / "gelu.json").read_text())
    assert "replicated" not in metrics and "verdict_combined" not in metrics
    assert "replication" not in json.loads((out_dir / "metrics" / "shakespeare.json").read_text())


# ---- end to end -------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_study_of_two_replicates_runs_through_dvc_and_adding_none_reruns_nothing(
        tmp_path, run_command):
    """``dvc repro`` of a tiny arithmetic study with study.replicates 2: replicate 1's stages
    write its own seeds under replicate_1/, the report gains its Replication section; then
    the same study with one replicate runs nothing again but the report."""
    from test_pipeline import new_study  # the tiny project as a fresh folder
    raw = replicated(2, seeds=[0, 1, 2], variants=["baseline", "rope"])
    raw["tracking"]["enabled"] = True
    study = new_study(tmp_path / "study", raw, run_command)
    listed = run_command(["dvc", "stage", "list", "--name-only"], study)
    assert [s for s in listed.stdout.split() if "replicate" in s] == [
        f"{c}-replicate@arithmetic-{v}-1" for c in ("tune", "train", "evaluate")
        for v in ("baseline", "rope")]
    first = run_command(["dvc", "repro"], study, timeout=1200)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    for v in ("baseline", "rope"):
        zero = json.loads((study / "runs/arithmetic" / v / "metrics.json").read_text())
        one = json.loads((study / "runs/arithmetic" / v / "replicate_1/metrics.json").read_text())
        assert sorted(zero["runs"]) == ["seed_0", "seed_1", "seed_2"]
        assert sorted(one["runs"]) == ["seed_100000", "seed_100001", "seed_100002"]
        assert one["replicate"] == 1
        best = [json.loads((study / "runs/arithmetic" / v / f / "best.json").read_text())
                for f in ("", "replicate_1")]
        assert best[1]["sampler_seed"] == best[0]["sampler_seed"] + 1
        assert best[1]["study_name"] != best[0]["study_name"]
    combined = pd.read_csv(study / "reports" / "replication.csv")
    assert list(combined["variant"]) == ["rope"] and combined["replicates"].tolist() == [2]
    report = (study / "reports" / "report.md").read_text()
    assert "## Replication" in report and "### arithmetic: answer loss" in report
    shown = run_command(["dvc", "metrics", "show", "--json"], study)
    files = json.loads(shown.stdout)[""]["data"]
    replication = files["reports/metrics/arithmetic.json"]["data"]["replication"]
    agree = bool(combined["agree"].iloc[0])
    assert replication == ("all replicated" if agree else "not replicated: rope")
    assert files["reports/metrics/arithmetic/rope.json"]["data"]["replicated"] == (
        "yes" if agree else "no")
    # every MLflow run of replicate 1 carries it: trials, parents, final runs
    import sqlite3
    with sqlite3.connect(study / "mlflow.db") as db:
        tags = db.execute("select run_uuid, key, value from tags").fetchall()
    replicate_of = {run: value for run, key, value in tags if key == "replicate"}
    stage_of = {run: value for run, key, value in tags if key == "stage"}
    assert {replicate_of.get(run) for run, s in stage_of.items() if s != "report"} == {"0", "1"}
    # back to one replicate: replicate 0's stages are as they were (nothing re-runs but the
    # report, whose params changed)
    raw["study"].update(replicates=1, replicate_stages=[])
    import yaml
    (study / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    status = run_command(["dvc", "status", "--json"], study)
    # the check stage reads every param; its output does not change, so it re-runs alone
    assert list(json.loads(status.stdout)) == ["check", "report"], status.stdout
