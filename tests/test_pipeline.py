"""End to end: `dvc repro` of a tiny profile in a temporary copy of the project."""

import csv
import os
import re
import json
import shlex
import shutil
import sqlite3
from pathlib import Path

import pytest
import yaml

from lmablate.config.params import load as load_params
from lmablate.execution.study_plan import TIMES_FILE, study_plan

from conftest import TINY, budgets

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ["baseline", "swiglu", "rope"]
SEEDS = [0, 1, 2]


def pipeline_overrides(corpus: Path) -> dict:
    """Both datasets (Shakespeare from a local corpus), three variants and seeds, tracking on."""
    return {
        "study": {"seeds": SEEDS, "variants": VARIANTS,
                  "datasets": ["shakespeare", "arithmetic"]},
        "datasets": {"shakespeare": {"kind": "text", "source": corpus.name, "sha256": None,
                                     "max_chars": None, "split": {"val": 0.1, "test": 0.1}},
                     "arithmetic": {"n_test": 64}},
        "model": {"context_length": 32},
        # final runs of 12 steps, trials of 6
        "train": {"budget_flops": budgets(12, {"context_length": 32}, batch_size=8),
                  "eval_interval": 6, "eval_iters": 2, "warmup_fraction": 0.1, "batch_size": 8},
        "evaluate": {"max_batches": 2, "batch_size": 32, "max_problems": 64, "n_samples": 1,
                     "sample_tokens": 20},
        "tracking": {"enabled": True},
    }


def new_study(work: Path, params: dict, run_command) -> Path:
    """A fresh project in folder ``work``: the sources, dvc.yaml, ``params`` as params.yaml, the
    plot templates and .dvcignore, git and DVC initialised (nothing committed)."""
    work.mkdir(parents=True, exist_ok=True)
    for name in ("dvc.yaml", "pyproject.toml", "requirements.lock"):
        shutil.copy(ROOT / name, work / name)
    shutil.copytree(ROOT / "src", work / "src", ignore=shutil.ignore_patterns("__pycache__"))
    # the check stage depends on components/ (a user's own components; the worked examples)
    shutil.copytree(ROOT / "components", work / "components",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    assert run_command(["git", "init", "-q"], work).returncode == 0
    assert run_command(["dvc", "init", "-q"], work).returncode == 0
    shutil.copy(ROOT / ".dvcignore", work / ".dvcignore")
    shutil.copytree(ROOT / ".dvc" / "plots", work / ".dvc" / "plots")
    return work


def result_files(study: Path) -> list[Path]:
    """The files, relative to ``study``, that two studies of the same params write byte for
    byte alike (timings, fingerprints, Optuna study names and MLflow run ids are in others)."""
    results = sorted(p.relative_to(study) for pattern in (
        "runs/*/*/best.json", "runs/*/*/metrics.json") for p in study.glob(pattern))
    return results + [Path("reports") / name for name in (
        "comparisons.csv", "replication.csv", "problem_comparisons.csv",
        "detectable_effects.csv", "references.csv", "tuned.csv", "lr_sensitivity.csv",
        "extrapolation.csv", "extrapolation_comparisons.csv", "extrapolation_positions.csv")]


def repro_from_scratch(work: Path, tiny_params, run_command, tracking: bool = True,
                       **runtime) -> Path:
    """A fresh project in ``work`` (:func:`new_study`, params with ``runtime`` changes and
    MLflow tracking on or off), after one ``dvc repro``."""
    corpus = work / "corpus.txt"
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    corpus.write_text((text * (40_000 // len(text) + 1))[:40_000], encoding="utf-8")
    params = tiny_params(pipeline_overrides(corpus))
    params["runtime"].update(runtime)
    params["tracking"]["enabled"] = tracking
    new_study(work, params, run_command)
    first = run_command(["dvc", "repro"], work, timeout=1500)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    return work


@pytest.fixture(scope="module")
def study(tmp_path_factory, tiny_params, run_command):
    return repro_from_scratch(tmp_path_factory.mktemp("study"), tiny_params, run_command)


@pytest.mark.slow
def test_a_second_study_from_scratch_untracked_at_another_worker_count_gives_the_same_bytes(
        study, tmp_path, tiny_params, run_command):
    # untracked too: what MLflow records is never an input of a result
    again = repro_from_scratch(tmp_path, tiny_params, run_command, tracking=False, workers=1)
    results = result_files(study)
    assert len(results) == 2 * 2 * len(VARIANTS) + 10
    for path in results:
        assert (again / path).read_bytes() == (study / path).read_bytes(), path


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
    # the tuning trials reach the report (trials.csv's seed is a tuning seed, not a final one):
    # each dataset's full-budget bracket and first-rung sensitivity
    assert {f"lr_bracket_{d}.png" for d in ("shakespeare", "arithmetic")} <= {
        f.name for f in figures}
    sensitivity = list(csv.DictReader((study / "reports" / "lr_sensitivity.csv").open()))
    assert {(r["dataset"], r["variant"]) for r in sensitivity} == {
        (d, v) for d in ("shakespeare", "arithmetic") for v in VARIANTS}
    report = (study / "reports" / "report.md").read_text()
    appendix = (study / "reports" / "appendix.md").read_text()  # the tuning figures' place
    for f in figures:
        assert f"figures/{f.name}" in report + appendix
    comparisons = list(csv.DictReader((study / "reports" / "comparisons.csv").open()))
    assert {r["variant"] for r in comparisons} == {"swiglu", "rope"}
    # one replicate (study.replicates 1): the replication tables have their header and no
    # rows, the report no section
    assert "tuning_uncertainty" in comparisons[0]
    for name in ("replicates.csv", "replication.csv", "tuning_spread.csv"):
        assert list(csv.DictReader((study / "reports" / name).open())) == []
    assert "## Replication" not in report


@pytest.mark.slow
def test_dvc_shows_one_metrics_row_per_variant_and_one_chart_per_dataset(study, run_command):
    shown = run_command(["dvc", "metrics", "show", "--json"], study)
    assert shown.returncode == 0, shown.stderr
    files = json.loads(shown.stdout)[""]["data"]
    rows = {path: doc["data"] for path, doc in files.items()}
    datasets = ("shakespeare", "arithmetic")
    assert sorted(rows) == sorted([f"reports/metrics/{d}/{v}.json" for d in datasets
                                   for v in VARIANTS] + [f"reports/metrics/{d}.json"
                                                         for d in datasets])
    # a summary, not every seed's values: at most seeds, test loss, answer loss, Δ and verdict
    # in the headline loss, exact match, the longest length's test loss and the tokens to
    # learn (arithmetic)
    assert all(len(r) <= 8 for r in rows.values())
    assert "tokens_to_learn" in rows["reports/metrics/arithmetic/baseline.json"]
    table = run_command(["dvc", "metrics", "show"], study, env={"COLUMNS": "200"})
    assert max(len(line) for line in table.stdout.splitlines()) <= 200
    # the handbook's `dvc exp show` command (docs/dvc.md): every column shown in a 200-column
    # terminal (DVC lists experiments of a commit, so the project's configuration is committed
    # first)
    identity = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org",
                "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org"}
    for cmd in (["git", "add", "dvc.yaml", "params.yaml"], ["git", "commit", "-qm", "study"]):
        assert run_command(cmd, study, env=identity).returncode == 0
    (line,) = [ln for ln in (ROOT / "docs" / "dvc.md").read_text().splitlines()
               if ln.startswith("dvc exp show")]
    shown = run_command(shlex.split(line) + ["--no-pager"], study, env={"COLUMNS": "200"})
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert max(len(ln) for ln in lines) <= 200 and "…" not in shown.stdout, shown.stdout
    header = next(ln for ln in lines if "Experiment" in ln)
    assert [f"reports/metrics/{d}.json:verdict" in header for d in datasets] == [True, True]
    workspace = next(ln for ln in lines if ln.strip().startswith("workspace"))
    for d in datasets:
        assert rows[f"reports/metrics/{d}.json"]["verdict"] in workspace
    plots = run_command(["dvc", "plots", "show", "--json"], study)
    assert plots.returncode == 0, plots.stderr
    charts = json.loads(plots.stdout)["data"]
    assert sorted(charts) == ["reports/curves/arithmetic.csv", "reports/curves/shakespeare.csv"]
    for chart in charts.values():
        (spec,) = chart
        points = spec["content"]["data"]["values"]
        assert [v for v in dict.fromkeys(p["variant"] for p in points)] == VARIANTS
        # coloured by the study-order key, its range the file's colour column (family_palette)
        assert spec["content"]["encoding"]["color"]["field"] == "variant_key"
        assert spec["content"]["encoding"]["color"]["scale"] == {"range": {"field": "colour"}}
        assert all(re.fullmatch(r"#[0-9a-f]{6}", p["colour"]) for p in points)


@pytest.mark.slow
def test_repro_records_trials_and_runs(study):
    with sqlite3.connect(study / "mlflow.db") as db:
        tags = db.execute("select key, value from tags").fetchall()
    stages = [v for k, v in tags if k == "stage"]
    # every variant's seeds, all of replicate 0 (study.replicates 1)
    assert stages.count("final") == 2 * len(VARIANTS) * len(SEEDS)
    replicates = [v for k, v in tags if k == "replicate"]
    assert replicates and set(replicates) == {"0"}
    assert stages.count("tune") >= 2 * len(VARIANTS) * 2  # parents and nested trials
    with sqlite3.connect(study / "optuna.db") as db:
        studies = db.execute("select count(*) from studies").fetchone()[0]
        finished = db.execute("select count(*) from trials where state in "
                              "('COMPLETE', 'PRUNED')").fetchone()[0]
    assert studies == 2 * len(VARIANTS)
    # each study: the first rung's trials, then the full-budget bracket (as many learning rates
    # as the last rung's trials, one seed each: tune.bracket_points and bracket_seeds of TINY)
    assert TINY["tune"]["bracket_seeds"] == 1
    assert TINY["tune"]["bracket_points"] == TINY["tune"]["rungs"][-1][0]
    assert finished == 2 * len(VARIANTS) * sum(n for n, _ in TINY["tune"]["rungs"])
    metrics = json.loads((study / "runs" / "arithmetic" / "rope" / "metrics.json").read_text())
    assert set(metrics["runs"]) == {f"seed_{s}" for s in SEEDS}


@pytest.mark.slow
def test_the_study_plan_is_the_order_dvc_repro_runs_the_stages_in(study, run_command):
    """The stage position each stage prints (lmablate.execution.study_plan) counts what dvc runs."""
    dry = run_command(["dvc", "repro", "--dry", "--force"], study)
    ran = re.findall(r"Running stage '([^']+)'", dry.stdout)
    cfg = load_params(study / "params.yaml")
    assert ran == [s.name for s in study_plan(cfg)] and len(ran) == 1 + 4 + 3 * 2 * 3 + 1
    # each stage run by dvc kept its time, where the next study's estimates read them
    times = json.loads((study / TIMES_FILE).read_text())
    assert set(times) == set(ran)
    assert all(times[s.name]["flops"] == s.flops for s in study_plan(cfg))


@pytest.mark.slow
def test_the_summary_run_carries_the_verdicts_and_its_artifacts_lie_beside_the_store(study):
    with sqlite3.connect(study / "mlflow.db") as db:
        (run_id, uri), = db.execute("select run_uuid, artifact_uri from runs "
                                    "where name = 'study-summary'").fetchall()
        metrics = dict(db.execute("select key, value from metrics where run_uuid=?", (run_id,)))
        tags = dict(db.execute("select key, value from tags where run_uuid=?", (run_id,)))
        params_ = dict(db.execute("select key, value from params where run_uuid=?", (run_id,)))
    rope = json.loads((study / "reports/metrics/arithmetic/rope.json").read_text())
    assert metrics["arithmetic/rope/delta_answer_loss"] == pytest.approx(
        rope["delta_answer_loss"])
    assert tags["arithmetic/rope/verdict"] == rope["verdict"]
    # and every final run of the study its verdict, which the runs view groups by
    with sqlite3.connect(study / "mlflow.db") as db:
        final = db.execute("select t.value, v.value from tags t join tags v on "
                           "t.run_uuid = v.run_uuid join tags d on d.run_uuid = t.run_uuid "
                           "where t.key = 'variant' and v.key = 'verdict' and "
                           "d.key = 'dataset' and d.value = 'arithmetic'").fetchall()
    base = json.loads((study / "reports/metrics/arithmetic/baseline.json").read_text())
    share = rope["delta_answer_loss"] / (rope["answer_loss"] - rope["delta_answer_loss"])
    assert ("rope", f"{rope['verdict']}: Δ {rope['delta_answer_loss']:+.3f} ({share:+.1%})") \
        in final  # the verdict with its rounded difference, the label of the runs view's group
    assert ("baseline", f"baseline: {base['answer_loss']:.3f}") in final
    assert len(final) == len(VARIANTS) * len(SEEDS)
    assert params_["variants"] == str(VARIANTS) and params_["profile"] == "default"
    # a proxied location, resolved against the folder beside mlflow.db: the study can move
    assert uri == f"mlflow-artifacts:/lmablate/{run_id}/artifacts"
    files = study / "mlartifacts" / "lmablate" / run_id / "artifacts"
    assert (files / "report.md").read_bytes() == (study / "reports/report.md").read_bytes()
    # report.html: report.md with every figure it links inline, for MLflow's viewer
    page = (files / "report.html").read_text()
    linked = re.findall(r"!\[[^]]*\]\((figures/[^)]+\.png)\)",
                        (study / "reports/report.md").read_text())
    assert linked and page.count('<img src="data:image/png;base64,') == len(linked)
    # every table the report wrote, byte for byte
    tables = sorted(p.name for p in (study / "reports").glob("*.csv"))
    assert sorted(p.name for p in (files / "tables").iterdir()) == tables and len(tables) > 20
    assert all((files / "tables" / t).read_bytes() == (study / "reports" / t).read_bytes()
               for t in tables)
    assert not (study / "mlruns").exists() or not list((study / "mlruns").rglob("*.*"))


@pytest.mark.slow
def test_second_repro_does_nothing(study, run_command):
    again = run_command(["dvc", "repro"], study, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "Running stage" not in again.stdout
    status = run_command(["dvc", "status"], study)
    assert "up to date" in status.stdout


@pytest.mark.slow
def test_a_bad_param_stops_dvc_repro_at_the_check_stage_with_every_output_kept(
        study, run_command):
    """DVC removes a stage's outputs before it runs it: the check stage, which every stage
    depends on, runs first and refuses the param before DVC reaches a finished stage."""
    kept = [study / p for p in ("runs/arithmetic/baseline/best.json",
                                "runs/arithmetic/baseline/trials.csv",
                                "runs/arithmetic/baseline/metrics.json", "reports/report.md")]
    before = [p.read_bytes() for p in kept]
    params_path = study / "params.yaml"
    good = params_path.read_text()
    params = yaml.safe_load(good)
    params["train"]["lr"] = "abc"
    params_path.write_text(yaml.safe_dump(params, sort_keys=False))
    bad = run_command(["dvc", "repro"], study, timeout=600)
    assert bad.returncode != 0
    assert re.findall(r"Running stage '([^']+)'", bad.stdout) == ["check"]
    assert ("lmablate: error: params: train.lr='abc' is not allowed; expected a finite number"
            in bad.stderr)
    assert [p.read_bytes() for p in kept] == before
    params_path.write_text(good)
    again = run_command(["dvc", "repro"], study, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    # the check's own file, removed by DVC, is written again with the same bytes: nothing else
    assert re.findall(r"Running stage '([^']+)'", again.stdout) == ["check"]
    assert [p.read_bytes() for p in kept] == before


@pytest.mark.slow
def test_a_truncated_checkpoint_is_retrained_by_the_next_repro_to_the_same_bytes(
        study, run_command):
    ckpt = study / "runs" / "arithmetic" / "baseline" / "checkpoints" / "seed_0" / "checkpoint.pt"
    results = [study / "runs" / "arithmetic" / "baseline" / "metrics.json",
               study / "reports" / "comparisons.csv"]
    good, good_results = ckpt.read_bytes(), [p.read_bytes() for p in results]
    os.truncate(ckpt, 1000)
    again = run_command(["dvc", "repro"], study, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    # the seed's result.json records its training time, so evaluate and report run again too,
    # and compute the same bytes
    assert re.findall(r"Running stage '([^']+)'", again.stdout) == [
        "train@arithmetic-baseline", "evaluate@arithmetic-baseline", "report"]
    assert [p.read_bytes() for p in results] == good_results
    assert ("lmablate: runs/arithmetic/baseline/checkpoints/seed_0/checkpoint.pt (1,000 bytes) "
            "does not match the sha256 recorded when it was written (truncated or changed "
            "since); training arithmetic/baseline seed 0 again") in again.stderr
    assert ckpt.read_bytes() == good
    assert "up to date" in run_command(["dvc", "status"], study).stdout


@pytest.mark.slow
def test_bad_variant_fails_before_work(study, run_command):
    res = run_command(["lmablate", "train", "arithmetic", "mamba", "--tokens", "data/tokens/arithmetic",
               "--best", "runs/arithmetic/baseline/best.json", "--checkpoints", "out/ck",
               "--history", "out/h.csv", "--grad-stats", "out/g.csv"], study)
    assert res.returncode == 2
    assert "variant='mamba'" in res.stderr and "baseline" in res.stderr
    assert not (study / "out").exists()


@pytest.mark.slow
def test_a_stage_refuses_inputs_made_for_another_variant_before_any_work(study, run_command):
    """rope's best.json for the baseline's training, the baseline's checkpoints for rope's
    evaluation: both used to exit 0 with the other variant's values."""
    train = run_command(["lmablate", "train", "arithmetic", "baseline", "--tokens",
                         "data/tokens/arithmetic", "--best", "runs/arithmetic/rope/best.json",
                         "--checkpoints", "out/ck", "--history", "out/h.csv", "--grad-stats",
                         "out/g.csv"], study)
    assert train.returncode == 2
    name = json.loads((study / "runs/arithmetic/rope/best.json").read_text())["study_name"]
    assert train.stderr == (
        f"lmablate: error: runs/arithmetic/rope/best.json: tuned for another dataset or variant "
        f"(Optuna study {name}), not arithmetic baseline; pass runs/arithmetic/baseline/"
        "best.json\n")
    evaluate = run_command(["lmablate", "evaluate", "arithmetic", "rope", "--tokens",
                            "data/tokens/arithmetic", "--raw", "data/raw/arithmetic",
                            "--checkpoints", "runs/arithmetic/baseline/checkpoints",
                            "--metrics", "out/m.json", "--examples", "out/e.json"], study)
    assert evaluate.returncode == 2
    assert evaluate.stderr == (
        "lmablate: error: runs/arithmetic/baseline/checkpoints/seed_0: trained for arithmetic "
        "baseline seed 0, not arithmetic rope seed 0; pass --checkpoints "
        "runs/arithmetic/rope/checkpoints\n")
    assert not (study / "out").exists()


@pytest.mark.slow
def test_training_refuses_a_best_json_tuned_for_other_settings(study, tmp_path, run_command):
    """best.json records the settings it was tuned for: with another weight decay in the
    params (and no re-tuning) the train stage refuses it before any work, naming both."""
    params = yaml.safe_load((study / "params.yaml").read_text())
    params["train"]["weight_decay"] = 0.2
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    tuned = json.loads((study / "runs/arithmetic/baseline/best.json").read_text())["settings"]
    res = run_command(["lmablate", "--params", str(tmp_path / "params.yaml"), "train",
                       "arithmetic", "baseline", "--tokens", "data/tokens/arithmetic", "--best",
                       "runs/arithmetic/baseline/best.json", "--checkpoints", "out/ck",
                       "--history", "out/h.csv", "--grad-stats", "out/g.csv"], study)
    assert res.returncode == 2
    line = re.fullmatch(r"lmablate: error: runs/arithmetic/baseline/best\.json: tuned for other "
                        r"settings or data \(fingerprint (\w+)\) than these params and "
                        r"data/tokens/arithmetic give \((\w+)\); run lmablate tune \(or dvc "
                        r"repro\) again\n", res.stderr)
    assert line and line[1] == tuned and line[2] != tuned
    assert not (study / "out").exists()


def changed_stages(study: Path, source: str, run_command) -> set[str]:
    """The stages ``dvc status`` calls changed after a comment is appended to ``source``
    (restored afterwards)."""
    path = study / "src" / "lmablate" / source
    original = path.read_bytes()
    path.write_bytes(original + b"\n# an edit\n")
    try:
        status = run_command(["dvc", "status", "--json"], study)
    finally:
        path.write_bytes(original)
    assert status.returncode == 0, status.stderr[-2000:]
    return set(json.loads(status.stdout))


@pytest.mark.slow
def test_an_edit_reruns_exactly_the_stages_that_import_its_subpackage(study, run_command):
    assert changed_stages(study, "report/figures/losses.py", run_command) == {"report"}
    after_model = changed_stages(study, "model/gpt.py", run_command)
    pairs = [f"{d}-{v}" for d in ("shakespeare", "arithmetic") for v in VARIANTS]
    assert after_model == {f"{stage}@{p}" for stage in ("tune", "train", "evaluate")
                           for p in pairs} | {"report"}
    assert changed_stages(study, "stages/tune.py", run_command) == {f"tune@{p}" for p in pairs}
    datasets = ("shakespeare", "arithmetic")
    # the check stage imports data/ too (it validates the arithmetic format)
    assert changed_stages(study, "data/corpus.py", run_command) == (
        after_model | {f"{stage}@{d}" for stage in ("generate", "tokenize") for d in datasets}
        | {"check"})
    # bytecode beside the modules is no part of the code (.dvcignore)
    cache = study / "src" / "lmablate" / "model" / "__pycache__"
    cache.mkdir(exist_ok=True)
    (cache / "edited.cpython-311.pyc").write_bytes(b"not code")
    try:
        status = run_command(["dvc", "status", "--json"], study)
    finally:
        (cache / "edited.cpython-311.pyc").unlink()
    assert status.returncode == 0 and json.loads(status.stdout) == {}
