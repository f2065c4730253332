"""What a result was computed with: the record in result files (equal on machines of equal
numerics) and the MLflow tags of every run (the machine, the versions, the commit)."""

from __future__ import annotations

import hashlib
import platform
import subprocess
from pathlib import Path

import pytest
import torch

from lmablate.config.study import TrackingConfig
from lmablate.tracking import environment
from lmablate.tracking.trackers import MlflowTracker
from lmablate.train.numerics import numerics_kind

ROOT = Path(__file__).resolve().parents[1]


def test_a_result_s_environment_names_its_numerics_torch_python_and_lock():
    numerics = numerics_kind(torch.device("cpu"))
    assert environment.result_environment(numerics) == {
        "numerics": numerics, "torch": torch.__version__,
        "python": ".".join(platform.python_version_tuple()[:2]),
        "lock": hashlib.sha256((ROOT / "requirements.lock").read_bytes()).hexdigest()[:12]}


def test_the_commit_is_git_s_and_lmablate_repro_s_chains_take_it_from_the_environment(
        monkeypatch, tmp_path):
    monkeypatch.delenv(environment.COMMIT_ENV, raising=False)
    monkeypatch.chdir(ROOT)
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert environment.git_commit().removesuffix("-modified") == head
    monkeypatch.chdir(tmp_path)  # a workspace copy: no git
    assert environment.git_commit() is None
    monkeypatch.setenv(environment.COMMIT_ENV, "abc123")
    assert environment.git_commit() == "abc123"
    monkeypatch.delenv(environment.COMMIT_ENV)
    monkeypatch.setenv(environment.DVC_EXP_BASELINE, "feed42")  # dvc exp run: its baseline
    assert environment.git_commit() == "feed42"


def test_dvc_lock_rewritten_by_a_repro_is_no_modification_of_the_code(monkeypatch, tmp_path,
                                                                      run_command):
    monkeypatch.delenv(environment.COMMIT_ENV, raising=False)
    monkeypatch.delenv(environment.DVC_EXP_BASELINE, raising=False)
    for name, text in (("dvc.lock", "a\n"), ("model.py", "x = 1\n")):
        (tmp_path / name).write_text(text)
    for cmd in (["git", "init", "-q"], ["git", "add", "."],
                ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c"]):
        assert run_command(cmd, tmp_path).returncode == 0
    monkeypatch.chdir(tmp_path)
    head = environment.git_commit()
    assert len(head) == 40
    (tmp_path / "dvc.lock").write_text("b\n")
    assert environment.git_commit() == head
    (tmp_path / "model.py").write_text("x = 2\n")
    assert environment.git_commit() == head + "-modified"


def test_every_mlflow_run_is_tagged_with_the_environment(tmp_path, monkeypatch):
    import mlflow
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv(environment.COMMIT_ENV, "0123abcd-modified")
    monkeypatch.setenv(environment.DVC_EXP_NAME, "vapid-sums")  # as dvc exp run sets it
    environment.environment.cache_clear()
    monkeypatch.setattr(environment, "_numerics", [])  # this process's, restored after
    environment.use_numerics("cpu TEST numerics 000000000000")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = MlflowTracker(TrackingConfig(uri=uri))
    with tracker.run("a-run", {"dataset": "arithmetic"}) as run_id:
        pass
    tags = mlflow.MlflowClient(uri).get_run(run_id).data.tags
    environment.environment.cache_clear()
    assert tags["dataset"] == "arithmetic"
    assert tags["lmablate.numerics"] == "cpu TEST numerics 000000000000"
    assert tags["lmablate.git_commit"] == "0123abcd-modified"
    assert tags["mlflow.source.git.commit"] == "0123abcd"
    assert tags["lmablate.dvc_experiment"] == "vapid-sums"
    assert tags["lmablate.version.torch"] == torch.__version__
    assert tags["lmablate.cpu"] == environment.cpu_model() and tags["lmablate.blas"]
    assert tags["lmablate.lock"] == environment.lock_hash()
    assert {"lmablate.os", "lmablate.python", "lmablate.version.optuna"} <= set(tags)


@pytest.mark.parametrize("text, model", [("model name\t: AMD EPYC 9B14\n", "AMD EPYC 9B14")])
def test_the_cpu_model_is_read_from_cpuinfo(monkeypatch, tmp_path, text, model):
    fake = tmp_path / "cpuinfo"
    fake.write_text("processor\t: 0\n" + text)
    real = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: real(
        fake if str(self) == "/proc/cpuinfo" else self, *a, **k))
    environment.cpu_model.cache_clear()
    try:
        assert environment.cpu_model() == model
    finally:
        environment.cpu_model.cache_clear()
