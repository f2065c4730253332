"""Children end with their parent (lmablate.execution.lifetime): a stage that dvc runs ends when dvc
is killed, before it writes outputs dvc would not record; one run by anything else outlives it (a
stage started under nohup must survive its shell); the MLflow sidecar ends with its stage."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lmablate.execution.lifetime import parent_is_dvc

from conftest import budgets

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="prctl(PR_SET_PDEATHSIG)")

LAUNCHER = """import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-m", "lmablate.cli", *sys.argv[1:]],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(child.pid, flush=True)
time.sleep(600)
"""


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for a parent that is gone."""
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def wait_until(predicate, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def launch(project: Path, program: str, argv: list[str]) -> tuple[subprocess.Popen, int]:
    """``program`` (a launcher script of that name) running ``lmablate <argv>`` in ``project``:
    the launcher and the stage's pid."""
    script = project / "bin" / program
    script.parent.mkdir(exist_ok=True)
    script.write_text(LAUNCHER)
    launcher = subprocess.Popen([sys.executable, str(script), *argv], cwd=project,
                                stdout=subprocess.PIPE, text=True)
    return launcher, int(launcher.stdout.readline())


TUNE = ["tune", "arithmetic", "baseline", "--tokens", "tokens", "--best", "t/best.json",
        "--trials", "t/trials.csv"]


@pytest.fixture
def slow(project):
    """A project whose tuning takes minutes: time to kill its parent."""
    project.write_params(lambda r: r["train"].update(budget_flops=budgets(3000)))
    return project


def test_a_stage_run_by_dvc_ends_when_dvc_is_killed(slow):
    project = slow
    dvc, stage = launch(project.path, "dvc", TUNE)
    assert parent_is_dvc(dvc.pid) and not parent_is_dvc(os.getpid())
    time.sleep(1.5)  # past the stage's start-up
    assert alive(stage)
    dvc.send_signal(signal.SIGKILL)
    dvc.wait()
    assert wait_until(lambda: not alive(stage), 10), "the stage outlived dvc"
    assert not (project.path / "t" / "best.json").exists()


def test_a_stage_run_by_anything_else_outlives_it(slow):
    shell, stage = launch(slow.path, "runner", TUNE)
    time.sleep(1.5)
    shell.send_signal(signal.SIGKILL)
    shell.wait()
    try:
        assert not wait_until(lambda: not alive(stage), 3), "the stage died with its shell"
    finally:
        os.kill(stage, signal.SIGKILL)


def test_the_mlflow_sidecar_ends_with_its_stage(tmp_path):
    code = ("import os, time; from lmablate.tracking.sidecar import Sidecar; s = Sidecar(); "
            "print(s._proc.pid, flush=True); time.sleep(600)")
    stage = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, stdout=subprocess.PIPE,
                             text=True)
    sidecar = int(stage.stdout.readline())
    assert alive(sidecar)
    stage.send_signal(signal.SIGKILL)
    stage.wait()
    assert wait_until(lambda: not alive(sidecar), 10), "the sidecar outlived its stage"
