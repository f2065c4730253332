"""lmablate.report.headline: each dataset's headline loss, and the DVC metrics and verdicts
stated in it."""

from __future__ import annotations

import json

import pandas as pd

from lmablate.report import headline

from synthetic_study import DATASETS, EXPECTED_VERDICTS, VARIANTS


def test_study_metrics_are_one_small_file_per_dataset_and_variant(built):
    cfg, out_dir, out = built
    files = sorted(p.relative_to(out["metrics"]).as_posix()
                   for p in out["metrics"].glob("*/*.json"))
    assert files == sorted(f"{d}/{v}.json" for d in DATASETS for v in VARIANTS)
    summary = pd.read_csv(out["summary"])
    comparisons = pd.read_csv(out["comparisons"])
    for ds in DATASETS:
        for var in VARIANTS:
            doc = json.loads((out["metrics"] / ds / f"{var}.json").read_text())

            def mean(metric):
                return summary[(summary["dataset"] == ds) & (summary["variant"] == var)
                               & (summary["metric"] == metric)]["mean"].item()
            # the verdict is on the headline loss: the answer loss on arithmetic
            head = "answer_loss" if ds == "arithmetic" else "test_loss"
            # the synthetic runs have no answer probe: no tokens to learn
            assert set(doc) == ({"seeds", "test_loss", "answer_loss", "delta_answer_loss",
                                 "verdict", "exact_match"}
                                if ds == "arithmetic" else
                                {"seeds", "test_loss", "delta_test_loss", "verdict"})
            assert doc["seeds"] == 3 and doc["test_loss"] == mean("test_loss")
            assert doc[head] == mean(head)
            if var == "baseline":
                assert (doc[f"delta_{head}"], doc["verdict"]) == (0.0, "baseline")
            else:
                c = comparisons[(comparisons["dataset"] == ds) & (comparisons["variant"] == var)
                                & (comparisons["metric"] == head)].iloc[0]
                assert doc[f"delta_{head}"] == c["mean_diff"]
                assert doc["verdict"] == EXPECTED_VERDICTS[(ds, head, var)]


def test_each_dataset_has_one_metrics_row_naming_its_better_and_worse_variants(built):
    cfg, out_dir, out = built
    assert sorted(p.name for p in out["metrics"].glob("*.json")) == sorted(
        f"{d}.json" for d in DATASETS)
    docs = {ds: json.loads((out["metrics"] / f"{ds}.json").read_text()) for ds in DATASETS}
    # arithmetic in answer loss (its test loss would say "better: gelu; worse: rmsnorm")
    assert docs == {"shakespeare": {"seeds": 3, "verdict": "better: gelu"},
                    "arithmetic": {"seeds": 3, "verdict": "better: rmsnorm"}}
    # the variants' rows use the same keys, so the dataset rows add no `dvc metrics show` column
    variant_keys = set(json.loads((out["metrics"] / "arithmetic" / "gelu.json").read_text()))
    assert set(docs["arithmetic"]) <= variant_keys


def test_dataset_verdicts_say_so_when_no_variant_differs():
    summary = pd.DataFrame({"dataset": ["d", "d"], "variant": ["baseline", "x"],
                            "metric": ["test_loss"] * 2, "n": [4, 4], "mean": [1.0, 1.0]})
    comparisons = pd.DataFrame({"dataset": ["d", "d"], "variant": ["x", "x"],
                                "metric": ["test_loss", "exact_match"],
                                "verdict": ["no significant difference", "better"]})
    assert headline.dataset_verdicts(summary, comparisons) == {
        "d": {"seeds": 4, "verdict": "none better or worse"}}


def test_the_headline_loss_is_the_answer_loss_where_a_dataset_has_one(built):
    _, _, out = built
    summary, ablation = pd.read_csv(out["summary"]), pd.read_csv(out["ablation"])
    for frame in (summary, ablation, pd.read_csv(out["comparisons"])):
        assert headline.headline_loss(frame, "arithmetic") == "answer_loss"
        assert headline.headline_loss(frame, "shakespeare") == "test_loss"
    # runs evaluated before the answer loss existed keep the test loss as the headline
    assert headline.headline_loss(ablation.drop(columns="answer_loss"), "arithmetic") == \
        "test_loss"
    assert headline.headline_loss(summary[summary["metric"] != "answer_loss"],
                                  "arithmetic") == "test_loss"
    assert headline.headline_loss(summary.iloc[:0], "arithmetic") == "test_loss"


def test_the_learning_metric_is_the_median_tokens_to_learn_or_not_reached():
    summary = pd.DataFrame([{"dataset": "arithmetic", "variant": v, "metric": "test_loss",
                             "n": 5, "mean": 1.0} for v in ("baseline", "rope")])
    table = pd.DataFrame([{"dataset": "arithmetic", "variant": v, "threshold": t,
                           "median_tokens": m} for v, m in (("baseline", 1.5e6),
                                                            ("rope", float("inf")))
                          for t in (0.5, 0.9)])
    docs = headline.study_metrics(summary, pd.DataFrame(columns=["dataset", "metric",
                                                                 "variant"]), speed=table)
    assert docs[("arithmetic", "baseline")]["tokens_to_learn"] == 1.5e6
    assert docs[("arithmetic", "rope")]["tokens_to_learn"] == "not reached"
    json.dumps(docs[("arithmetic", "rope")], allow_nan=False)  # as DVC reads it
