"""Faults: a killed training run resumes to the same result (in process: tests/test_training.py);
a killed tuning run keeps its trials and finishes the requested count; divergence stops with a
clear error or fails a trial."""

import dataclasses
import json
import signal
import subprocess
import time
from pathlib import Path

import optuna
import pytest
import torch
import yaml
from lmablate.core.tracker import NullTracker
from lmablate.data.token_data import TokenData
from lmablate.stages import tune
from lmablate.train.numerics import numerics_kind
from lmablate.tune import rungs, tuning

from conftest import budgets

# Faults need runs long enough to be interrupted: more data, wider models, more steps.
FAULTS = {
    "study": {"variants": ["baseline"]},
    "train": {"budget_flops": budgets(200), "eval_interval": 10, "warmup_fraction": 0.1},
    # trials of 60 steps, two at a time
    "tune": {"rungs": [[4, 0.3], [1, 1.0]], "trials_per_batch": 2, "reports": 4,
             "bracket_seeds": 1, "bracket_points": 1, "heartbeat_seconds": 1},
    "runtime": {"workers": 1},
}


@pytest.fixture()
def project(make_project, tmp_path):
    project = make_project(tmp_path, FAULTS)
    (project.path / "best.json").write_text(json.dumps({"lr": 3e-3, "d_model": 16}))
    return project


def train_cmd(out: str) -> list[str]:
    return ["train", "arithmetic", "baseline", "--tokens", "tokens", "--best", "best.json",
            "--checkpoints", f"{out}/ck", "--history", f"{out}/history.csv",
            "--grad-stats", f"{out}/grad.csv"]


def wait_for(predicate, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_kill_9_during_train_then_rerun_gives_the_same_result(project, start_lmablate):
    # seconds of training: time to kill it
    project.write_params(lambda r: r["train"].update(budget_flops=budgets(1200), eval_interval=50))
    project = project.path
    reference = start_lmablate(train_cmd("ref"), project)
    assert reference.wait(timeout=300) == 0, reference.stderr.read()
    victim = start_lmablate(train_cmd("out"), project)
    resume = project / "out" / "ck" / "seed_0" / "resume.pt"
    wait_for(resume.exists, 120, "the first resume state")
    time.sleep(0.3)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert not (project / "out" / "ck" / "seed_0" / "result.json").exists()
    killed_at = torch.load(resume, weights_only=False)["step"]
    assert 0 < killed_at < 1200
    again = start_lmablate(train_cmd("out"), project)
    assert again.wait(timeout=300) == 0, again.stderr.read()
    ref = json.loads((project / "ref" / "ck" / "seed_0" / "result.json").read_text())
    out = json.loads((project / "out" / "ck" / "seed_0" / "result.json").read_text())
    assert out["summary"]["val_loss"] == pytest.approx(ref["summary"]["val_loss"], abs=1e-6)
    assert [r["step"] for r in out["history"]] == [r["step"] for r in ref["history"]]
    assert [r["val_loss"] for r in out["history"]] == pytest.approx(
        [r["val_loss"] for r in ref["history"]], abs=1e-6)
    assert not resume.exists()  # the finished seed keeps only its checkpoint and result


def test_kill_9_during_tune_keeps_trials_and_finishes_the_count(project, start_lmablate):
    cfg, project = project.cfg, project.path
    tune_cmd = ["tune", "arithmetic", "baseline", "--tokens", "tokens", "--best", "t/best.json",
                "--trials", "t/trials.csv"]
    victim = start_lmablate(tune_cmd, project)
    name = tuning.study_name(cfg, "arithmetic", "baseline",
                             TokenData.load(project / "tokens").fingerprint(), 0,
                             numerics_kind(torch.device("cpu")))
    storage = cfg.tune.storage_url

    def n_complete() -> int:
        try:
            study = optuna.load_study(study_name=name, storage=storage)
        except KeyError:
            return 0
        return sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)

    wait_for(lambda: n_complete() >= 1, 180, "a completed trial")
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    again = start_lmablate(tune_cmd, project)
    assert again.wait(timeout=300) == 0, again.stderr.read()
    study = optuna.load_study(study_name=name, storage=storage)
    states = [t.state for t in study.trials]
    assert states.count(optuna.trial.TrialState.COMPLETE) == 5  # 4 at the first rung, 1 above
    assert optuna.trial.TrialState.RUNNING not in states
    assert json.loads((project / "t" / "best.json").read_text())["n_trials"] == 5
    # the killed trial was failed and run again from its queued slot: the same bytes as a run
    # that was never killed (its own, fresh storage)
    raw = yaml.safe_load((project / "params.yaml").read_text())
    raw["tune"]["storage"] = f"sqlite:///{project / 'ref.db'}"
    (project / "ref.yaml").write_text(yaml.safe_dump(raw))
    reference = start_lmablate(["--params", "ref.yaml", *tune_cmd[:5], "--best", "r/best.json",
                                "--trials", "r/trials.csv"], project)
    assert reference.wait(timeout=300) == 0, reference.stderr.read()
    assert (project / "r" / "best.json").read_bytes() == (project / "t" / "best.json").read_bytes()


def test_final_run_divergence_names_dataset_variant_seed_and_step(project, start_lmablate):
    (project.path / "best.json").write_text(json.dumps({"lr": 1e6, "d_model": 16}))
    proc = start_lmablate(train_cmd("out"), project.path)
    assert proc.wait(timeout=300) == 2
    err = proc.stderr.read()
    assert "dataset arithmetic, variant baseline, seed 0" in err and "at step" in err


def test_diverging_trial_is_failed_with_reason_and_the_study_goes_on(project):
    cfg = dataclasses.replace(project.cfg, tune=dataclasses.replace(
        project.cfg.tune, lr_low=1e-3, lr_high=1e7, lr_limits=(1e-5, 1e7), rungs=((4, 1.0),)))
    project = project.path
    try:
        tune.run(cfg, "arithmetic", "baseline", project / "tokens", project / "b.json",
                 project / "t.csv", NullTracker())
    except RuntimeError as exc:  # every trial may diverge at such rates
        assert "no trial" in str(exc)
    name = tuning.study_name(cfg, "arithmetic", "baseline",
                             TokenData.load(project / "tokens").fingerprint(), 0,
                             numerics_kind(torch.device("cpu")))
    study = optuna.load_study(study_name=name, storage=cfg.tune.storage_url)
    failed = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL]
    assert failed, "some trial at a learning rate up to 1e7 should diverge"
    assert all("training loss is" in t.user_attrs["fail_reason"] for t in failed)
    assert all(t.user_attrs[rungs.OUTCOME] == rungs.DIVERGED for t in failed)
    assert len(study.trials) == 4  # a divergence is a result: its slot is not run again


def children(pid: int) -> set[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


def alive(pid: int) -> bool:
    """Running or sleeping; a zombie (exited, not yet reaped) counts as gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def test_kill_9_of_a_stage_takes_its_worker_processes_with_it(project, start_lmablate):
    def two_worker_processes(raw):
        raw["study"]["seeds"] = [0, 1]
        raw["runtime"].update(workers=2, parallel="processes")

    project.write_params(two_worker_processes)
    victim = start_lmablate(train_cmd("out"), project.path)
    wait_for(lambda: len(children(victim.pid)) >= 2, 60, "two worker processes")
    workers = children(victim.pid)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    wait_for(lambda: not any(alive(p) for p in workers), 10, "the workers to exit")


def test_a_trial_whose_worker_died_right_after_taking_it_is_queued_again(tmp_path):
    """A worker killed between claiming a trial and its heartbeat thread's first beat: the
    trial still has a heartbeat (claim records one first), so it goes stale and is queued again
    with its slot, instead of staying RUNNING for good."""
    from lmablate.tune.storage import claim, load_study, make_storage
    from lmablate.tune.rungs import SLOT

    study = load_study(make_storage(f"sqlite:///{tmp_path / 'o.db'}", heartbeat_seconds=1), "s")
    study.enqueue_trial({"x": 1.0}, user_attrs={SLOT: 0})
    taken = claim(study)  # ... and the worker dies here: no Heartbeat thread ever starts
    assert taken is not None
    S = optuna.trial.TrialState
    deadline = time.monotonic() + 30
    while study.get_trials(deepcopy=False)[0].state == S.RUNNING and time.monotonic() < deadline:
        time.sleep(0.5)
        optuna.storages.fail_stale_trials(study)
    trials = study.get_trials(deepcopy=False)
    assert [t.state for t in trials] == [S.FAIL, S.WAITING]
    assert trials[1].user_attrs[SLOT] == 0


def test_a_trial_another_process_finished_first_is_left_as_that_process_told_it(
        project, monkeypatch):
    """Two processes on one SQLite file can take the same queued trial (see
    lmablate.tune.storage.claim); the one that finishes second must leave the trial as the first
    told it, not fail the stage ('Cannot tell a COMPLETE trial')."""
    from lmablate.tune import trials
    from lmablate.tune.storage import claim, load_study, make_storage
    from lmablate.tune.rungs import FRACTION, RUNG, SLOT

    cfg = project.cfg
    study = load_study(make_storage(cfg.tune.storage_url, cfg.tune.heartbeat_seconds), "s")
    study.enqueue_trial({"lr": 0.01, "d_model": 16},
                        user_attrs={SLOT: 0, RUNG: 0, FRACTION: 0.5})
    taken = claim(study)
    real = trials.train_model

    def the_other_process_tells_first(*args, **kwargs):
        result = real(*args, **kwargs)
        study._storage.set_trial_state_values(taken._trial_id, optuna.trial.TrialState.COMPLETE,
                                              [1.25])
        return result

    monkeypatch.setattr(trials, "train_model", the_other_process_tells_first)
    job = trials.TuneJob(cfg, "arithmetic", "baseline", project.path / "tokens", "s", None)
    trials.run_trial(job, study, taken, TokenData.load(project.path / "tokens"),
                     torch.device("cpu"), NullTracker())
    [trial] = study.get_trials(deepcopy=False)
    assert (trial.state, trial.value) == (optuna.trial.TrialState.COMPLETE, 1.25)
