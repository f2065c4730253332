"""End to end: a profile run as a DVC experiment (`dvc exp run --temp -S profile=<name>`) in a
temporary copy of the project, beside the committed default it leaves untouched."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from lmablate.config import profiles
from lmablate.execution.study_plan import TIMES_FILE

from conftest import TINY

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def project(tmp_path_factory, run_command) -> Path:
    """The project's sources, dvc.yaml, conf/ with a tiny profile, and DVC's config (Hydra on),
    committed; params.yaml the defaults' composition."""
    work = tmp_path_factory.mktemp("project")
    for name in ("dvc.yaml", "pyproject.toml", "requirements.lock", ".gitignore"):
        shutil.copy(ROOT / name, work / name)
    shutil.copytree(ROOT / "src", work / "src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "components", work / "components",  # a dep of the check stage
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "conf", work / "conf")
    tiny = {**TINY, "study": {**TINY["study"], "profile": "tiny"},
            "tracking": {"enabled": True}}
    (work / "conf" / "profile" / "tiny.yaml").write_text(
        "# @package _global_\n" + yaml.safe_dump(tiny, sort_keys=False))
    (work / "params.yaml").write_text(profiles.compose(work))
    assert run_command(["git", "init", "-q"], work).returncode == 0
    assert run_command(["dvc", "init", "-q"], work).returncode == 0
    shutil.copy(ROOT / ".dvcignore", work / ".dvcignore")
    shutil.copy(ROOT / ".dvc" / "config", work / ".dvc" / "config")
    shutil.copytree(ROOT / ".dvc" / "plots", work / ".dvc" / "plots")
    for cmd in (["git", "add", "-A"], ["git", "commit", "-qm", "project"]):
        assert run_command(cmd, work).returncode == 0
    done = run_command(["dvc", "exp", "run", "--temp", "-S", "profile=tiny", "-n", "tiny-run"],
                       work, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return work


@pytest.mark.slow
def test_a_profile_runs_as_an_experiment_and_leaves_the_workspace_as_it_was(project,
                                                                             run_command):
    assert run_command(["git", "status", "--porcelain"], project).stdout == ""
    assert (project / "params.yaml").read_text() == profiles.compose(project)
    assert not (project / "runs").exists()  # computed in DVC's copy, kept in the experiment
    shown = json.loads(run_command(["dvc", "exp", "show", "--json"], project).stdout)
    (exp,) = [e for row in shown for e in (row.get("experiments") or [])
              if e.get("name") == "tiny-run"]
    data = exp["revs"][0]["data"]
    assert data["params"]["params.yaml"]["data"]["study"]["profile"] == "tiny"
    verdicts = data["metrics"]["reports/metrics/arithmetic.json"]["data"]
    assert verdicts["seeds"] == 1 and "verdict" in verdicts


@pytest.mark.slow
def test_an_experiment_records_into_the_project_s_mlflow_store_and_times(project):
    with sqlite3.connect(project / "mlflow.db") as db:
        tagged = db.execute("select count(distinct run_uuid) from tags where key = "
                            "'lmablate.dvc_experiment' and value = 'tiny-run'").fetchone()[0]
        (run_id,) = db.execute("select run_uuid from runs where name = 'study-summary'"
                               ).fetchone()
    assert tagged == db_runs(project)
    summary = project / "mlartifacts" / "lmablate" / run_id / "artifacts"
    assert (summary / "report.md").is_file() and list((summary / "figures").glob("*.png"))
    times = json.loads((project / TIMES_FILE).read_text())
    assert "report" in times and "train@arithmetic-rope" in times


def db_runs(project: Path) -> int:
    with sqlite3.connect(project / "mlflow.db") as db:
        return db.execute("select count(*) from runs").fetchone()[0]


@pytest.mark.slow
def test_a_killed_temp_run_s_copy_is_removed_by_the_next_check(project, run_command):
    # a run with another param, so that its stages run rather than come from DVC's run cache
    run = subprocess.Popen(["dvc", "exp", "run", "--temp", "-S", "profile=tiny", "-S",
                            "train.weight_decay=0.05", "-n", "killed-run"], cwd=project,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
    copies = project / ".dvc" / "tmp" / "exps" / "standalone"
    deadline = time.monotonic() + 300
    try:  # kill it once its own check stage passed: DVC holds the copy's repo lock then
        while not list(copies.glob("tmp*/data/checked.txt")):
            assert run.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    (killed,) = copies.glob("tmp*")
    done = run_command(["lmablate", "check", "--out", str(project / "checked.txt"),
                        "--components", str(project / "records")], project)
    assert done.returncode == 0, done.stderr
    assert f"removed 1 killed dvc exp run --temp copy ({killed.name})" in done.stdout + done.stderr
    assert not killed.exists()
    (project / "checked.txt").unlink()
    shutil.rmtree(project / "records")
