"""End to end: `dvc repro` of a tiny profile in a temporary copy of the project."""

import csv
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
VARIANTS = ["baseline", "swiglu", "rope"]
SEEDS = [0, 1, 2]


def tiny_params(corpus: Path) -> dict:
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["study"].update(seeds=SEEDS, variants=VARIANTS)
    raw["datasets"]["shakespeare"] = {"kind": "text", "source": str(corpus),
                                      "split": {"val": 0.1, "test": 0.1}}
    raw["datasets"]["arithmetic"].update(n_train=2000, n_test=64)
    raw["model"].update(context_length=32, n_layers=1, n_heads=2, d_model=16)
    raw["train"].update(steps=12, eval_interval=6, eval_iters=2, warmup_steps=2, batch_size=8)
    raw["tune"].update(n_trials=2, steps=6, d_model_choices=[16])
    raw["evaluate"].update(max_batches=2, batch_size=32, max_problems=64, n_samples=1,
                           sample_tokens=20)
    return raw


def run(cmd, cwd, **kw):
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("LMABLATE_OPTUNA_STORAGE", None)
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, **kw)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    work = tmp_path_factory.mktemp("study")
    for name in ("dvc.yaml", "pyproject.toml"):
        shutil.copy(ROOT / name, work / name)
    shutil.copytree(ROOT / "src", work / "src", ignore=shutil.ignore_patterns("__pycache__"))
    corpus = work / "corpus.txt"
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    corpus.write_text((text * (40_000 // len(text) + 1))[:40_000], encoding="utf-8")
    (work / "params.yaml").write_text(yaml.safe_dump(tiny_params(corpus), sort_keys=False))
    assert run(["git", "init", "-q"], work).returncode == 0
    assert run(["dvc", "init", "-q"], work).returncode == 0
    first = run(["dvc", "repro"], work, timeout=1500)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    return work


@pytest.mark.slow
def test_repro_writes_report_tables_and_figures(study):
    rows = list(csv.DictReader((study / "reports" / "ablation.csv").open()))
    assert len(rows) == 2 * len(VARIANTS) * len(SEEDS)
    assert {(r["dataset"], r["variant"]) for r in rows} == {
        (d, v) for d in ("shakespeare", "arithmetic") for v in VARIANTS}
    for r in rows:
        assert float(r["test_loss"]) > 0
        if r["dataset"] == "arithmetic":
            assert 0.0 <= float(r["exact_match"]) <= 1.0
    figures = list((study / "reports" / "figures").glob("*.png"))
    assert len(figures) >= 4
    report = (study / "reports" / "report.md").read_text()
    for f in figures:
        assert f"figures/{f.name}" in report
    comparisons = list(csv.DictReader((study / "reports" / "comparisons.csv").open()))
    assert {r["variant"] for r in comparisons} == {"swiglu", "rope"}


@pytest.mark.slow
def test_repro_records_trials_and_runs(study):
    with sqlite3.connect(study / "mlflow.db") as db:
        tags = db.execute("select key, value from tags").fetchall()
    stages = [v for k, v in tags if k == "stage"]
    assert stages.count("final") == 2 * len(VARIANTS) * len(SEEDS)
    assert stages.count("tune") >= 2 * len(VARIANTS) * 2  # parents and nested trials
    with sqlite3.connect(study / "optuna.db") as db:
        studies = db.execute("select count(*) from studies").fetchone()[0]
        finished = db.execute("select count(*) from trials where state in "
                              "('COMPLETE', 'PRUNED')").fetchone()[0]
    assert studies == 2 * len(VARIANTS)
    assert finished == 2 * len(VARIANTS) * 2
    metrics = json.loads((study / "runs" / "arithmetic" / "rope" / "metrics.json").read_text())
    assert set(metrics["runs"]) == {f"seed_{s}" for s in SEEDS}


@pytest.mark.slow
def test_second_repro_does_nothing(study):
    again = run(["dvc", "repro"], study, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "Running stage" not in again.stdout
    status = run(["dvc", "status"], study)
    assert "up to date" in status.stdout


@pytest.mark.slow
def test_bad_variant_fails_before_work(study):
    res = run(["lmablate", "train", "arithmetic", "mamba", "--tokens", "data/tokens/arithmetic",
               "--best", "runs/arithmetic/baseline/best.json", "--checkpoints", "out/ck",
               "--history", "out/h.csv", "--grad-stats", "out/g.csv"], study)
    assert res.returncode == 2
    assert "variant='mamba'" in res.stderr and "baseline" in res.stderr
    assert not (study / "out").exists()
