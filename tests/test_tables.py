"""lmablate.report.tables: every table of the report in the configured order."""

from __future__ import annotations

import csv

import pytest

from lmablate.report.stats import statistics
from lmablate.stages import report

from synthetic_study import make_cfg, write_runs


def test_every_table_follows_the_configured_variant_order(tmp_path):
    write_runs(tmp_path / "runs")
    configured = ("rmsnorm", "baseline", "gelu")
    cfg = make_cfg(variants=configured)
    out = report.build_report(cfg, tmp_path / "runs", tmp_path / "reports")
    want = ["baseline", "rmsnorm", "gelu"]  # baseline first, then as configured
    datasets = list(cfg.datasets)
    assert datasets == ["shakespeare", "arithmetic"]  # not alphabetical: the order is tested
    tables = {name: list(csv.DictReader(out[name].open(encoding="utf-8")))
              for name in ("ablation", "summary", "comparisons")}
    for name, rows in tables.items():
        # plain strings in the files, blocks of datasets in config order
        assert all(type(r["variant"]) is str and type(r["dataset"]) is str for r in rows)
        assert list(dict.fromkeys(r["dataset"] for r in rows)) == datasets, name
    for ds in datasets:
        for name, key in (("ablation", "seed"), ("summary", "metric"),
                          ("comparisons", "metric")):
            rows = [r for r in tables[name] if r["dataset"] == ds]
            groups = list(dict.fromkeys(r[key] for r in rows))
            for g in groups:
                seq = [r["variant"] for r in rows if r[key] == g]
                expected = [v for v in want if v != "baseline"] if name == "comparisons" else want
                assert seq == expected, (name, ds, g)
            if name != "comparisons":  # variants outermost within a dataset
                blocks = list(dict.fromkeys(r["variant"] for r in rows))
                assert blocks == want, (name, ds)
        summary_metrics = [r["metric"] for r in tables["summary"]
                           if r["dataset"] == ds and r["variant"] == "baseline"]
        assert summary_metrics == [m for m in statistics.METRICS if m in summary_metrics]
    comp_metrics = list(dict.fromkeys(r["metric"] for r in tables["comparisons"]
                                      if r["dataset"] == "arithmetic"))
    assert comp_metrics == list(statistics.COMPARED_METRICS)
    md = out["report"].read_text(encoding="utf-8")
    for ds in datasets:
        section = md.split(f"## {ds}\n", 1)[1].split("\n## ", 1)[0]
        rows = [line.split(" | ")[0].lstrip("| ") for line in section.splitlines()
                if line.startswith(tuple(f"| {v} |" for v in want))]
        # arithmetic: headline and length tables first; then summary and tuned tables
        tables = 4 if ds == "arithmetic" else 2
        assert rows[:3 * tables] == want * tables, ds


def test_the_gradient_table_is_the_mean_share_over_seeds_per_group():
    import pandas as pd

    from lmablate.report import tables
    grad = pd.DataFrame(
        [{"dataset": "text", "variant": v, "seed": s, "group": g, "frac_near_zero": x + s / 100}
         for s in range(3) for v, ffn in (("baseline", 0.5), ("swiglu", 0.0))
         for g, x in (("wte", 0.2), ("blocks.1.ffn", ffn))])
    table = tables.gradient_table(grad)
    assert list(table.columns) == tables.GRAD_COLUMNS and (table["seeds"] == 3).all()
    got = table.set_index(["variant", "group"])["frac_near_zero"]
    assert got[("baseline", "blocks.1.ffn")] == pytest.approx(0.51)
    assert got[("swiglu", "wte")] == pytest.approx(0.21)
    assert tables.gradient_table(pd.DataFrame()).empty
