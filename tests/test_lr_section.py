"""lmablate.report.text.lr_section: each dataset's "How each variant responds to the learning
rate" section, from its tuning trials."""

from __future__ import annotations

import pandas as pd

from lmablate.report.stats import sensitivity

from synthetic_study import DATASETS, VARIANTS, lr_section_of


def test_each_dataset_has_a_learning_rate_section_with_its_tuning_and_figure(built):
    cfg, out_dir, out = built
    md = out["appendix"].read_text()  # report.md links to it (the tuning detail)
    report = out["report"].read_text()
    for ds in DATASETS:
        assert f"In the [appendix](appendix.md#{ds}): how each variant responds" in report
        section = lr_section_of(md, ds)
        # S is defined once, in "How the learning rate was chosen", which this section links
        assert "Wortsman et al. 2023" not in section
        assert section.startswith("\nS ([defined once](#how-the-learning-rate-was-chosen)) "
                                  "over 3 learning rates in [0.001, 0.1] at d_model 32 (24 "
                                  "training tokens per parameter), 0.2 of the budget, tuning "
                                  "seed 1000")
        assert "NOT tried at the same points" not in section  # a shared design
        # no tokens given to this report: no loss at initialisation, so no S, and it says so
        assert "L0 unknown without the tokenized data, so S is not computed" in section
        assert ("| variant | LR sensitivity S (nats) | design points (diverged) | best design lr "
                "| tuned lr | tuned d_model (tokens/param) | trained at full budget | range "
                "extended | on edge |") in section
        assert "| baseline | – | 3 (0) | 0.007 | 0.002 | 64 (6.5) | yes | – | – |" in section
        assert "| gelu | – | 3 (0) | 0.007 | 0.003 | 64 (6.5) | yes | lr up to 1 | – |" in section
        assert "| rmsnorm | – | 3 (1) | 0.007 | 0.004 | 64 (6.5) | yes | – | – |" in section
        # the figure is in the section, and only there
        assert f"](figures/tuning_{ds}.png)" in section
        assert md.count(f"](figures/tuning_{ds}.png)") == 1
        assert f"](figures/tuning_{ds}.png)" not in report
    sens = pd.read_csv(out["lr_sensitivity"])
    assert list(sens.columns) == sensitivity.SENSITIVITY_COLUMNS
    assert [tuple(r) for r in sens[["dataset", "variant"]].values] == [
        (d, v) for d in DATASETS for v in VARIANTS]
    assert sens["lr_sensitivity"].isna().all()
    assert set(sens["note"]) == {sensitivity.NO_UNIFORM}
