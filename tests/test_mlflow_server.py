"""A tiny study tracked into a real ``mlflow server`` on loopback, read back through its REST
API as the MLflow UI reads it: curves, trial states and the metrics the compare view lists."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest
import requests
from lmablate import cli

from conftest import budgets

VARIANTS = ("baseline", "rope")
STUDY = {
    "study": {"seeds": [0, 1], "variants": list(VARIANTS)},
    "train": {"budget_flops": budgets(30), "eval_interval": 10, "eval_iters": 2,
              "warmup_fraction": 0.1},
    # as tests/test_parallel.py: 3 batches of 2 trials, which prunes some of the later ones
    "tune": {"rungs": [[4, 0.5], [2, 1.0]], "trials_per_batch": 2, "reports": 4,
             "bracket_seeds": 1, "bracket_points": 2, "d_model_choices": [16, 32], "lr_low": 1e-3,
             "lr_high": 1e-1},
    "tracking": {"enabled": True, "experiment": "server-test"},
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``mlflow server`` on a free loopback port with a SQLite store; its base URL."""
    tmp = tmp_path_factory.mktemp("mlflow-server")
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", f"sqlite:///{tmp / 'mlflow.db'}",
         "--artifacts-destination", str(tmp / "artifacts"), "--workers", "1"],
        cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if requests.get(f"{url}/health", timeout=2).status_code == 200:
                break
        except requests.ConnectionError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"mlflow server did not start: {proc.stderr.read().decode()[-2000:]}")
        time.sleep(0.5)
    yield url
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def study(server, tmp_path_factory, make_project):
    """Tune, train and evaluate two variants of a tiny arithmetic study into ``server``."""
    project = make_project(tmp_path_factory.mktemp("tracked"), STUDY)
    mp = pytest.MonkeyPatch()
    mp.setenv("MLFLOW_TRACKING_URI", server)
    mp.chdir(project.path)
    try:
        for variant in VARIANTS:
            out = f"runs/{variant}"
            for argv in (
                    ["tune", "arithmetic", variant, "--tokens", "tokens", "--best",
                     f"{out}/best.json", "--trials", f"{out}/trials.csv"],
                    ["train", "arithmetic", variant, "--tokens", "tokens", "--best",
                     f"{out}/best.json", "--checkpoints", f"{out}/ck", "--history",
                     f"{out}/history.csv", "--grad-stats", f"{out}/grad.csv"],
                    ["evaluate", "arithmetic", variant, "--tokens", "tokens", "--raw", "raw",
                     "--checkpoints", f"{out}/ck", "--metrics", f"{out}/metrics.json",
                     "--examples", f"{out}/examples.json"]):
                assert cli.main(argv) == 0, argv
    finally:
        mp.undo()
    return server


def _api(url: str, endpoint: str, **params) -> dict:
    r = requests.get(f"{url}/api/2.0/mlflow/{endpoint}", params=params, timeout=30)
    r.raise_for_status()
    return r.json()


def _runs(url: str, filter_string: str) -> list[dict]:
    exp = _api(url, "experiments/get-by-name", experiment_name="server-test")["experiment"]
    r = requests.post(f"{url}/api/2.0/mlflow/runs/search", timeout=30, json={
        "experiment_ids": [exp["experiment_id"]], "filter": filter_string, "max_results": 1000})
    r.raise_for_status()
    return r.json().get("runs", [])


def _tags(run: dict) -> dict:
    return {t["key"]: t["value"] for t in run["data"].get("tags", [])}


@pytest.mark.slow
def test_every_final_run_has_a_val_loss_curve_strictly_increasing_in_step(study):
    finals = _runs(study, "tags.stage = 'final'")
    assert len(finals) == len(VARIANTS) * 2  # two seeds each
    for run in finals:
        history = _api(study, "metrics/get-history", run_id=run["info"]["run_id"],
                       metric_key="val_loss")["metrics"]
        steps = [m["step"] for m in history]
        assert steps == sorted(set(steps)) and 0 not in steps, (_tags(run), steps)
        assert steps[-1] == int(next(p["value"] for p in run["data"]["params"]
                                     if p["key"] == "steps"))


@pytest.mark.slow
def test_every_tuning_trial_says_its_rung_and_share_of_the_budget(study):
    """The tiny study's rungs are [[4, 0.5], [2, 1.0]]: four trials at half the budget, then
    a bracket of two learning rates (one seed each) at the full budget; each trial run finished
    and carries both as params."""
    trials = [r for r in _runs(study, "tags.stage = 'tune'") if "trial" in _tags(r)]
    assert len(trials) == 6 * len(VARIANTS)
    for run in trials:
        assert run["info"]["status"] == "FINISHED"
    shares = sorted((p["value"] for r in trials for p in r["data"]["params"]
                     if p["key"] == "budget_fraction"), key=float)
    assert shares == ["0.5"] * 4 * len(VARIANTS) + ["1.0"] * 2 * len(VARIANTS)


@pytest.mark.slow
def test_the_compare_view_gets_the_same_metric_keys_for_every_variant(study):
    finals = _runs(study, "tags.stage = 'final'")
    keys = {}
    for run in finals:
        got = _api(study, "runs/get", run_id=run["info"]["run_id"])["run"]
        keys.setdefault(_tags(got)["variant"], set()).add(
            frozenset(m["key"] for m in got["data"]["metrics"]))
    assert set(keys) == set(VARIANTS)
    (one,) = {k for per_variant in keys.values() for k in per_variant}  # one set for all
    assert {"val_loss", "test_loss", "exact_match", "train_seconds"} <= one
    params = {p["key"] for p in finals[0]["data"]["params"]}
    assert "peak_lr" in params and "lr" not in params  # the tuned peak vs the schedule metric
