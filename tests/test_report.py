"""The report stage (lmablate.stages.report) on the synthetic study (synthetic_study.py): the files
it writes, that it raises without results, that the same runs give the same bytes, and the
lines it ends with."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lmablate.report import collect
from lmablate.stages import report

from synthetic_study import ENV, VARIANTS, make_cfg, write_runs


def test_ablation_csv_schema_and_one_row_per_run(built):
    _, out_dir, out = built
    df = pd.read_csv(out["ablation"])
    assert list(df.columns) == collect.ABLATION_COLUMNS == [
        "dataset", "variant", "seed", "n_params", "n_params_non_embedding", "flops_per_token",
        "lr", "d_model", "steps", "tokens", "train_flops", "budget_flops", "val_loss", "test_loss",
        "answer_loss", "perplexity", "bits_per_char", "char_accuracy", "exact_match",
        "train_seconds", "tokens_per_second"]
    assert len(df) == 2 * 3 * 3
    assert not df.duplicated(["dataset", "variant", "seed"]).any()
    assert set(df["variant"]) == set(VARIANTS)  # the stale "old" variant is ignored
    text = df["dataset"] == "shakespeare"
    assert df.loc[text, ["exact_match", "char_accuracy", "answer_loss"]].isna().all().all()
    assert df.loc[~text, ["exact_match", "answer_loss"]].notna().all().all()
    # config order: datasets as configured, baseline first
    assert list(pd.unique(df["dataset"])) == ["shakespeare", "arithmetic"]
    assert list(pd.unique(df["variant"])) == list(VARIANTS)
    assert (out_dir / "ablation.csv").read_text().splitlines()[1].split(",")[3] == "105000"


def test_missing_runs_are_reported_and_no_runs_raise(tmp_path):
    write_runs(tmp_path / "runs", seeds=(0, 1, 2))
    cfg = make_cfg(seeds=(0, 1, 2, 3))
    out = report.build_report(cfg, tmp_path / "runs", tmp_path / "reports")
    md = out["report"].read_text()
    assert "6 configured run(s) have no results" in md  # seed 3 of 2 datasets x 3 variants
    with pytest.raises(FileNotFoundError, match="no results"):
        report.build_report(cfg, tmp_path / "empty", tmp_path / "r2")


def test_the_report_stage_ends_with_the_report_path_and_the_mlflow_ui_command(monkeypatch):
    paths = {"report": Path("reports/report.md"), "figures": [Path("a.png"), Path("b.png")]}
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = make_cfg()
    view = "#/experiments/3/runs?viewStateShareKey=final-runs&workflowType=machine_learning"
    assert report.where_to_look(cfg, paths, view).splitlines() == [
        "report: reports/report.md (2 figures, tables next to it)",
        "MLflow UI: mlflow ui --backend-store-uri sqlite:///mlflow.db",
        f"  then open http://127.0.0.1:5000/{view}"]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://10.0.0.5:5000/")
    assert report.where_to_look(cfg, paths, view).splitlines()[1:] == [
        f"MLflow UI: http://10.0.0.5:5000/{view}"]
    charts = {"arithmetic": "#/experiments/3/runs?viewStateShareKey=final-runs-arithmetic"
                            "&workflowType=machine_learning&compareRunsMode=CHART"}
    tuning = {"arithmetic": "#/experiments/3/runs?viewStateShareKey=tuning-trials-arithmetic"
                            "&workflowType=machine_learning&compareRunsMode=CHART"}
    assert report.where_to_look(cfg, paths, view, charts, tuning).splitlines()[2:] == [
        f"  validation loss, arithmetic: http://10.0.0.5:5000/{charts['arithmetic']}",
        f"  tuning trials, arithmetic: http://10.0.0.5:5000/{tuning['arithmetic']}"]
    off = dataclasses.replace(cfg, tracking=dataclasses.replace(cfg.tracking, enabled=False))
    assert len(report.where_to_look(off, paths, view, charts).splitlines()) == 1


def test_a_study_run_by_dvc_exp_run_elsewhere_says_where_to_start_the_ui(monkeypatch, tmp_path):
    """`mlflow ui` serves the artifacts of the folder it starts in: the project's, not the
    experiment's copy the report stage ran in."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("DVC_ROOT", str(tmp_path / "project"))
    monkeypatch.chdir(tmp_path)
    paths = {"report": Path("reports/report.md"), "figures": []}
    assert report.where_to_look(make_cfg(), paths).splitlines()[1] == (
        f"MLflow UI: cd {tmp_path / 'project'} && mlflow ui --backend-store-uri "
        "sqlite:///mlflow.db")


def test_the_summary_run_records_every_number_and_verdict_of_the_dvc_metrics(tmp_path):
    metrics = tmp_path / "metrics"
    (metrics / "arithmetic").mkdir(parents=True)
    (metrics / "arithmetic.json").write_text(json.dumps({"seeds": 5, "verdict": "worse: rope"}))
    (metrics / "arithmetic" / "rope.json").write_text(json.dumps(
        {"seeds": 5, "delta_answer_loss": 0.278, "verdict": "worse", "tokens_to_learn":
         "not reached", "exact_match": 0.031}))
    cfg = make_cfg()
    params, numbers, texts = report.summary_record(cfg, metrics)
    assert params == {"profile": "default", "seeds": list(cfg.seeds),
                      "datasets": list(cfg.datasets), "variants": list(cfg.study_variants),
                      "match_params": False, "replicates": 1}
    assert numbers == {"arithmetic/seeds": 5.0, "arithmetic/rope/seeds": 5.0,
                       "arithmetic/rope/delta_answer_loss": 0.278,
                       "arithmetic/rope/exact_match": 0.031}
    assert texts == {"arithmetic/verdict": "worse: rope", "arithmetic/rope/verdict": "worse",
                     "arithmetic/rope/tokens_to_learn": "not reached"}


def test_the_same_runs_give_byte_identical_reports(built, tmp_path):
    """Figures with random jitter included: the report is a pure function of the runs, and
    drawing it leaves numpy's global random state as it was."""
    cfg, out_dir, _ = built
    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    report.build_report(cfg, out_dir.parent / "runs", tmp_path / "again", environment=ENV)
    assert np.array_equal(np.random.get_state()[1], before)
    written = sorted(p.relative_to(tmp_path / "again") for p in (tmp_path / "again").rglob("*")
                     if p.is_file())
    assert Path("figures") / "answer_loss_arithmetic.png" in written
    for rel in written:
        assert (tmp_path / "again" / rel).read_bytes() == (out_dir / rel).read_bytes(), rel


def test_every_file_the_report_writes_is_an_output_of_the_report_stage(built):
    """A table missing from dvc.yaml's outs is neither cached nor restored by DVC."""
    import yaml
    _, out_dir, out = built
    outs = yaml.safe_load((Path(__file__).resolve().parents[1] / "dvc.yaml").read_text())[
        "stages"]["report"]["outs"]
    declared = {Path(o).name for o in outs if isinstance(o, str)}
    written = {p.name for p in out_dir.iterdir()} - {"metrics"}  # metrics: DVC metrics
    assert written <= declared, sorted(written - declared)


def test_the_report_says_which_profile_it_reports(built):
    cfg, _, paths = built
    intro = paths["report"].read_text().splitlines()[2]
    assert f", of the {cfg.profile} profile (`study.profile`). Generated by" in intro


def test_a_run_s_verdict_tag_gives_the_verdict_with_its_rounded_difference_and_share():
    """The label MLflow's runs view groups the final runs by, from the DVC metrics files."""
    rope = {"seeds": 6, "test_loss": 2.0823793874761765, "delta_test_loss": -0.10756380319900612,
            "verdict": "better"}
    assert report.verdict_label(rope, "rope") == "better: Δ -0.108 (-4.9%)"
    base = {"seeds": 6, "test_loss": 0.63, "answer_loss": 0.05462519874595497,
            "delta_answer_loss": 0.0, "verdict": "baseline"}
    assert report.verdict_label(base, "baseline") == "baseline: 0.055"  # the headline loss
    assert report.verdict_label({"seeds": 1, "verdict": "too few seeds"}, "rope") == \
        "too few seeds"
    assert report.verdict_label({"seeds": 1}, "rope") == "no comparison"


def test_the_verdict_tags_are_read_from_every_metrics_file_of_the_study(tmp_path):
    cfg = make_cfg()
    ds = next(iter(cfg.datasets))
    (tmp_path / ds).mkdir()
    (tmp_path / ds / "rope.json").write_text(json.dumps(
        {"test_loss": 2.0, "delta_test_loss": 0.5, "verdict": "worse"}))
    assert report.run_verdicts(cfg, tmp_path) == {f"{ds}/rope": "worse: Δ +0.500 (+33.3%)"}
