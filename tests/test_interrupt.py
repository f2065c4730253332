"""Ctrl-C and kill -9 of real stage processes: a stage stops within seconds, says so in one
line, leaves its resume state valid and no MLflow run RUNNING, and a rerun finishes with the
result of an uninterrupted run. The MLflow sidecar never prints a traceback of its own.

Each command is started as a terminal starts it (a session and process group of its own, SIGINT
at its default), and Ctrl-C is a SIGINT to that whole group, sidecar and workers included.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
import torch
import yaml

from lmablate.core import interrupt
from lmablate.execution import parallel
from lmablate.tracking.mlflow_store import HOST_TAG, PID_TAG

from conftest import budgets

INTERRUPTED = "lmablate: interrupted; run the same command (or dvc repro) again to resume"
STOP_SECONDS = 10  # from the signal to the process's exit

# Two seeds (and two trials at a time) as concurrent jobs, long enough to be interrupted:
# final runs of 1,200 steps, trials of 360 (at about 80 steps a second a seed on a busy 2-core
# machine, 10 s or more after the first resume state at step 50).
LONG = {
    "study": {"variants": ["baseline"], "seeds": [0, 1]},
    "train": {"budget_flops": budgets(1200), "eval_interval": 50, "warmup_fraction": 0.1},
    "tune": {"rungs": [[4, 0.3], [1, 1.0]], "trials_per_batch": 2, "reports": 4,
             "bracket_seeds": 1, "bracket_points": 1, "heartbeat_seconds": 1},
    "runtime": {"workers": 2},
    "tracking": {"enabled": True},
}
TUNE = ["tune", "arithmetic", "baseline", "--tokens", "tokens"]


def train_cmd(out: str) -> list[str]:
    return ["train", "arithmetic", "baseline", "--tokens", "tokens", "--best", "best.json",
            "--checkpoints", f"{out}/ck", "--history", f"{out}/history.csv",
            "--grad-stats", f"{out}/grad.csv"]


def tune_cmd(out: str) -> list[str]:
    return [*TUNE, "--best", f"{out}/best.json", "--trials", f"{out}/trials.csv"]


def as_in_a_terminal() -> None:
    """SIGINT at its default, as for a command a terminal runs (a shell without job control
    starts background jobs with SIGINT ignored, and children inherit that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture(params=["threads", "processes"])
def project(request, make_project, tmp_path):
    project = make_project(tmp_path, {**LONG, "runtime": {**LONG["runtime"],
                                                          "parallel": request.param}})
    (project.path / "best.json").write_text(json.dumps({"lr": 3e-3, "d_model": 16}))
    # the reference: the same study, uninterrupted, recorded nowhere, in its own Optuna storage
    raw = yaml.safe_load((project.path / "params.yaml").read_text())
    raw["tune"]["storage"] = f"sqlite:///{project.path / 'ref.db'}"
    raw["tracking"]["enabled"] = False
    (project.path / "ref.yaml").write_text(yaml.safe_dump(raw))
    return project


@pytest.fixture(scope="module")
def references(tmp_path_factory) -> Path:
    """Where the module keeps each uninterrupted reference's outputs once computed."""
    return tmp_path_factory.mktemp("references")


def run_reference(start_lmablate, cwd: Path, args: list[str], references: Path) -> None:
    """The uninterrupted run of ``args`` (writing under ``cwd/ref``), computed once per module
    and copied after: the threads and processes variants share it, as a run's result does not
    depend on ``runtime.parallel`` (``tests/test_parallel.py``)."""
    saved = references / args[0]
    if not saved.exists():
        proc = start_lmablate(["--params", "ref.yaml", *args], cwd)
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        shutil.copytree(cwd / "ref", saved)
    else:
        shutil.copytree(saved, cwd / "ref")


def query(db: Path, sql: str, *args) -> list[tuple]:
    """Rows of ``sql`` on SQLite file ``db``; none while the file or its tables do not exist."""
    if not db.exists():
        return []
    with contextlib.suppress(sqlite3.OperationalError), sqlite3.connect(db, timeout=30) as con:
        return con.execute(sql, args).fetchall()
    return []


def wait_for(proc: subprocess.Popen, predicate, timeout: float, what: str) -> None:
    """Poll ``predicate`` until true; fails if ``proc`` ends or ``timeout`` s pass first."""
    end = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"the command ended before {what}: "
                                 f"{proc.communicate()[1][-3000:]}")
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def ctrl_c(proc: subprocess.Popen) -> tuple[float, str]:
    """Ctrl-C to ``proc``'s process group; returns the seconds to its exit and its stderr (read
    to its end, that is until every process of the group holding it has exited)."""
    sent = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=STOP_SECONDS + 50)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    stopped = time.monotonic() - sent
    return stopped, proc.communicate(timeout=60)[1]


def lines(err: str) -> list[str]:
    """stderr's lines, but for MLflow's notes on creating its database."""
    return [line for line in err.splitlines() if " INFO mlflow." not in line]


def assert_one_line(err: str) -> None:
    """stderr is the interrupt's one line."""
    assert "Traceback" not in err, err[-3000:]
    assert lines(err) == [INTERRUPTED], err[-3000:]


def runs(db: Path) -> list[tuple[str, str, str | None]]:
    """Every MLflow run's name, status and parent run id."""
    return query(db, "select r.name, r.status, (select value from tags t where t.run_uuid = "
                     "r.run_uuid and t.key = 'mlflow.parentRunId') from runs r")


def test_ctrl_c_stops_train_within_seconds_and_a_rerun_gives_the_uninterrupted_result(
        project, start_lmablate, references):
    path = project.path
    run_reference(start_lmablate, path, train_cmd("ref"), references)
    victim = start_lmablate(train_cmd("out"), path, start_new_session=True,
                            preexec_fn=as_in_a_terminal)
    resumes = [path / "out" / "ck" / f"seed_{s}" / "resume.pt" for s in (0, 1)]
    wait_for(victim, lambda: all(r.exists() for r in resumes), 120, "both seeds' resume states")
    stopped, err = ctrl_c(victim)
    assert victim.returncode == 130, err[-3000:]
    assert stopped < STOP_SECONDS
    assert_one_line(err)
    # stopped mid-training, with a resume state that loads, at an eval interval
    for resume in resumes:
        assert not (resume.parent / "result.json").exists()
        step = torch.load(resume, weights_only=False)["step"]
        assert 0 < step < 1200 and step % 50 == 0
    assert sorted(status for _, status, _ in runs(path / "mlflow.db")) == ["KILLED", "KILLED"]

    again = start_lmablate(train_cmd("out"), path)
    _, err = again.communicate(timeout=600)
    assert again.returncode == 0, err[-3000:]
    for seed in (0, 1):
        ref = json.loads((path / "ref" / "ck" / f"seed_{seed}" / "result.json").read_text())
        out = json.loads((path / "out" / "ck" / f"seed_{seed}" / "result.json").read_text())
        assert out["summary"]["val_loss"] == pytest.approx(ref["summary"]["val_loss"], abs=1e-6)
        assert [r["step"] for r in out["history"]] == [r["step"] for r in ref["history"]]
        assert [r["val_loss"] for r in out["history"]] == pytest.approx(
            [r["val_loss"] for r in ref["history"]], abs=1e-6)
    # the resumed seeds went on in their own runs
    assert sorted(status for _, status, _ in runs(path / "mlflow.db")) == ["FINISHED"] * 2


def test_ctrl_c_stops_tune_within_seconds_and_a_rerun_gives_the_uninterrupted_result(
        project, start_lmablate, references):
    path = project.path
    run_reference(start_lmablate, path, tune_cmd("ref"), references)
    victim = start_lmablate(tune_cmd("out"), path, start_new_session=True,
                            preexec_fn=as_in_a_terminal)
    optuna_db = path / "optuna.db"

    def training() -> bool:  # a trial is running and has reported once
        return bool(query(optuna_db, "select 1 from trials t join trial_intermediate_values v "
                                     "on v.trial_id = t.trial_id where t.state = 'RUNNING'"))

    wait_for(victim, training, 120, "a running trial's first report")
    stopped, err = ctrl_c(victim)
    assert victim.returncode == 130, err[-3000:]
    assert stopped < STOP_SECONDS
    assert_one_line(err)
    assert not (path / "out" / "best.json").exists()
    # the interrupted trials failed (no result: their slots are run again), none left running
    states = query(optuna_db, "select state from trials")
    assert "RUNNING" not in {s for (s,) in states} and ("FAIL",) in states
    recorded = runs(path / "mlflow.db")
    assert "RUNNING" not in {status for _, status, _ in recorded}
    trials = {status for name, status, _ in recorded if name.startswith("trial-")}
    assert "KILLED" in trials and trials <= {"KILLED", "FINISHED"}  # FINISHED: done before
    (parent,) = [(name, status) for name, status, p in recorded if p is None]
    assert parent == ("tune-arithmetic-baseline", "KILLED")

    again = start_lmablate(tune_cmd("out"), path)
    _, err = again.communicate(timeout=600)
    assert again.returncode == 0, err[-3000:]
    assert (path / "out" / "best.json").read_bytes() == (path / "ref" / "best.json").read_bytes()
    assert (path / "out" / "trials.csv").read_bytes() == (path / "ref" / "trials.csv").read_bytes()
    recorded = runs(path / "mlflow.db")
    assert "RUNNING" not in {status for _, status, _ in recorded}
    # the rerun went on under the study's parent run
    assert [(name, status) for name, status, p in recorded if p is None] == [
        ("tune-arithmetic-baseline", "FINISHED")]


def test_kill_9_of_tune_then_rerun_leaves_no_run_running_and_one_parent_run(
        make_project, tmp_path, start_lmablate):
    path = make_project(tmp_path, LONG).path
    victim = start_lmablate(tune_cmd("out"), path)
    db = path / "mlflow.db"
    wait_for(victim, lambda: any(name.startswith("trial-") for name, _, _ in runs(db)), 120,
             "a trial's MLflow run")
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    # the sidecar saw its pipe close and exited without ending anything: runs left RUNNING
    assert "RUNNING" in {status for _, status, _ in runs(db)}
    owners = query(db, "select t.value from tags t join runs r on r.run_uuid = t.run_uuid "
                       "where r.status = 'RUNNING' and t.key = ?", PID_TAG)
    assert {int(pid) for (pid,) in owners} == {victim.pid}

    again = start_lmablate(tune_cmd("out"), path)
    _, err = again.communicate(timeout=600)
    assert again.returncode == 0, err[-3000:]
    recorded = runs(db)
    assert "RUNNING" not in {status for _, status, _ in recorded}
    assert "KILLED" in {status for _, status, _ in recorded}  # the trials the kill cut off
    parents = [(name, status) for name, status, p in recorded if p is None]
    assert parents == [("tune-arithmetic-baseline", "FINISHED")]
    study = json.loads((path / "out" / "best.json").read_text())["study_name"]
    assert query(db, "select count(*) from tags where key = 'optuna_study' and value = ? and "
                     "run_uuid not in (select run_uuid from tags where key = "
                     "'mlflow.parentRunId')", study) == [(1,)]


def test_a_run_of_another_host_is_left_running(tmp_path, monkeypatch):
    """A RUNNING run whose owner is on another machine may be running there: only runs of this
    host whose process is gone are ended."""
    import mlflow

    from lmablate.tracking.mlflow_store import MlflowStore

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    store = MlflowStore(uri, "study")
    dead = subprocess.Popen(["true"])
    dead.wait()
    other = store.start_run("elsewhere", {HOST_TAG: "another-host", PID_TAG: str(dead.pid)})
    here = store.start_run("here", {HOST_TAG: socket.gethostname(), PID_TAG: str(dead.pid)})
    alive = store.start_run("alive", {HOST_TAG: socket.gethostname(), PID_TAG: str(os.getpid())})
    assert sorted(store.end_stale_runs()) == [here]
    client = mlflow.MlflowClient(uri)
    assert [client.get_run(r).info.status for r in (other, here, alive)] == [
        "RUNNING", "KILLED", "RUNNING"]


def test_a_command_that_fails_at_once_prints_no_traceback(make_project, tmp_path,
                                                           start_lmablate):
    # The command exits while its sidecar still imports MLflow; the sidecar then finds the pipe
    # closed. It shares the command's stderr, so reading stderr to its end waits for it too.
    path = make_project(tmp_path, LONG).path
    proc = start_lmablate(["train", "arithmetic", "mamba", *train_cmd("out")[3:]], path)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in err, err
    assert lines(err) == [
        "lmablate: error: params: variant='mamba' is not allowed; choose one of alibi, baseline, "
        "coupled, geglu, gelu, gqa, llama, mqa, nope, post_norm, rmsnorm, rope, sinusoidal, swiglu"], err


def test_a_train_that_only_skips_finished_seeds_prints_no_traceback(make_project, tmp_path,
                                                                      start_lmablate):
    path = make_project(tmp_path, {**LONG, "train": {"budget_flops": budgets(4)}}).path
    (path / "best.json").write_text(json.dumps({"lr": 3e-3, "d_model": 16}))
    for _ in range(2):  # the second finds both seeds finished and exits at once
        proc = start_lmablate(train_cmd("out"), path)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        assert "Traceback" not in err, err
    assert "2 seeds x 4 steps" in out


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_ctrl_c_stops_evaluate_within_seconds(make_project, tmp_path, start_lmablate):
    # 20,000 test problems (of 3 digits: 2 digits have 19,602 problems, too few for as many
    # test problems) and every test window: a minute of evaluation
    path = make_project(tmp_path, {**LONG, "datasets": {"arithmetic": {
                                       "n_test": 20000, "digits": 3, "length_digits": [4]}},
                                   "train": {"budget_flops": budgets(4)},
                                   "evaluate": {"max_problems": 20000, "max_batches": 10**6},
                                   "tracking": {"enabled": False}}).path
    (path / "best.json").write_text(json.dumps({"lr": 3e-3, "d_model": 16}))
    proc = start_lmablate(train_cmd("out"), path)
    assert proc.wait(timeout=300) == 0, proc.stderr.read()
    evaluate = ["evaluate", "arithmetic", "baseline", "--tokens", "tokens", "--raw", "raw",
                "--checkpoints", "out/ck", "--metrics", "out/metrics.json",
                "--examples", "out/examples.json"]
    # the CPU time a command takes to start up and read its inputs: a short evaluation's all
    raw = yaml.safe_load((path / "params.yaml").read_text())
    raw["evaluate"].update(max_problems=8, max_batches=1)
    (path / "short.yaml").write_text(yaml.safe_dump(raw))
    short = start_lmablate(["--params", "short.yaml", *evaluate[:-4], "--metrics", "s/m.json",
                            "--examples", "s/e.json"], path)
    _, status, usage = os.wait4(short.pid, 0)  # its CPU time, all of its threads'
    _, err = short.communicate(timeout=60)
    assert os.waitstatus_to_exitcode(status) == 0, err[-3000:]
    startup = usage.ru_utime + usage.ru_stime

    victim = start_lmablate(evaluate, path, start_new_session=True,
                            preexec_fn=as_in_a_terminal)
    wait_for(victim, lambda: cpu_seconds(victim.pid) > startup + 3, 120,
             "the evaluation to be under way")  # of some 25 s of CPU
    stopped, err = ctrl_c(victim)
    assert victim.returncode == 130, err[-3000:]
    assert stopped < STOP_SECONDS
    assert_one_line(err)
    assert not (path / "out" / "metrics.json").exists()


def test_a_stop_request_reaches_every_thread_job_and_is_raised_once_they_stopped():
    """In-process: jobs stop at their next check, queued ones never start, the caller gets
    Interrupted, and a run without a request is untouched."""
    started = []

    def job(i: int) -> int:
        started.append(i)
        if i == 0:
            interrupt.request()  # as SIGINT does
        for _ in range(10**6):
            interrupt.check()
            time.sleep(0.001)
        return i

    try:
        with pytest.raises(interrupt.Interrupted):
            parallel.map_jobs(job, range(8), 2)
        assert started[0] == 0 and set(started) <= {0, 1}  # no queued job started after it
    finally:
        interrupt.reset()
    assert parallel.map_jobs(lambda i: i * i, range(4), 2) == [0, 1, 4, 9]


def test_the_batched_path_stops_at_the_next_step_and_resumes_to_the_uninterrupted_result(
        make_project, tmp_path, monkeypatch):
    """The GPU's path (forced here on the CPU): a stop requested right after the first resume
    states are saved ends every seed's run KILLED with those states; the rerun resumes them
    and ends where an uninterrupted batched run ends."""
    import dataclasses

    import mlflow

    from lmablate.train import loop
    from lmablate.stages import train

    project = make_project(tmp_path, {"study": {"seeds": [0, 1]},
                                      "train": {"budget_flops": budgets(40),
                                                "eval_interval": 10}})
    tmp = project.path
    (tmp / "best.json").write_text(json.dumps({"lr": 3e-3, "d_model": 16}))
    monkeypatch.chdir(tmp)  # MLflow's default artifact root is ./mlruns
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    cfg = dataclasses.replace(project.cfg, tracking=dataclasses.replace(
        project.cfg.tracking, enabled=True, uri=uri))
    monkeypatch.setattr(train, "batched_on", lambda device: True)

    def stage(out: str, tracked=cfg) -> dict:
        return train.run(tracked, "arithmetic", "baseline", tmp / "tokens", tmp / "best.json",
                         tmp / out / "ck", tmp / out / "history.csv", tmp / out / "grad.csv")

    reference = stage("ref", project.cfg)  # untracked
    save = loop.save_resume

    def save_then_stop(path, state):
        save(path, state)
        interrupt.request()  # as SIGINT does, between two steps

    monkeypatch.setattr(loop, "save_resume", save_then_stop)
    try:
        with pytest.raises(interrupt.Interrupted):
            stage("out")
    finally:
        interrupt.reset()
    monkeypatch.setattr(loop, "save_resume", save)
    for seed in (0, 1):
        resume = tmp / "out" / "ck" / f"seed_{seed}" / "resume.pt"
        assert torch.load(resume, weights_only=False)["step"] == 10
    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name(cfg.tracking.experiment)
    assert [r.info.status for r in client.search_runs([experiment.experiment_id])] == [
        "KILLED", "KILLED"]
    resumed = stage("out")
    for seed in (0, 1):
        a, b = reference[f"seed_{seed}"], resumed[f"seed_{seed}"]
        assert b["val_loss"] == pytest.approx(a["val_loss"], abs=1e-6)
    assert [r.info.status for r in client.search_runs([experiment.experiment_id])] == [
        "FINISHED", "FINISHED"]
