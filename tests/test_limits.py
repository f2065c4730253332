"""lmablate.report.text.limits: "What this study can and cannot say", written from the report's
tables (the synthetic study of synthetic_study.py)."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd

from lmablate.report import collect
from lmablate.report.headline import headline_loss
from lmablate.report.stats import statistics
from lmablate.report.stats.detectable import DETECTABLE_COLUMNS
from lmablate.report.text import limits
from lmablate.stages import report

from synthetic_study import DATASETS, EXPECTED_VERDICTS, make_cfg, write_runs


def _verdict_rows(md: str) -> dict[tuple[str, str], list[str]]:
    """(dataset, variant) -> the cells of its row in the Findings' verdict table."""
    findings = md.split("## Findings\n", 1)[1].split("### How to read", 1)[0]
    rows, dataset = {}, None
    for line in findings.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")] if line.startswith("| ") else []
        if len(cells) == 8 and cells[1] != "variant":
            dataset = cells[0].split(":")[0] or dataset
            rows[(dataset, cells[1])] = cells
    return rows


def test_limits_section_is_written_from_the_report_tables(built):
    cfg, out_dir, out = built
    md = out["report"].read_text()
    assert md.index("## What this study can and cannot say") < md.index("## Methodology")
    section = md.split("## What this study can and cannot say")[1].split("## Methodology")[0]
    parts = dict(zip(*[iter(re.split(r"\*\*(shakespeare|arithmetic)\*\*", section)[1:])] * 2))
    assert set(parts) == {"shakespeare", "arithmetic"}
    comparisons = pd.read_csv(out["comparisons"])
    detectable = pd.read_csv(out["detectable_effects"])
    rows = _verdict_rows(md)
    for r in detectable.itertuples():  # each verdict's minimum detectable effect, in its row
        if r.metric == headline_loss(comparisons, r.dataset):
            assert rows[(r.dataset, r.variant)][5] == f"{r.mde:.3f}"
    assert "[MDE]" not in section  # defined once, in the verdict table's heading
    # the better/worse verdicts, and nothing else, are what the study can say; those in a
    # metric no tuning uncertainty checks are labelled so
    checked = {(r.dataset, r.metric, r.variant): pd.notna(r.tuning_uncertainty)
               for r in comparisons.itertuples()}
    for ds in DATASETS:
        called = [f"{v} {verdict} in {statistics.METRICS[m][0]}"
                  + ("" if checked[(d, m, v)] else " (not checked against tuning)")
                  for (d, m, v), verdict in EXPECTED_VERDICTS.items()
                  if d == ds and verdict in ("better", "worse")]
        listing = called[0] if len(called) == 1 else ", ".join(called[:-1]) + " and " + called[-1]
        assert f"over training seeds (paired by seed, Holm at family-wise α = 0.05): {listing} " \
               "than the baseline." in parts[ds]
    assert "Every variant trained at the baseline's width (d_model 64)." in parts["shakespeare"]
    assert "tokens (" in parts["shakespeare"] and "at d_model 64" in parts["shakespeare"]


def test_limits_section_flags_edges_identical_seeds_and_other_widths(tmp_path):
    write_runs(tmp_path / "runs")
    run_dir = tmp_path / "runs" / "shakespeare" / "rmsnorm"
    doc = json.loads((run_dir / "metrics.json").read_text())
    base = json.loads((tmp_path / "runs/shakespeare/baseline/metrics.json").read_text())
    for key, run in doc["runs"].items():  # 0.05 worse on every seed, at another width
        run["test_loss"] = base["runs"][key]["test_loss"] + 0.05
        run["d_model"] = 32
    (run_dir / "metrics.json").write_text(json.dumps(doc))
    (run_dir / "best.json").write_text(json.dumps(
        {"lr": 0.03, "d_model": 32, "val_loss": 2.0, "full_budget": True,
         "on_edge": ["lr at upper bound"], "extended": [], "lr_range": [1e-3, 1e-1],
         "d_model_choices": [32, 64], "n_trials": 7, "n_complete": 6, "n_diverged": 1}))
    out = report.build_report(make_cfg(), tmp_path / "runs", tmp_path / "reports")
    md = out["report"].read_text()
    section = md.split("## What this study can and cannot say")[1].split("## Methodology")[0]
    assert "lr at upper bound for rmsnorm" in section
    assert "rmsnorm in test loss (Δ = 0.05)" in section and "identical on every seed" in section
    assert "Trained at another width than the baseline (d_model 64): rmsnorm at 32" in section
    tuned = pd.read_csv(out["tuned"])
    assert list(tuned.columns) == collect.TUNED_COLUMNS
    row = tuned[(tuned["dataset"] == "shakespeare") & (tuned["variant"] == "rmsnorm")]
    assert row[collect.TUNED_COLUMNS[:15]].fillna({"extended": ""}).to_dict("records") == [
        {"dataset": "shakespeare", "variant": "rmsnorm", "lr": 0.03, "d_model": 32,
         "val_loss": 2.0, "objective": "val_loss",  # a best.json from before it was recorded
         "full_budget": True, "on_edge": "lr at upper bound",
         "extended": "", "lr_low": 0.001, "lr_high": 0.1, "d_model_choices": "32 64",
         "n_trials": 7, "n_complete": 6, "n_diverged": 1}]
    assert row[collect.TUNED_COLUMNS[15:]].isna().all(axis=None)  # no bracket in that study


def test_one_mde_per_comparison_is_the_same_number_wherever_the_report_states_it(built):
    """comparisons.csv's mde is detectable_effects.csv's, the comparison table's MDE column
    and, in the headline loss, the Findings' verdict table's."""
    cfg, out_dir, out = built
    md = out["report"].read_text()
    comparisons = pd.read_csv(out["comparisons"])
    detectable = pd.read_csv(out["detectable_effects"])
    tested = comparisons[comparisons["p_value"].notna()]
    merged = tested.merge(detectable, on=["dataset", "metric", "variant"],
                          suffixes=("", "_csv"))
    assert len(merged) == len(tested) == len(detectable)
    assert np.array_equal(merged["mde"], merged["mde_csv"])
    assert list(detectable.columns) == DETECTABLE_COLUMNS
    section = md.split("## What this study can and cannot say")[1].split("## Methodology")[0]
    verdicts = _verdict_rows(md)
    for r in tested.itertuples():
        mde = f"{r.mde:.3f}"
        table = md.split(f"## {r.dataset}\n", 1)[1].split("### Comparison with the baseline",
                                                          1)[1].split("\n### ", 1)[0]
        label = statistics.METRICS[r.metric][0]
        row = next(x for x in table.splitlines()
                   if x.startswith(f"| {label} (") and f"| {r.variant} |" in x)
        assert row.split(" | ")[-2] == mde  # the MDE column, before the verdict
        if r.metric == headline_loss(comparisons, r.dataset):
            assert verdicts[(r.dataset, r.variant)][5] == mde
    assert "for one planned comparison" not in section  # no second MDE per comparison

def test_the_problem_level_caveat_is_stated_once_in_its_own_section(built):
    cfg, out_dir, out = built
    md = out["report"].read_text()
    section = md.split("## What this study can and cannot say")[1].split("## Methodology")[0]
    assert "Problem by problem" not in section
    assert md.count("these p-values overstate the evidence") == 1


def test_the_methods_name_each_kind_of_dataset_s_tuning_objective(built):
    """Arithmetic trials are ranked by the probe's answer loss (its mean over the trial, or its
    last value), text ones by the validation loss: the methods say both, not "the validation
    loss" for all."""
    import dataclasses

    from lmablate.report.text.methods import methods_section

    cfg, _, out = built
    methods = out["report"].read_text().split("## Methodology")[1]
    assert ("objective the validation loss at the end of the trial (text) and the mean over the "
            "trial's evaluations of the answer loss of the validation problems (arithmetic: nats "
            "per answer character; the area under its curve)") in methods
    final = dataclasses.replace(cfg, tune=dataclasses.replace(cfg.tune,
                                                              arithmetic_objective="final"))
    lines = methods_section(final, pd.DataFrame({"train_seconds": []}), None, [], [])
    assert ("objective the validation loss at the end of the trial (text) and the answer loss "
            "of the validation problems at the end of the trial (arithmetic: nats per answer "
            "character, the metric of its verdicts);") in "\n".join(lines)
