"""The README as the front page: its findings block is what docs/update_readme.py writes, its
commands block is what .ci/run reads, and its links into the handbook lead to pages."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest
import yaml

from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _load(name: str):
    return load_script(ROOT / "docs" / f"{name}.py")


@pytest.fixture(scope="module")
def gen():
    return _load("update_readme")


def test_the_readme_findings_block_round_trips_through_the_generator(gen):
    block = gen.block_of(README)
    rows = gen.parse(block)
    assert rows, "the findings block has no rows"
    assert gen.render(rows, gen.origin_of(block)) == block
    for dataset in {r.dataset for r in rows}:
        of = [r for r in rows if r.dataset == dataset]
        assert of[0].variant == gen.BASELINE and all(r.verdict for r in of[1:]), dataset
    assert (ROOT / gen.FIGURE).is_file()
    assert (ROOT / gen.FIGURE).stat().st_size < 300_000


def _write(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def test_the_generator_reads_a_study_and_writes_the_block(gen, tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir()
    summary, comparisons, sensitivity, tuned = [], [], [], []
    for ds, metric in (("text", "test_loss"), ("sums", "answer_loss")):
        for i, variant in enumerate(("baseline", "rope")):
            for m in {metric, "test_loss"} | ({"exact_match"} if ds == "sums" else set()):
                summary.append({"dataset": ds, "variant": variant, "metric": m, "n": 5,
                                "mean": 2.0 - 0.1 * i, "std": 0.01, "ci95_low": 1.99 - 0.1 * i,
                                "ci95_high": 2.01 - 0.1 * i})
            sensitivity.append({"dataset": ds, "variant": variant, "lr_sensitivity": 0.25 + i})
            tuned.append({"dataset": ds, "variant": variant, "tuning_uncertainty": 0.01 + i / 100,
                          "lr_sensitivity_full": 0.003 * (1 + i)})
        comparisons.append({"dataset": ds, "metric": metric, "variant": "rope",
                            "mean_diff": -0.1, "ci_holm_low": -0.12, "ci_holm_high": -0.08,
                            "p_holm": 0.0004, "verdict": "better"})
    _write(reports / "summary.csv", summary)
    _write(reports / "comparisons.csv", comparisons)
    _write(reports / "lr_sensitivity.csv", sensitivity)
    _write(reports / "tuned.csv", tuned)
    rows = gen.collect(tmp_path)
    assert [(r.dataset, r.variant, r.metric) for r in rows] == [
        ("text", "baseline", "test_loss"), ("text", "rope", "test_loss"),
        ("sums", "baseline", "answer_loss"), ("sums", "rope", "answer_loss")]
    block = gen.render(rows, "From the study whose `dvc.lock` is committed (its reports' "
                             "fingerprint `0123456789ab`), computed with ...")
    assert gen.fingerprint_of(block) == "0123456789ab"
    assert "| text | `rope` | 5 | test loss, nats/char | 1.900 ± 0.010 | −0.100 [−0.120, −0.080] " \
           "| <0.001 | ▲ better | – | 0.020 | 1.250 | 0.006 |" in block
    assert "**sums**: better than the baseline: rope" in block
    assert gen.render(gen.parse(block), gen.origin_of(block)) == block
    readme = f"before\n{gen.START}\nold\n{gen.END}\nafter\n"
    assert gen.replace_block(readme, block) == f"before\n{block}\nafter\n"


def test_the_committed_dvc_lock_is_of_the_current_code_params_and_lock(gen):
    """The README's numbers come from the study dvc.lock records: a stage's code, params or
    requirements.lock changed since then means they may no longer be what a fresh clone gets."""
    changed = gen.changed_since_lock(ROOT)
    assert not changed, (
        f"dvc.lock records other versions of {changed}: run the default study from a fresh "
        "clone (README), copy its dvc.lock here and run python docs/update_readme.py <study>")


def test_the_readme_findings_are_those_of_the_study_dvc_lock_records(gen):
    assert gen.fingerprint_of(gen.block_of(README)) == gen.study_fingerprint(ROOT), (
        "the README's findings are not from the study of the committed dvc.lock: run python "
        "docs/update_readme.py <that study>")


def _record(gen, root: Path) -> None:
    """What a study at ``root``'s files writes into its dvc.lock: every repository dep's hash
    (a file's md5, a subpackage folder's ``.dir`` hash, as DVC computes them) and every param's
    value as they are now."""
    from dvc.repo import Repo
    lock = yaml.safe_load((root / "dvc.lock").read_text())
    params = yaml.safe_load((root / "params.yaml").read_text())
    saved, stage_deps = {}, {}
    with Repo(str(root)) as repo:
        for stage in repo.index.stages:
            stage_deps[stage.name] = [dep.def_path for dep in stage.deps]
            for dep in stage.deps:
                path = dep.def_path
                if (path in saved or path == "params.yaml" or not (root / path).exists()
                        or path.split("/")[0] in gen.DATA_FOLDERS):
                    continue
                dep.save()
                saved[path] = dep.dumpd()
    for name, body in lock["stages"].items():
        body["deps"] = [saved.get(dep["path"], dep) for dep in body.get("deps", [])
                        if (root / dep["path"]).exists()  # a study records what exists
                        or dep["path"].split("/")[0] in gen.DATA_FOLDERS]
        # and a dep dvc.yaml gained since (a study records every dep of its stage)
        had = {dep["path"] for dep in body["deps"]}
        body["deps"] += [saved[path] for path in stage_deps.get(name, [])
                         if path in saved and path not in had]
        recorded = body.get("params", {}).get("params.yaml", {})
        for key in recorded:
            node = params
            for part in key.split("."):
                node = node[part]
            recorded[key] = node
    (root / "dvc.lock").write_text(yaml.safe_dump(lock))


def test_a_changed_module_or_param_makes_the_lock_stale_until_a_study_records_them(
        gen, tmp_path):
    import shutil
    from dvc.repo import Repo
    for name in ("dvc.yaml", "dvc.lock", "params.yaml", "requirements.lock"):
        (tmp_path / name).write_bytes((ROOT / name).read_bytes())
    shutil.copytree(ROOT / "src", tmp_path / "src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "components", tmp_path / "components",
                    ignore=shutil.ignore_patterns("__pycache__"))
    Repo.init(str(tmp_path), no_scm=True).close()  # DVC's status is what reads it
    _record(gen, tmp_path)
    assert gen.changed_since_lock(tmp_path) == []
    training = tmp_path / "src" / "lmablate" / "train" / "training.py"
    training.write_text(training.read_text() + "\n# an edit\n")
    # the stages depend on the subpackage (dvc.yaml), so DVC names its folder
    assert gen.changed_since_lock(tmp_path) == ["src/lmablate/train"]
    raw = yaml.safe_load((tmp_path / "params.yaml").read_text())
    raw["train"]["batch_size"] = 8
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    assert gen.changed_since_lock(tmp_path) == ["params.yaml: train", "src/lmablate/train"]
    (tmp_path / "requirements.lock").write_text("numpy==1.0\n")
    assert "requirements.lock" in gen.changed_since_lock(tmp_path)
    _record(gen, tmp_path)  # a study at the new code, params and lock
    assert gen.changed_since_lock(tmp_path) == []


def test_the_readme_is_a_front_page_with_the_commands_ci_reads():
    assert len(README.splitlines()) <= 150
    # .ci/run reads the two lines after <!-- commands -->: the install and study, then the tests
    block = README.split("<!-- commands -->\n", 1)[1].split("```\n", 2)[1].splitlines()
    assert block[0].endswith(" && dvc repro") and block[1].endswith("pytest"), block
    assert "TIME_PLACEHOLDER" not in README


def test_the_readme_links_into_the_handbook_lead_to_pages():
    links = re.findall(r"\]\((?!https?:|#)([^)#\s]+)(?:#[^)]*)?\)", README)
    assert any(link.startswith("docs/") for link in links)
    for link in links:
        assert (ROOT / link).exists(), link


def test_every_handbook_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = [p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").glob("*.md")]
    assert pages and all(page in nav for page in pages), pages
