"""``lmablate repro``: the study's independent chains of stages at once, each in a workspace of its
own that shares the main workspace's DVC cache, then ``dvc repro`` in the main workspace
(:mod:`lmablate.execution.workspaces`)."""

from __future__ import annotations

import os
import re
import socket
import shutil
import signal
import sqlite3
import sys
import time
from pathlib import Path

import pytest
import yaml

from lmablate import cli
from lmablate.config import params
from lmablate.execution import workspaces
from lmablate.execution.workspaces import (absolute_sqlite_url, plan, run_chains, stage_graph,
                                           store_env)

from test_pipeline import new_study, result_files

ROOT = Path(__file__).resolve().parents[1]
# DVC's graph code, on the pygtrie it is installed with
pytestmark = pytest.mark.filterwarnings("ignore:_NoneStep.value will soon raise:DeprecationWarning")


def dvc_project(path: Path, raw_params: dict, run_command) -> Path:
    """The repository's dvc.yaml and ``raw_params`` in folder ``path``, a DVC repository without
    git: enough for DVC to list the stages."""
    path.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "dvc.yaml", path / "dvc.yaml")
    (path / "params.yaml").write_text(yaml.safe_dump(raw_params))
    assert run_command(["dvc", "init", "--no-scm", "-q"], path).returncode == 0
    return path


def test_dvc_lists_one_chain_per_dataset_and_variant(
        tmp_path, tiny_params, run_command):
    datasets, variants = ["arithmetic", "shakespeare"], ["baseline", "rope"]
    raw = tiny_params({"study": {"datasets": datasets, "variants": variants}})
    steps = plan(stage_graph(dvc_project(tmp_path, raw, run_command)))
    assert steps.upstream == ("check",) + tuple(f"{stage}@{d}"
                                               for stage in ("generate", "tokenize")
                                               for d in datasets)
    pairs = [f"{d}-{v}" for d in datasets for v in variants]
    assert steps.chains == {
        f"evaluate@{p}": (f"tune@{p}", f"train@{p}", f"evaluate@{p}") for p in pairs}
    assert steps.final == ("report",)


def test_a_stage_that_one_chain_needs_runs_in_it_and_stages_follow_their_deps():
    # listed out of order: c depends on b, which depends on a; e on d, which depends on s; the
    # report reads c, e and s, but only the chain that ends at e needs s
    deps = {"report": ["c", "e", "s"], "c": ["b"], "b": ["a"], "a": [], "e": ["d"],
            "d": ["s"], "s": []}
    steps = plan(deps)
    assert steps.chains == {"c": ("a", "b", "c"), "e": ("s", "d", "e")}
    assert steps.upstream == () and steps.final == ("report",)
    deps["b"] = ["a", "s"]  # now both chains need s: it runs before them
    assert plan(deps) == (("s",), {"c": ("a", "b", "c"), "e": ("d", "e")}, ("report",))


@pytest.mark.parametrize("url, expected", [
    ("sqlite:///optuna.db", "sqlite:////main/optuna.db"),
    ("sqlite:///stores/mlflow.db?timeout=60", "sqlite:////main/stores/mlflow.db?timeout=60"),
    ("sqlite+pysqlite:///../optuna.db", "sqlite+pysqlite:////optuna.db"),
    ("sqlite:////srv/optuna.db", None),
    ("sqlite:///:memory:", None),
    ("sqlite://", None),
    ("postgresql+psycopg2://lmablate:secret@db-host/optuna", None),
    ("http://mlflow-host:5000", None),
])
def test_only_a_relative_sqlite_file_is_made_absolute_against_the_main_workspace(url, expected):
    assert absolute_sqlite_url(url, Path("/main")) == expected


def test_chains_get_the_main_workspaces_stores_where_params_or_env_name_a_relative_file(
        project, monkeypatch):
    cfg = params.load(project.path / "params.yaml")  # Optuna: an absolute path; MLflow: relative
    monkeypatch.delenv("LMABLATE_OPTUNA_STORAGE", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert store_env(cfg.tune.storage_url, cfg.tracking.tracking_uri, project.path) == {
        "MLFLOW_TRACKING_URI": f"sqlite:///{project.path / 'mlflow.db'}"}
    # the environment overrides the params, and is rewritten the same way
    monkeypatch.setenv("LMABLATE_OPTUNA_STORAGE", "sqlite:///tuning/optuna.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow-host:5000")
    assert store_env(cfg.tune.storage_url, cfg.tracking.tracking_uri, project.path) == {
        "LMABLATE_OPTUNA_STORAGE": f"sqlite:///{project.path / 'tuning' / 'optuna.db'}"}


@pytest.mark.parametrize("jobs", ["0", "-1", "two", "1.5"])
def test_bad_jobs_is_one_line_and_exit_2_before_any_work(project, monkeypatch, capsys, jobs):
    monkeypatch.chdir(project.path)
    before = sorted(project.path.rglob("*"))
    assert cli.main(["repro", "--jobs", jobs]) == 2
    err = capsys.readouterr().err
    assert err == (f"lmablate: error: repro: --jobs={jobs!r} is not allowed; expected an "
                   "integer >= 1 (chains reproduced at once)\n")
    assert sorted(project.path.rglob("*")) == before


def test_repro_outside_the_root_of_a_dvc_repository_is_one_line_and_exit_2(
        project, monkeypatch, capsys):
    monkeypatch.chdir(project.path)
    assert cli.main(["repro"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"lmablate: error: repro: {project.path} is not the root of a DVC "
                   "repository (no .dvc folder)"]


def test_dry_prints_the_chains_and_runs_nothing(tmp_path, tiny_params, run_command,
                                                monkeypatch, capsys):
    root = dvc_project(tmp_path, tiny_params(), run_command)
    before = sorted(root.rglob("*"))
    monkeypatch.chdir(root)
    monkeypatch.delenv("LMABLATE_OPTUNA_STORAGE", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert cli.main(["repro", "--dry", "--jobs", "2"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "lmablate repro: upstream, in the main workspace: check generate@arithmetic "
        "tokenize@arithmetic",
        "lmablate repro: chain evaluate@arithmetic-baseline: tune@arithmetic-baseline -> "
        "train@arithmetic-baseline -> evaluate@arithmetic-baseline",
        "lmablate repro: chain evaluate@arithmetic-rope: tune@arithmetic-rope -> "
        "train@arithmetic-rope -> evaluate@arithmetic-rope",
        f"lmablate repro: 2 chains, 2 at a time, in .dvc/tmp/lmablate-workspaces/<chain>; "
        f"LMABLATE_OPTUNA_STORAGE=sqlite:///{root / 'optuna.db'}; "
        f"MLFLOW_TRACKING_URI=sqlite:///{root / 'mlflow.db'}",
        "lmablate repro: then dvc repro in the main workspace (left for it: report)"]
    assert sorted(root.rglob("*")) == before


def test_a_workspace_copies_what_git_tracks_or_would_with_edits_and_shares_the_cache(
        tmp_path, run_command):
    from dvc.repo import Repo

    root = tmp_path / "main"
    root.mkdir()
    assert run_command(["git", "init", "-q"], root).returncode == 0
    assert run_command(["dvc", "init", "-q"], root).returncode == 0
    (root / ".gitignore").write_text("/ignored.txt\n")
    (root / "params.yaml").write_text("committed\n")
    identity = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org",
                "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org"}
    for cmd in (["git", "add", "-A"], ["git", "commit", "-qm", "first"]):
        assert run_command(cmd, root, env=identity).returncode == 0
    (root / "params.yaml").write_text("edited, not committed\n")
    (root / "src").mkdir()
    (root / "src" / "new.py").write_text("untracked\n")
    (root / "ignored.txt").write_text("ignored\n")
    files = workspaces.workspace_files(root)
    assert {"params.yaml", "src/new.py", ".gitignore", ".dvc/config"} <= set(files)
    assert "ignored.txt" not in files
    dest = root / workspaces.WORKSPACES / "chain"
    workspaces.make_workspace(root, dest, files, str(root / ".dvc" / "cache"))
    assert (dest / "params.yaml").read_text() == "edited, not committed\n"
    assert (dest / "src" / "new.py").read_text() == "untracked\n"
    assert not (dest / "ignored.txt").exists()
    with Repo(str(dest)) as repo:
        assert repo.cache.local_cache_dir == str(root / ".dvc" / "cache")
        assert repo.config["core"]["no_scm"]
    # outside git: one line naming the folder
    with pytest.raises(workspaces.ConfigError, match="is not in a git repository"):
        workspaces.workspace_files(tmp_path)


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_chain_runs_its_commands_while_they_succeed_and_a_failure_stops_the_others(tmp_path):
    chains = {
        "slow": (tmp_path, [python("import time; time.sleep(60)")], tmp_path / "slow.log"),
        "fails": (tmp_path, [["true"], python("print('bad'); raise SystemExit(3)"),
                             ["touch", "after-failure"]], tmp_path / "fails.log"),
        "waiting": (tmp_path, [["touch", "never"]], tmp_path / "waiting.log")}
    said: list[str] = []
    # the chains' shells take SIGINT as a terminal gives it, whatever this process was started
    # with (a background job of a shell without job control inherits it ignored)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        start = time.monotonic()
        assert run_chains(chains, 2, {"PATH": "/usr/bin:/bin"}, said.append) == "fails"
        assert time.monotonic() - start < workspaces.STOP_GRACE_SECONDS  # stopped by SIGINT
    finally:
        signal.signal(signal.SIGINT, previous)
    assert said == [f"slow started (log {tmp_path / 'slow.log'})",
                    f"fails started (log {tmp_path / 'fails.log'})"]
    assert (tmp_path / "fails.log").read_text().endswith("\nbad\n")
    assert not (tmp_path / "after-failure").exists() and not (tmp_path / "never").exists()
    ok = {"ok": (tmp_path, [["true"], ["touch", "second"]], None)}
    assert run_chains(ok, 1, {"PATH": "/usr/bin:/bin"}, said.append) is None
    assert (tmp_path / "second").exists() and re.fullmatch(r"ok done in \d+\.\d s", said[-1])


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        return " Z " not in Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2][:3]
    except OSError:
        return False


def test_ctrl_c_stops_every_chain_and_what_it_started_even_if_it_ignores_sigint(
        tmp_path, monkeypatch):
    monkeypatch.setattr(workspaces, "STOP_GRACE_SECONDS", 1.0)
    spawns = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', "
              "'import time; time.sleep(60)']); open('child', 'w').write(str(p.pid)); p.wait()")
    deaf = ("import os, signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
            "open('deaf', 'w').write(str(os.getpid())); time.sleep(60)")
    chains = {"spawns": (tmp_path, [python(spawns)], None),
              "deaf": (tmp_path, [python(deaf)], None)}

    def say(line: str) -> None:
        if line.startswith("deaf"):  # Ctrl-C once both run
            for _ in range(100):
                if (tmp_path / "child").exists() and (tmp_path / "deaf").exists():
                    break
                time.sleep(0.1)
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_chains(chains, 2, {"PATH": "/usr/bin:/bin"}, say)
    pids = [int((tmp_path / name).read_text()) for name in ("child", "deaf")]
    time.sleep(0.2)
    assert [alive(pid) for pid in pids] == [False, False]


@pytest.mark.slow
def test_chains_in_workspaces_give_the_bytes_of_a_plain_repro_and_the_main_repro_reruns_none(
        tmp_path, tiny_params, run_command):
    raw = tiny_params({"tracking": {"enabled": True}})
    plain = new_study(tmp_path / "plain", raw, run_command)
    done = run_command(["dvc", "repro"], plain, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    main = new_study(tmp_path / "main", raw, run_command)
    done = run_command(["lmablate", "repro", "--jobs", "2"], main, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = result_files(plain)
    assert len(results) == 2 + 2 + 10
    for path in results:
        assert (main / path).read_bytes() == (plain / path).read_bytes(), path
    # the main workspace ran the upstream stages before the chains and the report after them;
    # its last dvc repro restored tune and evaluate from the run-cache, and found train (not
    # run-cached: its checkpoints persist) up to date from the chain's dvc.lock entry
    assert re.findall(r"Running stage '([^']+)'", done.stdout) == [
        "check", "generate@arithmetic", "tokenize@arithmetic", "report"]
    pairs = ("arithmetic-baseline", "arithmetic-rope")
    assert set(re.findall(r"Stage '([^']+)' is cached - skipping run", done.stdout)) == {
        *(f"{stage}@{p}" for stage in ("tune", "evaluate") for p in pairs)}
    assert {"train@arithmetic-baseline", "train@arithmetic-rope"} <= set(
        re.findall(r"Stage '([^']+)' didn't change", done.stdout))
    # each chain ran its stages in its own workspace, removed at the end; its log is kept
    out = main / workspaces.WORKSPACES
    assert sorted(p.name for p in out.iterdir()) == ["logs"]
    logs = {p.stem: p.read_text() for p in (out / "logs").iterdir()}
    assert sorted(logs) == ["evaluate@arithmetic-baseline", "evaluate@arithmetic-rope"]
    for end, log in logs.items():
        first = end.replace("evaluate@", "tune@")
        assert f"Running stage '{first}'" in log and f"Running stage '{end}'" in log
    assert "database is locked" not in done.stderr + "".join(logs.values())
    # one Optuna storage and one MLflow store, the main workspace's, as in the plain study
    with sqlite3.connect(main / "optuna.db") as db:
        assert db.execute("select count(*) from studies").fetchone() == (2,)
    counts = []
    for study in (plain, main):
        with sqlite3.connect(study / "mlflow.db") as db:
            counts.append(db.execute("select status, count(*) from runs group by status")
                          .fetchall())
            uris = [u for (u,) in db.execute("select artifact_uri from runs")]
        assert all(u.startswith("mlflow-artifacts:/") for u in uris)
    assert counts[0] == counts[1] and counts[0][0][0] == "FINISHED"
    # beside the main workspace's store, not in a chain's workspace removed after
    assert list((main / "mlartifacts").glob("*/*/artifacts/checkpoint/checkpoint.pt"))
    assert "up to date" in run_command(["dvc", "status"], main).stdout


def test_a_pipeline_dvc_cannot_read_is_one_line_and_exit_2(tmp_path, tiny_params, run_command,
                                                            monkeypatch, capsys):
    root = dvc_project(tmp_path, tiny_params(), run_command)
    (root / "dvc.yaml").write_text((root / "dvc.yaml").read_text().replace(
        "${study.datasets}", "${study.corpora}", 1))
    monkeypatch.chdir(root)
    assert cli.main(["repro", "--dry"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("lmablate: error: repro: DVC cannot read the pipeline: ")
    assert "study.corpora" in line


def test_a_second_repro_in_the_same_folder_is_refused_naming_the_first(
        tmp_path, tiny_params, run_command, monkeypatch, capsys):
    """Two repros in one folder would share their workspaces and chain logs."""
    root = dvc_project(tmp_path, tiny_params(), run_command)
    monkeypatch.chdir(root)
    with workspaces.only_repro(root):  # the first repro, as far as the lock can tell
        before = sorted(p for p in root.rglob("*") if p.name != "lmablate-repro.lock")
        assert cli.main(["repro"]) == 2
        assert capsys.readouterr().err == (
            f"lmablate: error: repro: another lmablate repro (pid {os.getpid()}) is running in "
            f"{root}; wait for it to end or stop it\n")
        assert sorted(p for p in root.rglob("*") if p.name != "lmablate-repro.lock") == before
    assert (root / workspaces.LOCK).read_text() == ""  # released, and no pid left behind


def test_repro_with_a_cluster_that_does_not_answer_fails_before_any_workspace(
        tmp_path, tiny_params, run_command, monkeypatch, capsys):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = dvc_project(tmp_path, tiny_params({"runtime": {"cluster": f"tcp://127.0.0.1:{port}"}}),
                       run_command)
    monkeypatch.chdir(root)
    monkeypatch.delenv("LMABLATE_CLUSTER", raising=False)
    start = time.perf_counter()
    assert cli.main(["repro"]) == 2
    assert time.perf_counter() - start < 5
    assert capsys.readouterr().err == (
        f"lmablate: error: params: runtime.cluster='tcp://127.0.0.1:{port}' is not allowed; "
        f"nothing listens there (connection refused); start the scheduler with dask scheduler "
        f"--port {port}\n")
    assert not (root / workspaces.WORKSPACES).exists()
