"""The line each stage of dvc repro starts with: its place in the study and the time left
(lmablate.execution.study_plan). The plan's order against `dvc repro --dry` is in
test_pipeline.py."""

from __future__ import annotations

import json

import pytest

from lmablate.config import params
from lmablate.execution.study_plan import (PlannedStage, TIMES_FILE, clock_for, seconds_left,
                                           start_line, study_plan, tune_flops)
from lmablate.tune.rungs import is_bracket, plan

from conftest import PROFILES, profile_config, tiny_params


@pytest.mark.parametrize("name", PROFILES)
def test_a_tune_stage_plans_the_first_rungs_and_the_bracket_s_first_batches(name):
    """Checked against the batches lmablate.tune.rungs plans: every batch below the bracket, and the
    bracket's first two (its learning rates at the start); the extension batches are extra."""
    cfg = profile_config(name)
    for ds in cfg.datasets:
        shares = 0.0
        for batch in plan(cfg.tune):
            first_two = batch.index - min(b.index for b in plan(cfg.tune)
                                          if b.rung == batch.rung) < 2
            if not is_bracket(cfg.tune, batch.rung) or first_two:
                shares += len(batch.slots) * batch.fraction
        assert tune_flops(cfg, ds) == pytest.approx(shares * sum(cfg.budgets(ds)))


def test_the_default_study_plans_30_stages_check_generate_to_report():
    cfg = profile_config("default")
    names = [s.name for s in study_plan(cfg)]
    assert len(names) == 1 + 2 + 2 + 3 * 8 + 1
    assert names[:6] == ["check", "generate@shakespeare", "generate@arithmetic", "tokenize@shakespeare",
                         "tokenize@arithmetic", "tune@shakespeare-baseline"]
    assert names[-2:] == ["evaluate@arithmetic-rope", "report"]
    train = {s.name: s.flops for s in study_plan(cfg) if s.name.startswith("train@")}
    assert train["train@arithmetic-rope"] == 6 * 2.25e11


def test_time_left_takes_a_stage_s_last_time_or_its_flops_at_the_measured_rate():
    stages = [PlannedStage("tune@a", 100.0), PlannedStage("train@a", 50.0),
              PlannedStage("evaluate@a", 0.0), PlannedStage("report", 0.0)]
    assert seconds_left(stages, 0, {}) is None  # no rate yet, and stages that train
    times = {"tune@a": {"seconds": 20.0, "flops": 100.0}, "report": {"seconds": 3.0, "flops": 0}}
    # tune@a as last time; train@a at 100 FLOPs / 20 s; evaluate@a never timed; report 3 s
    assert seconds_left(stages, 0, times) == pytest.approx(20 + 10 + 0 + 3)
    times["tune@a"]["flops"] = 80.0  # other work last time: its FLOPs at the rate (80 / 20)
    assert seconds_left(stages, 0, times) == pytest.approx(25 + 12.5 + 3)
    assert seconds_left(stages, 2, times) == pytest.approx(3)
    # a tune stage that trained twice what it planned (an extended bracket): the next tune stage
    # at its pace per planned FLOP, a train stage at the FLOPs it spent per second
    times["tune@a"] = {"seconds": 20.0, "flops": 80.0, "spent": 160.0}
    assert seconds_left(stages, 0, times) == pytest.approx(100 * 20 / 80 + 50 / 8 + 3)


def test_a_tune_stage_s_spent_flops_are_its_trials(tmp_path):
    from lmablate.execution.study_plan import spent_flops
    (tmp_path / "trials.csv").write_text("number,flops\n0,1.5e9\n1,\n2,2.5e9\n")
    assert spent_flops(tmp_path / "trials.csv") == 4e9
    assert spent_flops(tmp_path / "missing.csv") is None


def test_the_start_line_says_where_the_stage_is_and_how_long_is_left():
    cfg = params.parse(tiny_params({"study": {"variants": ["baseline", "rope"]}}))
    plan_ = study_plan(cfg)
    assert [s.name for s in plan_] == [
        "check", "generate@arithmetic", "tokenize@arithmetic", "tune@arithmetic-baseline",
        "tune@arithmetic-rope", "train@arithmetic-baseline", "train@arithmetic-rope",
        "evaluate@arithmetic-baseline", "evaluate@arithmetic-rope", "report"]
    assert start_line(cfg, "tune@arithmetic-baseline", {}) == (
        "lmablate: stage 4 of 10 of the study (tune@arithmetic-baseline); 0% of its training "
        "FLOPs done, time left known once a training stage has run")
    tune = plan_[3].flops
    times = {"tune@arithmetic-baseline": {"seconds": 100.0, "flops": tune}}
    train = plan_[5].flops
    left = 100 + 2 * train / (tune / 100)  # the other tune stage as this one, trains at its rate
    done = 100 * tune / (2 * tune + 2 * train)
    assert start_line(cfg, "tune@arithmetic-rope", times) == (
        f"lmablate: stage 5 of 10 of the study (tune@arithmetic-rope); {done:.0f}% of its "
        f"training FLOPs done, about {left / 60:.0f} min left with this one")
    assert start_line(cfg, "tune@arithmetic-nope", times) is None  # no stage of the plan


def test_only_a_stage_dvc_runs_announces_itself_and_keeps_its_time(tmp_path, monkeypatch):
    cfg = params.parse(tiny_params())
    monkeypatch.delenv("DVC_ROOT", raising=False)
    assert clock_for(cfg, "train", "arithmetic", "baseline") is None  # typed by hand
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    clock = clock_for(cfg, "train", "arithmetic", "baseline")
    assert clock.line.startswith("lmablate: stage 6 of 10 of the study (train@arithmetic-baseline)")
    clock.done()
    times = json.loads((tmp_path / TIMES_FILE).read_text())
    assert list(times) == ["train@arithmetic-baseline"]
    assert times["train@arithmetic-baseline"]["flops"] == study_plan(cfg)[5].flops
    (tmp_path / TIMES_FILE).write_text("not json")  # a damaged file costs the estimate only
    assert clock_for(cfg, "report", None, None).line.endswith("left with this one")


def test_a_replicates_stages_follow_replicate_0s_in_dvc_yaml_order_and_are_announced(
        tmp_path, monkeypatch):
    cfg = params.parse(tiny_params({"study": {"replicates": 3, "replicate_stages": [1, 2]}}))
    plan_ = study_plan(cfg)
    names = [s.name for s in plan_]
    assert names[:10] == [s.name for s in study_plan(params.parse(tiny_params()))][:9] + [
        "tune-replicate@arithmetic-baseline-1"]
    # dvc.yaml's matrix order within each command: dataset x variant x replicate
    assert names[10:13] == ["tune-replicate@arithmetic-baseline-2",
                            "tune-replicate@arithmetic-rope-1",
                            "tune-replicate@arithmetic-rope-2"]
    assert names[-7:] == ["train-replicate@arithmetic-rope-1",
                          "train-replicate@arithmetic-rope-2",
                          "evaluate-replicate@arithmetic-baseline-1",
                          "evaluate-replicate@arithmetic-baseline-2",
                          "evaluate-replicate@arithmetic-rope-1",
                          "evaluate-replicate@arithmetic-rope-2", "report"]
    # a replicate trains what replicate 0 trains, at the headline budget
    flops = {s.name: s.flops for s in plan_}
    assert flops["train-replicate@arithmetic-rope-2"] == flops["train@arithmetic-rope"]
    assert flops["tune-replicate@arithmetic-rope-1"] == flops["tune@arithmetic-rope"]
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    clock = clock_for(cfg, "tune", "arithmetic", "rope", replicate=1)
    assert clock.line.startswith(
        "lmablate: stage 12 of 22 of the study (tune-replicate@arithmetic-rope-1)")


@pytest.mark.parametrize("content,note", [
    ('{"report": 5}', "has 1 entries that are not stage times"),
    ('{"train@arithmetic-baseline": {"seconds": 3, "flops": "abc"}}',
     "has 1 entries that are not stage times"),
    ('{"train@arithmetic-baseline": {"seconds": Infinity, "flops": 1e9}}',
     "has 1 entries that are not stage times"),
    ('{"train@arithmetic-baseline": {"seconds": -1, "flops": 1e9}}',
     "has 1 entries that are not stage times"),
    ("[1, 2]", "holds a list, not stage times"),
    ("not json", "cannot be read as JSON"),
    (b"\xff\xfe", "cannot be read as JSON"),
])
def test_a_damaged_times_file_is_noted_ignored_and_rewritten_and_never_stops_a_stage(
        tmp_path, monkeypatch, capsys, content, note):
    cfg = params.parse(tiny_params())
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    path = tmp_path / TIMES_FILE
    path.parent.mkdir(parents=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    clock = clock_for(cfg, "train", "arithmetic", "baseline")
    assert clock.line.startswith("lmablate: stage 6 of 10 of the study")
    err = capsys.readouterr().err
    assert err.startswith(f"lmablate: note: {path} {note}") and err.count("\n") == 1
    assert err.endswith("; ignored, and rewritten when this stage ends (it only estimates the "
                        "time left)\n")
    clock.done()
    assert list(json.loads(path.read_text())) == ["train@arithmetic-baseline"]
    assert capsys.readouterr().err == ""


def test_a_huge_times_file_is_not_read_and_the_file_keeps_only_the_plan_s_stages(
        tmp_path, monkeypatch, capsys):
    from lmablate.execution.study_plan import MAX_TIMES_BYTES
    cfg = params.parse(tiny_params())
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    path = tmp_path / TIMES_FILE
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({f"tune@x-{i}": {"seconds": 1, "flops": 1}
                                for i in range(MAX_TIMES_BYTES // 30)}))
    clock = clock_for(cfg, "train", "arithmetic", "baseline")
    assert "more than a study's stage times; ignored" in capsys.readouterr().err
    clock.done()
    # a stage of another study (or an old plan) is pruned; the plan's stages are kept
    times = json.loads(path.read_text())
    times["tune@gone-variant"] = {"seconds": 5.0, "flops": 1.0}
    path.write_text(json.dumps(times))
    clock_for(cfg, "train", "arithmetic", "rope").done()
    assert sorted(json.loads(path.read_text())) == ["train@arithmetic-baseline",
                                                    "train@arithmetic-rope"]
