"""What the report stage refuses and how it writes: impossible values and uneven inputs named in
one line before any output, a one-variant study reported as such, and outputs that are replaced
all at once or not at all (lmablate.core.staging.staged_folder)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest

from lmablate.report import staging
from lmablate.report import collect
from lmablate.stages import report

from synthetic_study import ENV, make_cfg, write_runs


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _edit_seed(runs: Path, dataset: str, variant: str, seed_key: str, **values) -> Path:
    """Set fields of one seed's results in its metrics.json, written as json.dumps writes
    NaN and Infinity (as a file edited by hand or a broken writer would hold them)."""
    path = runs / dataset / variant / "metrics.json"
    doc = json.loads(path.read_text())
    for field, value in values.items():
        if value is ...:
            del doc["runs"][seed_key][field]
        else:
            doc["runs"][seed_key][field] = value
    path.write_text(json.dumps(doc))
    return path


# ----------------------------------------------------------------------------------------------
# staged_folder
# ----------------------------------------------------------------------------------------------

def test_a_staged_folder_replaces_what_it_wrote_and_keeps_the_rest(tmp_path):
    out = tmp_path / "reports"
    (out / "figures").mkdir(parents=True)
    (out / "figures" / "stale.png").write_text("old figure")
    (out / "table.csv").write_text("old")
    (out / "notes.txt").write_text("the user's")
    with staging.staged_folder(out) as stage:
        assert stage.parent == tmp_path and stage.name.startswith(".reports.staging-")
        assert list(stage.iterdir()) == []
        (stage / "figures").mkdir()
        (stage / "figures" / "new.png").write_text("new figure")
        (stage / "table.csv").write_text("new")
        assert (out / "table.csv").read_text() == "old"  # nothing moves before the end
    assert _files(out) == {"figures/new.png": b"new figure", "notes.txt": b"the user's",
                           "table.csv": b"new"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reports"]


def test_a_failure_in_a_staged_folder_leaves_the_folder_as_it_was(tmp_path):
    out = tmp_path / "reports"
    out.mkdir()
    (out / "table.csv").write_text("old")
    with pytest.raises(RuntimeError, match="drawing failed"):
        with staging.staged_folder(out) as stage:
            (stage / "table.csv").write_text("new")
            raise RuntimeError("drawing failed")
    assert _files(out) == {"table.csv": b"old"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reports"]


def test_a_staging_folder_left_by_a_killed_run_is_removed_by_the_next(tmp_path):
    left = tmp_path / ".reports.staging-abc123"
    (left / "figures").mkdir(parents=True)
    (left / "figures" / "half.png").write_text("half written")
    with staging.staged_folder(tmp_path / "reports") as stage:
        (stage / "report.md").write_text("done")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reports"]
    assert _files(tmp_path / "reports") == {"report.md": b"done"}


# ----------------------------------------------------------------------------------------------
# The report: all or nothing
# ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def one_variant(tmp_path_factory):
    """``(root, cfg, paths)``: a finished report of a study of the baseline alone."""
    root = tmp_path_factory.mktemp("one_variant")
    write_runs(root / "runs", variants=("baseline",))
    cfg = make_cfg(variants=("baseline",))
    return root, cfg, report.build_report(cfg, root / "runs", root / "reports", environment=ENV)


def test_a_one_variant_study_gives_a_report_that_says_nothing_is_compared(one_variant):
    _, _, paths = one_variant
    md = paths["report"].read_text()
    for ds in ("shakespeare", "arithmetic"):
        assert (f"**{ds}**: the study has one variant, baseline: nothing is compared, so the "
                "report describes it and draws no verdict.") in md
    assert md.count("- What it can say: nothing about a feature, since no variant was "
                    "compared with the baseline.") == 2
    assert "| design | 1 variant (baseline) x 2 datasets" in md
    assert "paired over 0 seeds" not in md and "Each of 1 variants" not in md
    assert pd.read_csv(paths["comparisons"]).empty
    assert Path(paths["report"].parent / "figures" / "exact_match_by_op.png").is_file()


def test_a_report_that_fails_midway_leaves_the_previous_report_as_it_was(one_variant, tmp_path,
                                                                         monkeypatch):
    root, cfg, paths = one_variant
    out = tmp_path / "reports"
    report.build_report(cfg, root / "runs", out, environment=ENV)
    (out / "figures" / "stale.png").write_bytes(b"a figure of a variant no longer studied")
    before = _files(out)

    def broken(*args, **kwargs):
        raise RuntimeError("a figure failed")
    monkeypatch.setattr(report, "draw_report_figures", broken)
    with pytest.raises(RuntimeError, match="a figure failed"):
        report.build_report(cfg, root / "runs", out, environment=ENV)
    assert _files(out) == before  # the tables written before the failure went nowhere
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reports"]

    monkeypatch.undo()
    again = report.build_report(cfg, root / "runs", out, environment=ENV)
    assert not (out / "figures" / "stale.png").exists()  # figures/ is replaced as a whole
    assert _files(out) == {k: v for k, v in before.items() if k != "figures/stale.png"}
    assert again["report"] == out / "report.md"
    assert all(p.parent == out / "figures" and p.is_file() for p in again["figures"])


def test_the_report_refuses_a_folder_beside_which_it_cannot_stage(tmp_path, monkeypatch):
    from lmablate.core import fileio
    from lmablate.core.validation import OutputError
    parent = tmp_path / "locked"
    (parent / "reports").mkdir(parents=True)

    def refuse(prefix, dir=None, **kw):  # a read-only folder, as root sees one: the probe fails
        if Path(dir) == parent:
            raise PermissionError(13, "Permission denied")
        return real(prefix=prefix, dir=dir, **kw)
    real = fileio.tempfile.mkstemp
    monkeypatch.setattr(fileio.tempfile, "mkstemp", refuse)
    with pytest.raises(OutputError) as err:
        staging.check_stageable(parent / "reports")
    assert str(err.value) == (f"cannot write {parent}/.reports.staging: folder {parent} is not "
                              "writable (Permission denied)")
    staging.check_stageable(tmp_path / "elsewhere" / "reports")


# ----------------------------------------------------------------------------------------------
# Impossible and uneven inputs: one line, before any output
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("field", "value", "shown", "why"), [
    ("test_loss", float("nan"), "nan", "not finite"),
    ("test_loss", float("inf"), "inf", "not finite"),
    ("test_loss", -2.11, "-2.11", "a loss is a cross-entropy, at least 0"),
    ("val_loss", "abc", "'abc'", "not a number"),
    ("perplexity", 0.5, "0.5", "a perplexity is exp(loss), at least 1"),
])
def test_an_impossible_value_is_refused_naming_the_file_field_and_value(tmp_path, field, value,
                                                                        shown, why):
    write_runs(tmp_path / "runs")
    path = _edit_seed(tmp_path / "runs", "shakespeare", "rmsnorm", "seed_1", **{field: value})
    with pytest.raises(ValueError) as err:
        collect.collect(tmp_path / "runs")
    assert str(err.value) == (
        f"{path}: runs.seed_1.{field} = {shown} is impossible ({why}); run the evaluate stage "
        "of this dataset and variant again")


def test_an_exact_match_outside_zero_to_one_is_refused(tmp_path):
    write_runs(tmp_path / "runs")
    _edit_seed(tmp_path / "runs", "arithmetic", "gelu", "seed_0", exact_match=1.5)
    with pytest.raises(ValueError, match=r"runs\.seed_0\.exact_match = 1\.5 is impossible "
                                         r"\(a fraction lies in \[0, 1\]\)"):
        collect.collect(tmp_path / "runs")


def test_a_seed_listed_twice_is_refused(tmp_path):
    write_runs(tmp_path / "runs")
    path = tmp_path / "runs" / "arithmetic" / "gelu" / "metrics.json"
    doc = json.loads(path.read_text())
    doc["runs"]["seed_2"]["seed"] = 1
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError) as err:
        collect.collect(tmp_path / "runs")
    assert str(err.value) == (
        f"{path}: seed 1 is listed twice (runs.seed_1 and runs.seed_2); pairing by seed needs "
        "each seed once: run the evaluate stage of this dataset and variant again")


def _build(tmp_path):
    return report.build_report(make_cfg(), tmp_path / "runs", tmp_path / "reports",
                               environment=ENV)


def test_a_seed_without_a_result_the_others_have_is_named_and_nothing_is_written(tmp_path):
    write_runs(tmp_path / "runs")
    path = _edit_seed(tmp_path / "runs", "arithmetic", "rmsnorm", "seed_2", exact_match=...)
    with pytest.raises(ValueError) as err:
        _build(tmp_path)
    assert str(err.value) == (
        f"{path}: seed 2 has no exact_match, which the other runs of arithmetic have and the "
        "report compares; run the evaluate stage of this dataset and variant again")
    assert not (tmp_path / "reports").exists()


def test_a_run_without_history_or_its_probe_is_named_and_nothing_is_written(tmp_path):
    write_runs(tmp_path / "runs")
    (tmp_path / "runs" / "shakespeare" / "gelu" / "history.csv").unlink()
    with pytest.raises(ValueError) as err:
        _build(tmp_path)
    assert str(err.value) == (
        f"{tmp_path / 'runs/shakespeare/gelu/history.csv'}: seed 0 has no rows, which the "
        "other runs of shakespeare have and the report's curves and learning speed need; run "
        "the train stage of this dataset and variant again")
    # the answer probe: every arithmetic run has val_exact_match but one
    for variant in ("baseline", "gelu", "rmsnorm"):
        history = tmp_path / "runs" / "arithmetic" / variant / "history.csv"
        h = pd.read_csv(history)
        h["val_exact_match"] = None if variant == "gelu" else 0.5
        h.to_csv(history, index=False)
    write_runs(tmp_path / "again", variants=("gelu",))
    os.replace(tmp_path / "again/shakespeare/gelu/history.csv",
               tmp_path / "runs/shakespeare/gelu/history.csv")
    with pytest.raises(ValueError, match=r"arithmetic/gelu/history.csv: seed 0 has no "
                                         r"val_exact_match, which the other runs of arithmetic"):
        _build(tmp_path)
    assert not (tmp_path / "reports").exists()
