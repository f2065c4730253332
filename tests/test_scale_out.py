"""Scaling out: several ``lmablate tune`` workers on one shared Optuna study (a throwaway
PostgreSQL server from Debian's binaries, and one SQLite file), MLflow against a tracking server,
and one-line errors for a database or tracking server that cannot be reached.

Each worker is a separate ``lmablate`` process with ``runtime.workers: 1``, exactly as a worker on
another machine would be; the processes share nothing but the database.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import budgets

N_TRIALS = 6
DATASET, VARIANT = "arithmetic", "baseline"
# A trial is a few seconds; every worker process starts with a fresh Python and PyTorch import.
WORKER_TIMEOUT = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tune_args(out: str) -> list[str]:
    return ["tune", DATASET, VARIANT, "--tokens", "tokens", "--best", f"{out}/best.json",
            "--trials", f"{out}/trials.csv"]


# one worker per process, and enough steps that the two workers' trials overlap in time
SCALE_OUT = {
    "runtime": {"workers": 1, "device": "cpu"},
    "train": {"budget_flops": budgets(60)},
    "tune": {"rungs": [[N_TRIALS, 1.0]], "trials_per_batch": 2, "reports": 4,
             "lr_low": 1e-3, "lr_high": 3e-2, "heartbeat_seconds": 2},
}


@pytest.fixture()
def scale_project(make_project):
    """``make(path, change=None)``: a tiny project for one-worker processes at ``path``, with
    ``change`` applied to its params; returns the folder."""
    def make(path: Path, change=None) -> Path:
        project = make_project(path, SCALE_OUT)
        if change:
            project.write_params(change)
        return project.path
    return make


# ---------------------------------------------------------------------------------------------
# A throwaway PostgreSQL server


def _pg_bin(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"),
                   key=lambda p: int(re.search(r"/postgresql/(\d+)/", p).group(1)))
    return found[-1] if found else None


class PostgresServer:
    """``initdb`` + ``pg_ctl start`` of a cluster in a temporary folder, listening on
    127.0.0.1:<free port> only, trust authentication. As root, the server runs as the
    ``postgres`` system user (PostgreSQL refuses to run as root)."""

    def __init__(self) -> None:
        self.initdb, self.pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
        if not (self.initdb and self.pg_ctl):
            pytest.skip("PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin; "
                        "install Debian's postgresql, as .ci/run does")
        pytest.importorskip("psycopg2", reason="pip install 'lmablate[postgres]' (psycopg2-binary)")
        self.prefix: list[str] = []
        self.owner = None
        if os.geteuid() == 0:
            import pwd

            try:
                self.owner = pwd.getpwnam("postgres")
            except KeyError:
                subprocess.run(["useradd", "--system", "--no-create-home", "postgres"], check=True)
                self.owner = pwd.getpwnam("postgres")
            runuser = shutil.which("runuser")
            if not runuser:
                pytest.skip("running as root without runuser to start PostgreSQL as postgres")
            self.prefix = [runuser, "-u", "postgres", "--"]
        # Not pytest's tmp_path: its parents are private to root, and postgres must reach it.
        self.root = Path(tempfile.mkdtemp(prefix="lmablate-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        if self.owner:
            os.chown(self.root, self.owner.pw_uid, self.owner.pw_gid)
        self.port = free_port()
        self.started = False

    def _run(self, *args: str) -> None:
        result = subprocess.run([*self.prefix, *args], capture_output=True, text=True,
                                timeout=120)
        if result.returncode:
            log = self.log.read_text() if self.log.exists() else ""
            raise RuntimeError(f"{' '.join(args)} failed:\n{result.stdout}{result.stderr}\n{log}")

    def start(self) -> "PostgresServer":
        self._run(self.initdb, "-D", str(self.data), "-U", "postgres", "--auth=trust",
                  "--encoding=UTF8", "--no-sync")
        options = (f"-c listen_addresses=127.0.0.1 -c port={self.port} "
                   f"-c unix_socket_directories={self.root} -c fsync=off")
        self._run(self.pg_ctl, "-D", str(self.data), "-l", str(self.log), "-o", options,
                  "-w", "-t", "60", "start")
        self.started = True
        return self

    def stop(self) -> None:
        if self.started:
            self._run(self.pg_ctl, "-D", str(self.data), "-m", "fast", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str) -> str:
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        import psycopg2

        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user="postgres",
                                dbname="postgres")
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(f'CREATE DATABASE "{name}"')
        finally:
            conn.close()
        return self.url(name)


@pytest.fixture(scope="session")
def postgres():
    server = PostgresServer()
    try:
        yield server.start()
    finally:
        server.stop()


# ---------------------------------------------------------------------------------------------
# Two workers, one study


def trial_of(storage, proc: subprocess.Popen, states=None):
    """Wait until worker ``proc`` has taken a trial (in one of ``states``, any state if None) of
    the study in ``storage``; returns that trial. Fails if the worker ends first."""
    deadline = time.monotonic() + WORKER_TIMEOUT
    while time.monotonic() < deadline:
        for study in storage.get_all_studies():
            for t in storage.get_all_trials(study._study_id, deepcopy=False, states=states):
                if t.user_attrs.get("worker", "").endswith(f":{proc.pid}"):
                    return t
        if proc.poll() is not None:
            pytest.fail(f"worker {proc.pid} ended before it took a trial: "
                        f"{proc.stderr.read()[-3000:]}")
        time.sleep(0.05)
    pytest.fail(f"worker {proc.pid} took no trial in {WORKER_TIMEOUT} s")


def sqlite_is_unlocked(path: str) -> bool:
    """Whether no other connection holds a lock on the SQLite database at ``path``: an exclusive
    transaction can be begun (it waits up to a second, then gives up)."""
    import sqlite3

    conn = sqlite3.connect(path, timeout=1.0, isolation_level=None)
    try:
        conn.execute("BEGIN EXCLUSIVE")
        conn.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        conn.close()


def stop_outside_a_transaction(proc: subprocess.Popen, storage_url: str) -> None:
    """SIGSTOP ``proc`` at a moment it holds no lock on the study's database. A worker stopped
    inside a SQLite transaction (its heartbeat thread writes every few seconds) would hold the
    lock while stopped, and every other connection would fail with "database is locked". With
    PostgreSQL readers never wait for a writer, so any moment will do."""
    prefix = "sqlite:///"
    for _ in range(100):
        os.kill(proc.pid, signal.SIGSTOP)
        if not storage_url.startswith(prefix) or sqlite_is_unlocked(storage_url[len(prefix):]):
            return
        os.kill(proc.pid, signal.SIGCONT)
        time.sleep(0.01)
    pytest.fail(f"worker {proc.pid} held the database lock at each of 100 tries")


def run_two_workers(start_lmablate, project: Path, storage_url: str) -> object:
    """Two ``lmablate tune`` workers on the study in ``storage_url``; returns the study.

    How the trials fall to the workers is arranged, not left to timing: on a loaded machine one
    worker could start late and find the study finished by the other. Worker 0 starts first and
    is stopped (SIGSTOP, outside any database transaction) once it is training a trial; worker 1
    then starts and finds the rest of the first batch queued; worker 0 continues (SIGCONT) once
    worker 1 has taken a trial. Both then go on claiming trials side by side."""
    import optuna

    from lmablate.tune.storage import make_storage

    storage = make_storage(storage_url)  # Optuna's tables exist before the workers connect
    env = {"LMABLATE_OPTUNA_STORAGE": storage_url}
    first = start_lmablate(tune_args("out0"), project, env)
    trial_of(storage, first, states=(optuna.trial.TrialState.RUNNING,))
    stop_outside_a_transaction(first, storage_url)
    try:
        second = start_lmablate(tune_args("out1"), project, env)
        trial_of(storage, second)
    finally:
        os.kill(first.pid, signal.SIGCONT)
    workers = [first, second]
    outputs = [w.communicate(timeout=WORKER_TIMEOUT) for w in workers]
    for w, (_, err) in zip(workers, outputs):
        assert w.returncode == 0, err[-3000:]
        assert "database is locked" not in err
    names = [json.loads((project / f"out{w}" / "best.json").read_text())["study_name"]
             for w in (0, 1)]
    assert names[0] == names[1]
    return optuna.load_study(study_name=names[0], storage=storage_url)


def check_study(project: Path, study, start_lmablate) -> None:
    """Every slot has its result, nothing is left running or queued, both workers trained
    trials, and both wrote the bytes that one worker alone writes on a fresh database."""
    import optuna

    from lmablate.tune.rungs import SLOT
    from lmablate.tune.tuning import slot_results

    S = optuna.trial.TrialState
    trials = study.get_trials(deepcopy=False)
    assert sorted(slot_results(study)) == list(range(N_TRIALS))
    assert not [t for t in trials if t.state in (S.RUNNING, S.WAITING)]
    # a slot queued twice (two workers proposing the same batch at once) has the same params
    for slot in range(N_TRIALS):
        params = [t.params for t in trials if t.user_attrs[SLOT] == slot]
        assert all(p == params[0] for p in params), (slot, params)
    workers = {t.user_attrs.get("worker") for t in trials if t.state in (S.COMPLETE, S.PRUNED)}
    assert len(workers) == 2, f"a worker ran no trial: {workers}"
    bests = [(project / f"out{w}" / "best.json").read_bytes() for w in (0, 1)]
    assert bests[0] == bests[1]
    alone = start_lmablate(tune_args("alone"), project,
                           {"LMABLATE_OPTUNA_STORAGE": f"sqlite:///{project / 'alone.db'}"})
    _, err = alone.communicate(timeout=WORKER_TIMEOUT)
    assert alone.returncode == 0, err[-3000:]
    assert (project / "alone" / "best.json").read_bytes() == bests[0]


def test_two_workers_share_a_postgresql_study(postgres, tmp_path, scale_project, start_lmablate):
    project = scale_project(tmp_path)
    url = postgres.create_database("optuna_two_workers")
    study = run_two_workers(start_lmablate, project, url)
    check_study(project, study, start_lmablate)
    # A third worker (e.g. a re-run of the DVC stage) finds the study finished: no new trial.
    before = len(study.get_trials(deepcopy=False))
    proc = start_lmablate(tune_args("out2"), project, {"LMABLATE_OPTUNA_STORAGE": url})
    _, err = proc.communicate(timeout=WORKER_TIMEOUT)
    assert proc.returncode == 0, err[-3000:]
    assert json.loads((project / "out2" / "best.json").read_text())["n_trials"] == N_TRIALS
    assert len(study.get_trials(deepcopy=False)) == before


def test_two_workers_share_a_sqlite_study(tmp_path, scale_project, start_lmablate):
    project = scale_project(tmp_path)
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    study = run_two_workers(start_lmablate, project, url)
    check_study(project, study, start_lmablate)


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")
def test_a_queued_trial_is_claimed_by_one_worker_only(tmp_path):
    """Eight threads race to claim three queued trials: each is taken exactly once, and no
    trial is ever created by the race (lmablate.tune.storage.claim never samples)."""
    import threading

    import optuna

    from lmablate.tune.storage import claim, load_study, make_storage

    study = load_study(make_storage(f"sqlite:///{tmp_path / 'o.db'}"), "claims")
    for slot in range(3):
        study.enqueue_trial({"x": float(slot)}, user_attrs={"slot": slot})
    taken, barrier = [], threading.Barrier(8)

    def worker():
        barrier.wait()
        while (trial := claim(study)) is not None:
            taken.append(trial.number)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(taken) == [0, 1, 2]
    assert len(study.get_trials()) == 3
    assert all(t.state == optuna.trial.TrialState.RUNNING for t in study.get_trials())


@pytest.fixture(params=["sqlite", "postgresql"])
def fresh_storage(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'fresh.db'}"
    return request.getfixturevalue("postgres").create_database("optuna_fresh")


def test_workers_starting_together_on_a_fresh_database(fresh_storage, tmp_path):
    """Workers that connect at the same moment to an empty database race to create Optuna's
    tables; every one of them must come up (lmablate.tune.storage.make_storage retries)."""
    # a barrier: every process imports lmablate (and torch) first, then all connect at once
    code = ("import sys, time; from pathlib import Path; "
            "from lmablate.tune.storage import make_storage; "
            "Path(f'ready-{sys.argv[2]}').touch()\n"
            "while len(list(Path().glob('ready-*'))) < 3: time.sleep(0.005)\n"
            "make_storage(sys.argv[1])")
    procs = [subprocess.Popen([sys.executable, "-c", code, fresh_storage, str(i)],
                              cwd=tmp_path, stderr=subprocess.PIPE, text=True)
             for i in range(3)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errors


# ---------------------------------------------------------------------------------------------
# Unreachable stores: one line, exit 2, nothing written


def test_unreachable_optuna_database(tmp_path, scale_project, start_lmablate):
    pytest.importorskip("psycopg2", reason="pip install 'lmablate[postgres]' (psycopg2-binary)")
    project = scale_project(tmp_path)
    port = free_port()
    url = f"postgresql+psycopg2://lmablate:secret@127.0.0.1:{port}/optuna"
    start = time.monotonic()
    proc = start_lmablate(tune_args("out"), project, {"LMABLATE_OPTUNA_STORAGE": url})
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err[-3000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lmablate: error: Optuna storage"), err
    assert f"lmablate:***@127.0.0.1:{port}/optuna" in lines[0]
    assert "LMABLATE_OPTUNA_STORAGE" in lines[0]
    assert "secret" not in lines[0]  # the password is not printed
    assert "Traceback" not in err
    assert time.monotonic() - start < 60
    assert not (project / "out").exists()


def test_unreachable_mlflow_server(tmp_path, scale_project, start_lmablate):
    project = scale_project(tmp_path, lambda r: r["tracking"].update(enabled=True))
    uri = f"http://127.0.0.1:{free_port()}"
    start = time.monotonic()
    proc = start_lmablate(tune_args("out"), project, {"MLFLOW_TRACKING_URI": uri})
    _, err = proc.communicate(timeout=300)
    elapsed = time.monotonic() - start
    assert proc.returncode == 2, err[-3000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lmablate: error: MLflow tracking store"), err
    assert uri in lines[0]
    assert elapsed < 90, f"took {elapsed:.0f} s to give up"
    assert not (project / "out").exists()
    assert not (project / "optuna.db").exists()  # failed before the study was created


# ---------------------------------------------------------------------------------------------
# MLflow tracking server


@pytest.fixture()
def mlflow_server(tmp_path):
    """``mlflow server`` with a SQLite database backend and proxied artifact storage."""
    mlflow_bin = Path(sys.executable).with_name("mlflow")
    if not mlflow_bin.exists():
        mlflow_bin = shutil.which("mlflow")
    port = free_port()
    root = tmp_path / "mlflow-server"
    root.mkdir()
    log = open(root / "server.log", "w")
    proc = subprocess.Popen(
        [str(mlflow_bin), "server", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
         "--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1",
         "--port", str(port), "--workers", "1"],
        cwd=root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        # no background job runner (huey consumer processes) for this short-lived server
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("mlflow server did not start:\n"
                                   + (root / "server.log").read_text()[-3000:])
            time.sleep(0.5)
        yield uri
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
        log.close()


def test_mlflow_tracking_server(mlflow_server, tmp_path, scale_project, start_lmablate):
    from mlflow import MlflowClient

    project = scale_project(tmp_path / "project", lambda r: (
        r["tracking"].update(enabled=True, experiment="scale-out"),
        r["tune"].update(rungs=[[2, 0.5], [1, 1.0]])))
    env = {"MLFLOW_TRACKING_URI": mlflow_server}
    for args in (tune_args("out"),
                 ["train", DATASET, VARIANT, "--tokens", "tokens", "--best", "out/best.json",
                  "--checkpoints", "out/ck", "--history", "out/history.csv",
                  "--grad-stats", "out/grad.csv"]):
        proc = start_lmablate(args, project, env)
        _, err = proc.communicate(timeout=WORKER_TIMEOUT)
        assert proc.returncode == 0, err[-3000:]
    # nothing was written to the embedded default store
    assert not (project / "mlflow.db").exists() and not (project / "mlruns").exists()

    client = MlflowClient(tracking_uri=mlflow_server)
    experiment = client.get_experiment_by_name("scale-out")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id], max_results=100)
    by_stage = {}
    for run in runs:
        by_stage.setdefault(run.data.tags.get("stage"), []).append(run)
    assert {r.data.tags.get("mlflow.runName") for r in by_stage["tune"]} >= {
        f"tune-{DATASET}-{VARIANT}", "trial-0", "trial-1"}
    parents = [r for r in by_stage["tune"] if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1
    parent = parents[0]
    assert parent.data.tags["dataset"] == DATASET and parent.data.tags["variant"] == VARIANT
    assert parent.info.status == "FINISHED" and "best_val_loss" in parent.data.metrics
    trials = [r for r in by_stage["tune"] if "mlflow.parentRunId" in r.data.tags]
    assert len(trials) == 3  # two at the first rung, one lr at the full budget
    assert {r.data.tags["mlflow.parentRunId"] for r in trials} == {parent.info.run_id}
    (final,) = by_stage["train"]
    assert {k: final.data.tags[k] for k in ("dataset", "variant", "seed", "stage")} == {
        "dataset": DATASET, "variant": VARIANT, "seed": "0", "stage": "train"}
    assert "val_loss" in final.data.metrics and final.info.status == "FINISHED"
    history = client.get_metric_history(final.info.run_id, "val_loss")
    assert len(history) >= 1
    # the checkpoint went through the server's artifact proxy
    assert [a.path for a in client.list_artifacts(final.info.run_id, "checkpoint")] == [
        "checkpoint/checkpoint.pt"]
