"""lmablate.report.stats.reference_points: the reference points computed from the tokenized data
(n-gram losses, the answer-loss floor, constant answers) and the uniform loss the learning-rate
sensitivity starts from."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from lmablate.data.arithmetic import split_problem
from lmablate.data.tokenizer import load_tokenizer
from lmablate.report.stats.reference_models import answer_position_floor
from lmablate.report.stats import arithmetic_tables as arith
from lmablate.stages import report

from synthetic_study import (DATASETS, DESIGN_LRS, VARIANTS, dataset_section, design_loss,
                             lr_section_of, make_cfg, train_part, write_tokens)


def test_the_learning_rate_sensitivity_uses_ln_of_the_vocabulary_size(study_root, tmp_path):
    cfg = make_cfg()
    tokens = write_tokens(tmp_path, cfg)
    out = report.build_report(cfg, study_root / "runs", tmp_path / "reports", tokens_dir=tokens)
    vocab = {ds: load_tokenizer(tokens / ds).vocab_size for ds in DATASETS}
    sens = pd.read_csv(out["lr_sensitivity"]).set_index(["dataset", "variant"])
    for ds in DATASETS:
        l0 = math.log(vocab[ds])
        for v_idx, var in enumerate(VARIANTS):
            losses = [design_loss(ds, v_idx, lr) for lr in DESIGN_LRS]
            best = min(losses[:2] if var == "rmsnorm" else losses)
            if var == "rmsnorm":
                losses[2] = l0  # its largest lr diverged: counted at the loss at initialisation
            want = sum(min(x, l0) - best for x in losses) / 3
            row = sens.loc[(ds, var)]
            assert row["lr_sensitivity"] == pytest.approx(want, abs=1e-12), (ds, var)
            assert row["uniform_loss"] == l0 and pd.isna(row["note"])
    md = out["appendix"].read_text()  # the tuning detail
    section = lr_section_of(md, "arithmetic")
    s = sens.loc[("arithmetic", "rmsnorm"), "lr_sensitivity"]
    assert f"| rmsnorm | {s:.3f} | 3 (1) | 0.007 |" in section
    assert f"L0 = ln V = {math.log(vocab['arithmetic']):.3f} nats" in section
    assert f"(V = {vocab['arithmetic']} tokens)" in section


def test_the_answer_loss_floor_comes_from_the_train_answers_and_stands_in_the_headline(
        study_root, tmp_path):
    cfg = make_cfg()
    tokens = write_tokens(tmp_path, cfg)
    out = report.build_report(cfg, study_root / "runs", tmp_path / "reports", tokens_dir=tokens)
    refs = pd.read_csv(out["references"])
    floor = refs[(refs["dataset"] == "arithmetic") & (refs["metric"] == "answer_loss")]
    assert floor["reference"].tolist() == [arith.ANSWER_FLOOR]
    targets = ["3080000000$", "6300000000$"]  # the baseline's decoded test problems
    train = [split_problem(p)[1] for p in train_part(tokens, newline=True)]
    value = answer_position_floor(train, targets)
    assert floor["value"].item() == pytest.approx(value, abs=1e-12)
    assert value > 0.8  # above every variant's answer loss: all beat it
    em = refs[(refs["dataset"] == "arithmetic") & (refs["reference"] == "most frequent answer")]
    assert em["value"].item() == 0.5  # one of the two problems
    md = out["report"].read_text()
    head = dataset_section(md, "arithmetic").split("### Headline\n", 1)[1].split("\n### ", 1)[0]
    assert f"| _floor: answer ignoring the question_ | – | {value:.3f} | – | – |" in head
    assert "| _floor: most frequent answer_ | – | – | 0.500 | – |" in head
    assert "| _floor: best constant answer_ | – | – | – | 0.864 |" in head  # 19 of 22 chars
    # gelu's exact match (0.507) is above the most frequent answer's 0.5; nobody's char
    # accuracy reaches the best constant answer's 19/22
    assert (f"Against the floors (answer loss below {value:.3f}, exact match above 0.500, "
            "char accuracy above 0.864), on the mean over seeds: beat some: baseline (answer "
            "loss), gelu (answer loss, exact match), rmsnorm (answer loss).") in head
    # said once, in the headline: the limits section does not repeat the floors
    section = md.split("## What this study can and cannot say")[1].split("## Methodology")[0]
    assert "against answers that ignore the question" not in section
