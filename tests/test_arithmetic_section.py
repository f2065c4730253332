"""lmablate.report.text.arithmetic_section: the arithmetic section: the headline against its floors,
the answer loss by operation and answer length, and length generalisation by operand digits."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from statsmodels.stats.multitest import multipletests

from lmablate.core.validation import DataError
from lmablate.data.arithmetic import split_problem
from lmablate.report import collect
from lmablate.report.stats import reference_points, statistics
from lmablate.report.stats import arithmetic_tables as tables
from lmablate.report.text import arithmetic_section as arith

from synthetic_study import (EM_BY_DIGITS, NA_4, VARIANTS, dataset_section, make_cfg,
                             random_ablation, train_part, true_length_em, write_tokens)


def test_the_length_table_has_na_rows_where_a_learned_table_cannot_reach(built):
    _, _, out = built
    table = pd.read_csv(out["length_generalisation"], keep_default_na=False,
                        na_values=[""])
    assert list(table.columns) == tables.LENGTH_COLUMNS
    assert table[["variant", "digits"]].values.tolist() == [
        [v, d] for v in VARIANTS for d in EM_BY_DIGITS]
    assert dict(zip(table["digits"], table["split"])) == {1: "test", 2: "test", 3: "length",
                                                          4: "length"}
    na = table[table["note"].notna()]
    assert na[["variant", "digits", "n_seeds", "note"]].values.tolist() == [
        ["rmsnorm", 4, 0, NA_4]]
    assert na[["mean", "ci95_low", "ci95_high"]].isna().all().all()
    gelu3 = table[(table["variant"] == "gelu") & (table["digits"] == 3)].iloc[0]
    x = np.array([true_length_em("gelu", i, 3) for i in range(3)])
    assert gelu3["n_seeds"] == 3 and gelu3["mean"] == pytest.approx(x.mean())
    assert (gelu3["ci95_low"], gelu3["ci95_high"]) == pytest.approx(
        stats.t.interval(0.95, 2, loc=x.mean(), scale=stats.sem(x)))


def test_length_comparisons_pair_each_variant_with_the_baseline_at_each_length(built):
    _, _, out = built
    c = pd.read_csv(out["length_generalisation_comparisons"])
    assert list(c.columns) == tables.LENGTH_COMPARISON_COLUMNS
    got = {(r.variant, r.digits): r.verdict for r in c.itertuples()}
    nsd = statistics.VERDICT_NSD
    # gelu better only past the training length; rmsnorm not compared where it is n/a
    assert got == {("gelu", 1): nsd, ("gelu", 2): nsd, ("gelu", 3): "better",
                   ("gelu", 4): "better", ("rmsnorm", 1): nsd, ("rmsnorm", 2): nsd,
                   ("rmsnorm", 3): nsd}
    assert set(c["metric"]) == {f"exact_match_d{d}" for d in EM_BY_DIGITS}
    row = c[(c["variant"] == "gelu") & (c["digits"] == 4)].iloc[0]
    assert row["split"] == "length" and row["n_pairs"] == 3
    diff = [true_length_em("gelu", i, 4) - true_length_em("baseline", i, 4) for i in range(3)]
    assert row["mean_diff"] == pytest.approx(np.mean(diff))
    # one Holm family per length: at 3 digits gelu and rmsnorm, at 4 gelu alone (p = p_Holm)
    at3 = c[c["digits"] == 3]
    _, want, _, _ = multipletests(at3["p_value"], method="holm")
    assert at3["p_holm"].tolist() == pytest.approx(list(want))
    assert row["p_holm"] == row["p_value"]


def test_a_length_the_baseline_cannot_reach_has_no_comparison():
    rows = [{"dataset": "a", "variant": v, "seed": s, "digits": d,
             "split": None if (v, d) == ("baseline", 3) else ("test" if d < 3 else "length"),
             "exact_match": None if (v, d) == ("baseline", 3) else 0.5 + 0.01 * s * (v == "x"),
             "note": "n/a (learned table of 8 positions)" if (v, d) == ("baseline", 3) else ""}
            for v in ("baseline", "x") for s in range(3) for d in (1, 2, 3)]
    frame = collect.with_order(pd.DataFrame(rows), ["a"], ["baseline", "x"])
    c = tables.length_comparisons(frame)
    assert c["digits"].tolist() == [1, 2]
    table = tables.length_table(frame)
    assert table.loc[table["note"] != "", ["variant", "digits", "split"]].values.tolist() == [
        ["baseline", 3, "length"]]  # the split of the length, from the variants that ran it
    assert tables.unreachable(frame, "a") == [
        "baseline at 3 digits, n/a (learned table of 8 positions)"]
    assert tables.training_digits(None, frame, "a") == 2


def test_the_arithmetic_section_opens_with_the_headline_then_length_generalisation(built):
    _, out_dir, out = built
    md = out["report"].read_text()
    section = dataset_section(md, "arithmetic")
    assert section.startswith("\n### Headline\n")
    assert (section.index("### Headline") < section.index("### Length generalisation")
            < section.index("### Summary"))
    assert "### Headline" not in dataset_section(md, "shakespeare")
    assert "### Length generalisation" not in dataset_section(md, "shakespeare")
    head = section.split("### Headline\n", 1)[1].split("\n### ", 1)[0]
    table = [line for line in head.splitlines() if line.startswith("|")]
    assert table[0] == ("| variant | seeds | answer loss (nats/answer char) | exact match "
                        "(fraction) | char accuracy (fraction) |")
    s = pd.read_csv(out["summary"]).set_index(["dataset", "variant", "metric"])
    cells = []
    for m in ("answer_loss", "exact_match", "char_accuracy"):
        r = s.loc[("arithmetic", "rmsnorm", m)]
        cells.append(f"{r['mean']:.3f} [{r['ci95_low']:.3f}, {r['ci95_high']:.3f}]"
                     if m != "answer_loss" else  # a fraction's interval may be lopsided
                     f"{r['mean']:.3f} ± {(r['ci95_high'] - r['ci95_low']) / 2:.3f}")
    assert table[4] == f"| rmsnorm | 3 | {' | '.join(cells)} |"
    assert "No floors: they need the tokenized data" in head  # no tokens given to `built`
    assert ("In answer loss against the baseline (paired by seed, Holm-corrected): better: "
            "rmsnorm.") in head
    length = section.split("### Length generalisation\n", 1)[1].split("\n### ", 1)[0]
    assert "Trained on operands of up to 2 digits; tested on longer ones" in length
    counts = pd.read_csv(out["length_generalisation"]).groupby("digits")["n_problems"].min()
    for n in range(1, 5):  # each length's count of problems in its heading, † when few
        few = " †" if counts[n] < tables.MIN_BUCKET_PROBLEMS else ""
        assert f"{n} digit{'s' if n > 1 else ''} ({'test' if n <= 2 else 'length'}, " \
               f"{int(counts[n])} problems{few})" in length
    rmsnorm = next(line for line in length.splitlines() if line.startswith("| rmsnorm |"))
    assert rmsnorm.split(" | ")[4] == NA_4 and rmsnorm.endswith("| – |")
    gelu = next(line for line in length.splitlines() if line.startswith("| gelu |"))
    assert gelu.count("**▲ better**") == 2
    assert "](figures/length_generalisation_arithmetic.png)" in length
    assert md.count("](figures/length_generalisation_arithmetic.png)") == 1
    assert "left out: rmsnorm at 4 digits, n/a (learned table of 48 positions)" in length


@pytest.mark.parametrize("strip_newlines", [True, False])
def test_train_answers_cut_the_train_split_into_its_problems(tmp_path, strip_newlines):
    tokens = write_tokens(tmp_path, make_cfg(), strip_newlines)
    want = train_part(tokens, newline=not strip_newlines)
    assert len(want) > 10
    assert tables.train_answers(tokens / "arithmetic") == [split_problem(p)[1] for p in want]
    meta_path = tokens / "arithmetic" / "meta.json"
    meta = json.loads(meta_path.read_text())
    if strip_newlines:  # a line_length that does not divide the split is an error, not a floor
        meta_path.write_text(json.dumps({**meta, "line_length": 35}))
        with pytest.raises(DataError, match="not a whole number of problems"):
            tables.train_answers(tokens / "arithmetic")
    del meta["line_length"]  # tokens written before it was recorded: no floor
    meta_path.write_text(json.dumps(meta))
    assert tables.train_answers(tokens / "arithmetic") == []


def test_runs_without_an_answer_loss_keep_the_test_loss_as_the_headline():
    rng = np.random.default_rng(5)
    ablation = random_ablation(rng, 3, datasets=("arith",)).assign(exact_match=0.3)
    summary = statistics.summarise(ablation)
    comparisons = statistics.compare(ablation)
    lines = arith.headline_lines(summary, comparisons, pd.DataFrame(
        columns=reference_points.REFERENCE_COLUMNS), "arith", ["baseline", "v1", "v2"])
    # the heading "### Headline" is the template's
    assert lines[2].startswith("| variant | seeds | test loss (nats/char) | exact match")
    assert "on whole problems: these runs have no answer loss" in lines[0]
    assert lines[-2].startswith("In test loss against the baseline")
    assert statistics.METRICS["answer_loss"] == ("answer loss", "nats/answer char", False)


def test_the_answer_loss_is_broken_down_by_operation_and_answer_length_as_seed_means():
    per_op = pd.DataFrame([
        {"dataset": "arithmetic", "variant": v, "seed": s, "op": op, "answer_loss": x}
        for v, s, op, x in [("baseline", 0, "add", 0.1), ("baseline", 1, "add", 0.3),
                            ("baseline", 0, "sub", 0.5), ("baseline", 1, "sub", 0.7),
                            ("gelu", 0, "add", 0.2), ("gelu", 1, "add", 0.2)]])
    by_answer = pd.DataFrame([
        {"dataset": "arithmetic", "variant": v, "seed": s, "digits": d, "answer_loss": x}
        for v, s, d, x in [("baseline", 0, 2, 0.4), ("baseline", 1, 2, 0.6),
                           ("gelu", 0, 3, 0.9)]])
    lines = arith.breakdown_lines(per_op, by_answer, "arithmetic", ["baseline", "gelu"])
    table = [line for line in "\n".join(lines).splitlines() if line.startswith("|")]
    assert table[0] == "| variant | add | sub | 2-digit answers | 3-digit answers |"
    assert table[2] == "| baseline | 0.200 | 0.600 | 0.500 | – |"
    assert table[3] == "| gelu | 0.200 | – | – | 0.900 |"
    assert arith.breakdown_lines(per_op, by_answer, "shakespeare", ["baseline"]) == []
    # with each bucket's problems per seed: its fewest in the heading, † when few
    counted = arith.breakdown_lines(per_op.assign(n=[480, 470, 520, 530, 480, 470]),
                                    by_answer.assign(n=[6, 6, 300]), "arithmetic",
                                    ["baseline", "gelu"])
    table = [line for line in "\n".join(counted).splitlines() if line.startswith("|")]
    assert table[0] == ("| variant | add (470) | sub (520) | 2-digit answers (6 †) | "
                        "3-digit answers (300) |")
    assert f"† fewer than {tables.MIN_BUCKET_PROBLEMS}, a rough indication only" in counted[0]


def test_a_length_with_few_problems_shows_its_count_and_is_marked():
    """The 1-digit bucket of 2-digit problems holds a handful of them: its count is in the
    heading and a dagger sends the reader to the sentence that says how little it carries."""
    rows = [{"dataset": "arithmetic", "variant": v, "digits": d, "split": "test",
             "n_seeds": 3, "n_problems": n, "mean": 0.5, "ci95_low": 0.0, "ci95_high": 1.0,
             "note": ""} for v in ("baseline", "rope") for d, n in ((1, 6), (2, 994))]
    lines = arith.length_lines(pd.DataFrame(rows, columns=tables.LENGTH_COLUMNS),
                               pd.DataFrame(), "arithmetic", 2, ["baseline", "rope"])
    text = "\n".join(lines)
    assert "| variant | 1 digit (test, 6 problems †) | 2 digits (test, 994 problems) |" in text
    assert "| rope | 0.500 [0.000, 1.000] | 0.500 [0.000, 1.000] |" in text
    note = next(line for line in lines if line.startswith("† "))
    assert note.startswith(f"† Fewer than {tables.MIN_BUCKET_PROBLEMS} test problems per seed "
                           "at 1 digit:")
    rows = [{**r, "n_problems": 500} for r in rows]
    lines = arith.length_lines(pd.DataFrame(rows, columns=tables.LENGTH_COLUMNS),
                               pd.DataFrame(), "arithmetic", 2, ["baseline", "rope"])
    assert not any("†" in line for line in lines)


def test_the_arithmetic_summary_leaves_the_headline_s_metrics_to_the_headline(built):
    _, _, out = built
    md = out["report"].read_text()
    section = dataset_section(md, "arithmetic")
    summary = section.split("### Summary", 1)[1].split("\n### ", 1)[0]
    table = [line for line in summary.splitlines() if line.startswith("|")]
    for label in ("answer loss", "exact match", "char accuracy"):
        assert label not in table[0]  # once, in the headline's table
        assert label in section.split("### Headline", 1)[1].split("\n### ", 1)[0]
    assert "test loss (nats/char)" in table[0]


def test_a_reference_row_stays_only_where_it_has_a_value_in_the_table_s_columns():
    from lmablate.report.text.dataset_tables import summary_rows
    summary = pd.DataFrame([
        {"dataset": "a", "variant": "baseline", "metric": m, "n": 3, "mean": x,
         "ci95_low": x - 0.1, "ci95_high": x + 0.1}
        for m, x in (("test_loss", 0.7), ("exact_match", 0.5))])
    references = pd.DataFrame([
        {"dataset": "a", "reference": "trigram", "metric": "test_loss", "value": 1.37},
        {"dataset": "a", "reference": "most frequent answer", "metric": "exact_match",
         "value": 0.011}])
    both = summary_rows(summary, "a", ["baseline"], references)
    assert [r["variant"] for r in both] == [
        "baseline", "_reference: trigram_", "_reference: most frequent answer_"]
    rows = summary_rows(summary, "a", ["baseline"], references, shown=["exact_match"])
    assert [r["variant"] for r in rows] == ["baseline", "_reference: trigram_"]
    assert not any("exact match" in head for head in rows[0])
