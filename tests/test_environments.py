"""Results of another environment refused: installed packages against the lock
(lmablate.core.installed), a best.json tuned with other numerics, a study's metrics.json files
of two environments; and study.mixed_environments, which takes them and says so
(lmablate.tracking.environment)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from lmablate.stages import report
from lmablate.stages.train import check_tuned_here
from lmablate.core import installed as I
from lmablate.tracking import environment as E

from synthetic_study import ENV, make_cfg, write_runs

HERE = {"numerics": "cpu AVX2 numerics 81a33a6ed2ea", "torch": "2.13.0+cpu", "python": "3.11",
        "lock": "0bf70bd5b88d"}
OTHER = {**HERE, "numerics": "cpu AVX512 numerics 192fa7a60517"}


def test_the_installed_packages_match_the_lock_they_were_installed_from():
    assert I.lock_mismatches() == []
    I.check_installed_lock()


def test_a_lock_pin_that_is_not_installed_is_refused_before_any_work(tmp_path):
    import importlib.metadata
    numpy = importlib.metadata.version("numpy")
    lock = tmp_path / "requirements.lock"
    text = I.LOCK.read_text()
    assert f"\nnumpy=={numpy}\n" in text
    lock.write_text(text.replace(f"\nnumpy=={numpy}\n", "\nnumpy==9.9.9\n")
                    + "not-installed-anywhere==1.0\nmarked==1.0 ; sys_platform == 'plan9'\n")
    assert I.lock_mismatches(lock) == [f"numpy==9.9.9 (installed: {numpy})"]
    with pytest.raises(RuntimeError) as err:
        I.check_installed_lock(lock)
    assert str(err.value) == (
        f"requirements.lock pins numpy==9.9.9 (installed: {numpy}): the results would record "
        "versions that did not compute them; install the lock (pip install -c "
        "requirements.lock -e .) or restore it (git checkout requirements.lock)")


def test_a_local_version_label_matches_its_release():
    import importlib.metadata
    torch = importlib.metadata.version("torch")
    assert E.same_environment(HERE, dict(HERE, python="3.12", lock="other"))  # not compared
    assert not E.same_environment(HERE, OTHER) and E.same_environment(None, OTHER)
    assert torch.split("+")[0] in I.LOCK.read_text()


def test_training_refuses_a_best_json_tuned_with_other_numerics_unless_mixed_is_allowed():
    best = {"lr": 0.01, "d_model": 24, "environment": OTHER}
    with pytest.raises(ValueError) as err:
        check_tuned_here(best, Path("runs/a/b/best.json"), HERE, mixed=False)
    assert str(err.value) == (
        "runs/a/b/best.json: tuned with numerics 'cpu AVX512 numerics 192fa7a60517', torch "
        "2.13.0+cpu, but this stage trains with numerics 'cpu AVX2 numerics 81a33a6ed2ea', "
        "torch 2.13.0+cpu; tune here (dvc repro -f the tune stage), or set "
        "study.mixed_environments: true to train from it anyway")
    check_tuned_here(best, Path("b.json"), HERE, mixed=True)
    check_tuned_here({"budgets": [{"environment": HERE}]}, Path("b.json"), HERE, mixed=False)
    check_tuned_here({"lr": 0.01}, Path("b.json"), HERE, mixed=False)  # none recorded


def _with_environments(runs: Path, other: tuple[str, str]) -> None:
    """Every metrics.json of ``runs`` computed HERE but ``other`` (dataset, variant), OTHER."""
    for path in runs.glob("*/*/metrics.json"):
        doc = json.loads(path.read_text())
        doc["environment"] = OTHER if (path.parent.parent.name, path.parent.name) == other \
            else HERE
        path.write_text(json.dumps(doc))


def test_the_report_refuses_results_of_two_environments_naming_both(tmp_path):
    write_runs(tmp_path / "runs")
    _with_environments(tmp_path / "runs", ("arithmetic", "gelu"))
    with pytest.raises(ValueError) as err:
        report.build_report(make_cfg(), tmp_path / "runs", tmp_path / "reports", ENV)
    assert str(err.value) == (
        f"{tmp_path}/runs/arithmetic/gelu/metrics.json: computed with numerics 'cpu AVX512 "
        f"numerics 192fa7a60517', torch 2.13.0+cpu, but {tmp_path}/runs/shakespeare/baseline/"
        "metrics.json with numerics 'cpu AVX2 numerics 81a33a6ed2ea', torch 2.13.0+cpu; "
        "results of two environments are not compared: run the stages of one of them again "
        "here (dvc repro -f), or set study.mixed_environments: true")
    assert not (tmp_path / "reports").exists()


def test_with_mixed_environments_the_report_compares_them_and_says_so_in_its_findings(tmp_path):
    write_runs(tmp_path / "runs")
    _with_environments(tmp_path / "runs", ("arithmetic", "gelu"))
    cfg = dataclasses.replace(make_cfg(), mixed_environments=True)
    md = report.build_report(cfg, tmp_path / "runs", tmp_path / "reports", ENV)[
        "report"].read_text()
    findings = md.split("## Findings\n\n", 1)[1]
    assert findings.startswith(
        "**Results of 2 environments are compared** (`study.mixed_environments: true`): a "
        "difference between variants may come from the environment as well as from the "
        "feature.\n\n"
        "- numerics 'cpu AVX2 numerics 81a33a6ed2ea', torch 2.13.0+cpu: shakespeare/baseline, "
        "shakespeare/gelu, shakespeare/rmsnorm, arithmetic/baseline, arithmetic/rmsnorm\n"
        "- numerics 'cpu AVX512 numerics 192fa7a60517', torch 2.13.0+cpu: arithmetic/gelu\n")
