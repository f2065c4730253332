"""MLflow tracking: the records a tracker writes, in this process or through the sidecar process
that stage commands use (lmablate.tracking.sidecar.Sidecar), and its errors."""

from __future__ import annotations

import contextlib
import importlib
import itertools
import json
import os
import signal
import subprocess
import sys
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from lmablate.config.study import TrackingConfig
from lmablate.tracking import sidecar as sidecar_module
from lmablate.tracking import mlflow_store
from lmablate.tracking import trackers as tracking
from lmablate.tracking.sidecar import Sidecar
from lmablate.tracking.trackers import MlflowTracker, TrackingError

INTERRUPTED = "lmablate: interrupted; run the same command (or dvc repro) again to resume"


def record_a_study(tracker: MlflowTracker, artifact: Path) -> None:
    """The calls the stages make: a parent run with nested runs from other threads, a run
    reopened by id, a failed run, params, metrics at steps, tags and an artifact."""
    with tracker.run("tune", {"stage": "tune"}) as parent:
        tracker.log_params({"n_trials": 2, "lr_high": 0.1})

        def trial(i: int) -> None:
            with tracker.run(f"trial-{i}", {"trial": i}, parent_run_id=parent):
                tracker.log_metrics({"val_loss": 3.0 - i, "skip": None}, step=10)
                tracker.log_metrics({"val_loss": 2.5 - i}, step=20)
        threads = [threading.Thread(target=trial, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        with tracker.run("inner", nested=True):
            tracker.set_tags({"state": "PRUNED"})
    with tracker.run("train", {"seed": 0}) as run_id:
        tracker.log_artifact(artifact, "checkpoint")
    with tracker.run("train", {"stage": "final"}, run_id=run_id):  # evaluate reopens it
        tracker.log_metrics({"test_loss": 1.25})
    with tracker.open_run("seed-1", {"seed": 1}) as bound:
        bound.log_params({"lr": 0.003})
        bound.log_metrics({"val_loss": 2.0}, step=5)
    with pytest.raises(ZeroDivisionError), tracker.run("diverged"):
        1 / 0


def records(db: Path) -> list[tuple]:
    """Every run's name, status, nesting, tags, params, metrics and artifact files, in a form
    that two stores can be compared in (run ids and times left out)."""
    with sqlite3.connect(db) as con:
        runs = con.execute("select run_uuid, name, status, artifact_uri from runs").fetchall()
        names = {uuid: name for uuid, name, _, _ in runs}
        out = []
        for uuid, name, status, uri in runs:
            tags = dict(con.execute("select key, value from tags where run_uuid=?", (uuid,)))
            parent = names.get(tags.pop("mlflow.parentRunId", None))
            params = sorted(con.execute("select key, value from params where run_uuid=?",
                                        (uuid,)))
            metrics = sorted(con.execute("select key, value, step from metrics where run_uuid=?",
                                         (uuid,)))
            where = mlflow_store.artifact_dir(f"sqlite:///{db}", uri)
            files = sorted(str(p.relative_to(where)) for p in where.rglob("*") if p.is_file())
            out.append((name, status, parent, sorted(tags.items()), params, metrics, files))
    return sorted(out, key=repr)


@pytest.fixture
def artifact(tmp_path):
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(b"weights")
    return path


def test_the_sidecar_writes_the_records_an_in_process_tracker_writes(tmp_path, artifact,
                                                                       monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    dbs = {}
    for arm in ("local", "sidecar"):
        arm_dir = tmp_path / arm
        arm_dir.mkdir()
        monkeypatch.chdir(arm_dir)  # MLflow's default artifact root is ./mlruns
        cfg = TrackingConfig(uri=f"sqlite:///{arm_dir / 'mlflow.db'}", experiment="study")
        monkeypatch.setattr(sidecar_module, "_SIDECAR", Sidecar((cfg.tracking_uri, cfg.experiment))
                            if arm == "sidecar" else None)
        tracker = tracking.make_tracker(cfg)
        assert isinstance(tracker._store, sidecar_module.RemoteStore) == (arm == "sidecar")
        record_a_study(tracker, artifact)
        dbs[arm] = records(arm_dir / "mlflow.db")
    assert dbs["sidecar"] == dbs["local"]
    by_name = {r[0]: r for r in dbs["sidecar"]}
    assert len(dbs["sidecar"]) == 7
    assert by_name["trial-0"][2] == by_name["inner"][2] == "tune"  # nested under the parent
    assert by_name["diverged"][1] == "FAILED" and by_name["train"][1] == "FINISHED"
    assert ("test_loss", 1.25, 0) in by_name["train"][5]
    assert by_name["train"][6] == ["checkpoint/checkpoint.pt"]
    tags = dict(by_name["seed-1"][3])
    assert tags["seed"] == "1" and tags["mlflow.runName"] == "seed-1"
    assert "mlflow.user" in tags and "mlflow.source.name" in tags  # MLflow's context tags


def test_the_experiment_is_created_as_a_model_training_one_so_the_ui_opens_on_runs(tmp_path):
    import mlflow
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow_store.MlflowStore(uri, "study")
    mlflow_store.MlflowStore(uri, "study")  # found again, not created twice
    (exp,) = mlflow.MlflowClient(uri).search_experiments(filter_string="name = 'study'")
    assert exp.tags[mlflow_store.EXPERIMENT_KIND_TAG] == "custom_model_development"


def test_the_experiment_carries_the_saved_runs_view_its_url_opens(tmp_path):
    import mlflow
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    exp_id = client.create_experiment("study")  # made elsewhere: the view is added when opened
    store = mlflow_store.MlflowStore(uri, "study")
    view = json.loads(client.get_experiment(exp_id).tags[mlflow_store.RUNS_VIEW_TAG])
    assert view["searchFilter"] == "tags.stage = 'final' AND tags.replicate = '0'"
    assert "metrics.`test_loss`" in view["selectedColumns"]
    assert "params.`peak_lr`" in view["selectedColumns"]
    assert store.runs_view_url() == (f"#/experiments/{exp_id}/runs?viewStateShareKey="
                                     f"{mlflow_store.RUNS_VIEW_KEY}&workflowType=machine_learning")
    # the filter is one MLflow's search accepts, and it finds the final runs only
    final = store.start_run("final", {"stage": "final", "replicate": "0"})
    store.start_run("trial", {"stage": "tune"})
    store.start_run("retuned", {"stage": "final", "replicate": "1"})
    found = client.search_runs([exp_id], filter_string=view["searchFilter"])
    assert [r.info.run_id for r in found] == [final]


STUDY_COLOURS = {"baseline": "#1a1a1a", "swiglu": "#2e7ebc"}
SUMMARIES = {"test_loss": 1.5, "bits_per_char": 2.1, "train_seconds": 60.0, "perplexity": 4.5}
ARITHMETIC_ONLY = {"exact_match": 0.5, "answer_loss": 0.4, "exact_match_add": 0.6}


def record_final_runs(store: mlflow_store.MlflowStore) -> dict[tuple[str, str, int], str]:
    """Final runs as train and evaluate record them: curves per step, summaries once at the
    last step (arithmetic's with its own), a replicate of the baseline and a tuning trial."""
    ids = {}
    for dataset, variant, seed in itertools.product(("shakespeare", "arithmetic"),
                                                    STUDY_COLOURS, (0, 1)):
        run = store.start_run(f"{dataset}-{variant}-seed{seed}", {
            "dataset": dataset, "variant": variant, "seed": str(seed), "stage": "final",
            "replicate": "0"})
        curves = [(k, 3.0 / step, 0, step) for step in (10, 20, 30)
                  for k in ("val_loss", "train_loss", "lr")]
        summaries = {**SUMMARIES, **(ARITHMETIC_ONLY if dataset == "arithmetic" else {})}
        store.log_batch(run, metrics=curves + [(k, v, 0, 30) for k, v in summaries.items()])
        store.end_run(run, "FINISHED")
        ids[dataset, variant, seed] = run
    store.start_run("retuned", {"dataset": "arithmetic", "variant": "baseline", "seed": "0",
                                "stage": "final", "replicate": "1"})
    store.start_run("trial", {"dataset": "arithmetic", "stage": "tune"})
    return ids


def test_the_tuning_view_draws_a_datasets_trials_as_parallel_coordinates_of_lr_width_objective(
        tmp_path):
    import mlflow
    from lmablate.tracking import mlflow_views
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    store = mlflow_store.MlflowStore(uri, "study")
    trials = {}
    for dataset in ("shakespeare", "arithmetic"):
        for replicate in ("0", "1"):
            parent = store.start_run(f"tune-{dataset}-baseline",
                                     {"dataset": dataset, "stage": "tune", "replicate": replicate})
            store.end_run(parent, "FINISHED")
            for slot in (0, 8):
                run = store.start_run(f"trial-{slot}", {"dataset": dataset, "stage": "tune",
                                                        "replicate": replicate, "rung": "0"})
                store.log_batch(run, metrics=[("val_loss", 2.0, 0, 10), ("objective", 2.0, 0, 10),
                                              (f"only_{dataset}", 1.0, 0, 10)])
                store.end_run(run, "FINISHED")
                trials[dataset, replicate, slot] = run
    urls = store.save_views(["shakespeare", "arithmetic"], ["baseline"], {"baseline": "#1a1a1a"})
    client = mlflow.MlflowClient(uri)
    tags = client.get_experiment(store.experiment_id).tags
    for dataset in ("shakespeare", "arithmetic"):
        assert urls["tuning"][dataset].endswith(
            f"viewStateShareKey=tuning-trials-{dataset}&workflowType=machine_learning"
            "&compareRunsMode=CHART")
        view = json.loads(tags[f"mlflow.sharedViewState.tuning-trials-{dataset}"])
        found = client.search_runs([store.experiment_id], filter_string=view["searchFilter"])
        assert sorted(r.info.run_id for r in found) == sorted(
            trials[dataset, "0", slot] for slot in (0, 8))  # no parent, no other replicate
        card, *rest = view["compareRunCharts"]
        assert card["type"] == "PARALLEL" and card["showAllRuns"]
        assert card["selectedParams"] == ["peak_lr", "d_model", "budget_fraction"]
        assert card["selectedMetrics"] == [mlflow_views.OBJECTIVE_METRIC]
        shown, more = view["compareRunSections"]
        assert card["metricSectionId"] == shown["uuid"] and shown["display"]
        # every metric the dataset's trials logged has its card, in a closed section, so the
        # UI adds none of its own above the fold
        assert {(c["metricKey"], c["type"]) for c in rest} == {
            ("objective", "BAR"), ("val_loss", "LINE"), (f"only_{dataset}", "BAR")}
        assert {c["metricSectionId"] for c in rest} == {more["uuid"]} and not more["display"]
        assert view["selectedColumns"][-1] == "metrics.`objective`"
    with pytest.raises(ValueError, match="quote"):
        mlflow_views.tuning_view("o'neill")


def test_the_study_views_open_on_validation_loss_with_groups_closed_and_runs_coloured(tmp_path):
    import mlflow
    from lmablate.tracking import mlflow_views
    from lmablate.report import families
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    store = mlflow_store.MlflowStore(uri, "study")
    ids = record_final_runs(store)
    datasets, variants = ["shakespeare", "arithmetic"], list(STUDY_COLOURS)
    urls = store.save_views(datasets, variants, STUDY_COLOURS)
    exp_id = store.experiment_id
    assert urls == {
        "runs": f"#/experiments/{exp_id}/runs?viewStateShareKey=final-runs"
                "&workflowType=machine_learning",
        "shakespeare": f"#/experiments/{exp_id}/runs?viewStateShareKey=final-runs-shakespeare"
                       "&workflowType=machine_learning&compareRunsMode=CHART",
        "arithmetic": f"#/experiments/{exp_id}/runs?viewStateShareKey=final-runs-arithmetic"
                      "&workflowType=machine_learning&compareRunsMode=CHART",
        "tuning": {d: f"#/experiments/{exp_id}/runs?viewStateShareKey=tuning-trials-{d}"
                      "&workflowType=machine_learning&compareRunsMode=CHART" for d in datasets}}
    client = mlflow.MlflowClient(uri)
    tags = client.get_experiment(exp_id).tags
    runs_view = json.loads(tags["mlflow.sharedViewState.final-runs"])
    per_dataset = {d: json.loads(tags[f"mlflow.sharedViewState.final-runs-{d}"])
                   for d in datasets}
    curves = {"val_loss", "train_loss", "lr"}
    for view, logged in [(runs_view, {*curves, *SUMMARIES, *ARITHMETIC_ONLY}),
                         (per_dataset["shakespeare"], {*curves, *SUMMARIES}),
                         (per_dataset["arithmetic"], {*curves, *SUMMARIES, *ARITHMETIC_ONLY})]:
        cards = view["compareRunCharts"]
        # the curves first, validation loss leading, in the first section, which is open
        assert [(c["type"], c["metricKey"]) for c in cards[:3]] == [
            ("LINE", "val_loss"), ("LINE", "train_loss"), ("LINE", "lr")]
        sections = view["compareRunSections"]
        assert {c["metricSectionId"] for c in cards[:3]} == {sections[0]["uuid"]}
        assert sections[0]["display"]
        # every metric has its card (the UI adds a chart for one that has none): the curves as
        # lines, no summary drawn against step
        assert {c["metricKey"] for c in cards} == logged
        assert {c["metricKey"] for c in cards if c["type"] == "LINE"} == curves
        assert not any(c["deleted"] or c["isGenerated"] for c in cards)
        # the headline summaries next, as bars; the rest in the last section, closed
        assert [c["metricKey"] for c in cards[3:6]] == ["test_loss", "bits_per_char",
                                                        *(["answer_loss"] if "answer_loss"
                                                          in logged else ["train_seconds"])]
        more = next(c for c in cards if c["metricKey"] == "perplexity")
        assert more["metricSectionId"] == sections[-1]["uuid"] and not sections[-1]["display"]
        assert view["isAccordionReordered"]  # else the UI sorts the sections by name
        assert view["runsHiddenMode"] == "SHOW_ALL" and view["runListHidden"]
        order = view["columnOrder"]
        assert order[:2] == ["attributes.`Run Name`", "runDateAndNestInfo"]
        assert set(view["columnWidths"]) == set(order)
        assert order.index("metrics.`test_loss`") < order.index("params.`peak_lr`")
    # the table: groups by dataset x variant, each closed, dataset and variant on the left
    assert runs_view["groupsExpanded"] == {
        f"tag.dataset.{d},tag.variant.{v}": False for d in datasets for v in variants}
    assert runs_view["columnOrder"][2:5] == ["tags.`dataset`", "tags.`variant`", "tags.`seed`"]
    assert runs_view["useGroupedValuesInCharts"] is True
    # a dataset's view draws its own runs, ungrouped, each in its variant's colour
    for dataset, view in per_dataset.items():
        assert view["groupBy"] is None and view["useGroupedValuesInCharts"] is False
        assert view["columnOrder"][2:4] == ["tags.`variant`", "tags.`seed`"]
        found = client.search_runs([exp_id], filter_string=view["searchFilter"])
        assert sorted(r.info.run_id for r in found) == sorted(
            run for (d, _, _), run in ids.items() if d == dataset)
        for run in found:
            assert (run.data.tags["mlflow.runColor"]
                    == STUDY_COLOURS[run.data.tags["variant"]])
    assert "metrics.`exact_match`" not in per_dataset["shakespeare"]["selectedColumns"]
    assert "metrics.`exact_match`" in per_dataset["arithmetic"]["selectedColumns"]
    # written again by a later report: the same tags; a later store keeps them
    assert store.save_views(datasets, variants, STUDY_COLOURS) == urls
    mlflow_store.MlflowStore(uri, "study")
    assert client.get_experiment(exp_id).tags == tags
    assert families.hex_colours({"baseline": (0.1, 0.1, 0.1)}) == {"baseline": "#1a1a1a"}
    with pytest.raises(ValueError, match="quote"):
        mlflow_views.dataset_view("o'brien")


def test_the_runs_view_groups_by_verdict_so_each_group_s_label_carries_it(tmp_path):
    import mlflow
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    store = mlflow_store.MlflowStore(uri, "study")
    ids = record_final_runs(store)
    datasets, variants = ["shakespeare", "arithmetic"], list(STUDY_COLOURS)
    verdicts = {f"{d}/{v}": ("baseline" if v == variants[0] else "no significant difference")
                for d in datasets for v in variants}
    verdicts["arithmetic/" + variants[-1]] = "worse"
    store.save_views(datasets, variants, STUDY_COLOURS, verdicts)
    client = mlflow.MlflowClient(uri)
    view = json.loads(client.get_experiment(store.experiment_id).tags[
        "mlflow.sharedViewState.final-runs"])
    assert [k["groupByData"] for k in view["groupBy"]["groupByKeys"]] == [
        "dataset", "variant", "verdict"]
    assert view["groupsExpanded"] == {
        f"tag.dataset.{d},tag.variant.{v},tag.verdict.{verdicts[f'{d}/{v}']}": False
        for d in datasets for v in variants}
    assert view["columnOrder"][2] == "tags.`seed`"  # dataset and variant: in the label
    for (d, v, _), run_id in ids.items():
        assert client.get_run(run_id).data.tags["verdict"] == verdicts[f"{d}/{v}"]
    retuned, = client.search_runs([store.experiment_id], "tags.replicate = '1'")
    assert "verdict" not in retuned.data.tags  # another replicate: not the study's verdict


def test_the_sidecar_answers_the_runs_view_url_as_the_store_does(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setattr(sidecar_module, "_SIDECAR", Sidecar())
    monkeypatch.chdir(tmp_path)
    tracker = tracking.make_tracker(TrackingConfig(uri=uri, experiment="study"))
    assert tracker.runs_view_url() == mlflow_store.MlflowStore(uri, "study").runs_view_url()
    assert tracking.NullTracker().runs_view_url() is None
    urls = tracker.save_views(["arithmetic"], ["baseline"], {"baseline": "#1a1a1a"})
    assert urls == mlflow_store.MlflowStore(uri, "study").save_views(
        ["arithmetic"], ["baseline"], {"baseline": "#1a1a1a"})
    tuning = urls.pop("tuning")
    assert all("workflowType=machine_learning" in url
               for url in [*urls.values(), *tuning.values()])
    assert tracking.NullTracker().save_views(["arithmetic"], ["baseline"], {}) == {}


def test_a_reopened_run_keeps_its_duration(tmp_path):
    """evaluate adds its metrics to train's run: the UI's Duration stays the training's."""
    import mlflow
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    store = mlflow_store.MlflowStore(uri, "study")
    run_id = store.start_run("seed-0", {})
    store.end_run(run_id, "FINISHED")
    ended = mlflow.MlflowClient(uri).get_run(run_id).info.end_time
    time.sleep(0.05)
    assert store.start_run("seed-0", {"stage": "final"}, run_id) == run_id
    store.log_batch(run_id, metrics=[("test_loss", 1.5, 0, 10)])
    store.end_run(run_id, "FINISHED")
    info = mlflow.MlflowClient(uri).get_run(run_id).info
    assert (info.status, info.end_time) == ("FINISHED", ended)
    # a run that never ended (killed) ends now when reopened and ended
    other = store.start_run("seed-1", {})
    assert store.start_run("seed-1", {}, other) == other
    store.end_run(other, "FINISHED")
    assert mlflow.MlflowClient(uri).get_run(other).info.end_time > ended


def test_an_unreachable_store_fails_when_the_tracker_is_made(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = TrackingConfig(uri="http://127.0.0.1:9", experiment="study")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setattr(sidecar_module, "_SIDECAR", Sidecar((cfg.tracking_uri, cfg.experiment)))
    with pytest.raises(TrackingError, match=r"MLflow tracking store 'http://127.0.0.1:9' cannot"
                                            r" be used .*tracking.enabled: false"):
        tracking.make_tracker(cfg)


def test_a_sidecar_that_died_gives_a_tracking_error_not_a_hang(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = TrackingConfig(uri=f"sqlite:///{tmp_path / 'mlflow.db'}", experiment="study")
    sidecar = Sidecar()
    monkeypatch.setattr(sidecar_module, "_SIDECAR", sidecar)
    monkeypatch.chdir(tmp_path)
    tracker = tracking.make_tracker(cfg)
    sidecar._proc.kill()
    sidecar._proc.wait()
    with pytest.raises(TrackingError, match="sidecar process exited .* before answering "
                                            "'start_run'"):
        with tracker.run("late"):
            pass


def test_logging_outside_a_run_is_an_error(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    tracker = MlflowTracker(TrackingConfig(uri=f"sqlite:///{tmp_path / 'mlflow.db'}"))
    with pytest.raises(TrackingError, match="no active MLflow run in this thread"):
        tracker.log_metrics({"val_loss": 1.0})
    with tracker.run("outer"), pytest.raises(TrackingError, match="already active"):
        with tracker.run("second"):
            pass


def as_in_a_terminal() -> None:
    """SIGINT at its default, as for a command a terminal runs: a shell without job control
    starts its background jobs (a CI script run with ``&``, say) with SIGINT ignored, and the
    children inherit that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_a_command_interrupted_with_ctrl_c_records_its_run_as_killed(project, start_lmablate):
    # Ctrl-C in a terminal reaches the whole process group, the sidecar included: the sidecar
    # must outlive the command, which ends its runs KILLED through it.
    from conftest import budgets

    def change(raw):
        raw["tracking"].update(enabled=True)
        raw["train"].update(budget_flops=budgets(10**6), eval_interval=1)
        raw["runtime"] = {"workers": 1}
    project.write_params(change)
    (project.path / "best.json").write_text(json.dumps({"lr": 1e-3, "d_model": 16}))
    proc = start_lmablate(["train", "arithmetic", "baseline", "--tokens", "tokens", "--best",
                           "best.json", "--checkpoints", "ck", "--history", "history.csv",
                           "--grad-stats", "grads.csv"], project.path, start_new_session=True,
                          preexec_fn=as_in_a_terminal)
    db = project.path / "mlflow.db"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:  # until training has begun
        if db.exists():
            with contextlib.suppress(sqlite3.OperationalError), sqlite3.connect(db) as con:
                if con.execute("select count(*) from metrics").fetchone()[0]:
                    break
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and err.strip().splitlines()[-1] == INTERRUPTED, err[-3000:]
    with sqlite3.connect(db) as con:
        assert con.execute("select status from runs").fetchall() == [("KILLED",)]


def _open_store_after(barrier, uri: str) -> str:
    importlib.import_module("mlflow")  # before the barrier, so that the opens start together

    barrier.wait()
    return mlflow_store.MlflowStore(uri, "study").experiment_id


def test_processes_opening_a_new_sqlite_store_at_once_all_get_the_one_experiment(tmp_path):
    """MLflow creates a new SQLite store's tables on first use: processes that open the same new
    file at once (the train stage's worker processes) take turns instead of failing with
    "table ... already exists", and find one experiment, not one each."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Manager().Barrier(3)
    with ProcessPoolExecutor(3, mp_context=ctx) as pool:
        ids = list(pool.map(_open_store_after, [barrier] * 3, [uri] * 3))
    assert len(ids) == 3 and len(set(ids)) == 1


@pytest.mark.parametrize("level", [None, "INFO"])
def test_mlflow_s_own_info_lines_stay_out_of_the_terminal_unless_asked_for(tmp_path, level):
    """A first use of a SQLite store logs MLflow's table creation at INFO; a stage shows it only
    with MLFLOW_LOGGING_LEVEL=INFO."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_LOGGING_LEVEL"}
    if level:
        env["MLFLOW_LOGGING_LEVEL"] = level
    code = ("from lmablate.tracking.mlflow_store import MlflowStore; "
            "MlflowStore('sqlite:///fresh.db', 'x'); print('opened')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout == "opened\n", proc.stderr
    assert ("Creating initial MLflow database tables" in proc.stderr) == (level == "INFO")


def test_a_run_records_every_setting_that_can_change_its_result():
    """One rule for all: a new key of TrainConfig, DatasetConfig or EvaluateConfig is a param of
    every run without a word (fingerprint.run_params), unless marked as no result."""
    import dataclasses
    from lmablate.config import params
    from lmablate.config.study import EvaluateConfig
    from lmablate.config.datasets import DatasetConfig
    from lmablate.core.fingerprint import NOT_A_RESULT, result_fields, run_params
    from lmablate.config.train_config import TrainConfig
    from lmablate.tune.tuning import trial_train_config
    from conftest import tiny_params
    cfg = params.parse(tiny_params())
    logged = run_params(cfg, "arithmetic")

    def keys(cls, prefix=""):
        return {prefix + f.name for f in dataclasses.fields(cls)
                if f.init and f.metadata.get("fingerprint", True)}
    # the run logs the tuned peak as peak_lr, and the model's fields beside these
    assert set(logged) == ((keys(TrainConfig) - {"lr"}) | keys(DatasetConfig, "data.")
                           | keys(EvaluateConfig, "evaluate.") | {"match_params"})
    assert logged["budget_flops"] == cfg.train.budget_flops["arithmetic"]
    assert logged["weight_decay"] == cfg.train.weight_decay and "warmup_fraction" in logged
    assert logged["data.split"] == {"val": 0.1, "test": 0.0} and "data.digits" in logged
    assert "evaluate.max_problems" in logged and "data.name" in logged
    trial = run_params(cfg, "arithmetic", trial_train_config(cfg, "arithmetic", 10))
    assert trial["eval_interval"] == max(1, 10 // cfg.tune.reports)
    tune = result_fields(cfg.tune)
    assert "storage" not in tune and NOT_A_RESULT  # where results go changes none
    assert {"rungs", "bracket_seeds", "lr_low", "sampler_seed"} <= set(tune)


def test_a_relative_store_is_the_project_s_in_a_dvc_experiment(monkeypatch, tmp_path):
    """dvc exp run --temp computes in .dvc/tmp/exps/...: its runs go to the project's store."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    cfg = TrackingConfig()
    assert cfg.tracking_uri == "sqlite:///mlflow.db"
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    assert cfg.tracking_uri == f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://10.0.0.5:5000")
    assert cfg.tracking_uri == "http://10.0.0.5:5000"


def test_a_moved_study_opens_with_working_artifact_links(tmp_path, artifact, monkeypatch,
                                                          run_command):
    """Record a run with artifacts, move the study's folder, start MLflow's server in the new
    one as the report stage says (mlflow ui --backend-store-uri sqlite:///mlflow.db) and fetch
    the artifacts through it."""
    import socket
    import urllib.request

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    first = tmp_path / "study"
    first.mkdir()
    monkeypatch.chdir(first)
    tracker = tracking.make_tracker(TrackingConfig(uri="sqlite:///mlflow.db", experiment="moved"))
    with tracker.run("study-summary") as run_id:
        tracker.log_artifact(artifact)
        tracker.log_artifact(artifact, "figures")
    moved = tmp_path / "elsewhere" / "study"
    moved.parent.mkdir()
    first.rename(moved)
    monkeypatch.chdir(moved)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([str(Path(sys.executable).parent / "mlflow"), "server",
                               "--backend-store-uri", "sqlite:///mlflow.db", "--port",
                               str(port), "--workers", "1"], cwd=moved,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        # a loaded 2-core machine can take over a minute to start the server: wait on a
        # deadline, not a count of tries
        deadline = time.monotonic() + 300
        while True:
            try:
                urllib.request.urlopen(f"{base}/health", timeout=5)
                break
            except OSError:
                assert server.poll() is None, "mlflow server exited before it answered"
                assert time.monotonic() < deadline, "mlflow server did not answer in 300 s"
                time.sleep(0.5)
        listed = json.loads(urllib.request.urlopen(
            f"{base}/ajax-api/2.0/mlflow/artifacts/list?run_id={run_id}&path=figures").read())
        assert [f["path"] for f in listed["files"]] == ["figures/checkpoint.pt"]
        body = urllib.request.urlopen(
            f"{base}/get-artifact?path=figures/checkpoint.pt&run_uuid={run_id}").read()
        assert body == b"weights"
    finally:
        server.terminate()
        server.wait(timeout=30)
