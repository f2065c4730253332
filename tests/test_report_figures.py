"""lmablate.report.figures.report_figures: which figures the report draws, with which captions, and
the sentence that stands for a figure not drawn."""

from __future__ import annotations

import json

from lmablate.stages import report

from synthetic_study import make_cfg, write_runs


# no params_vs_loss_*.png: the variants' parameter counts (PARAMS) are 0.2% apart
EXPECTED_FIGURES = [
    "val_loss_curves_shakespeare.png", "test_loss_shakespeare.png", "forest_shakespeare.png",
    "tuning_shakespeare.png",
    "val_loss_curves_arithmetic.png", "answer_loss_arithmetic.png", "forest_arithmetic.png",
    "exact_match_by_op.png", "char_accuracy_by_op.png", "tuning_arithmetic.png",
    "length_generalisation_arithmetic.png",
]


def test_every_figure_is_a_png(built):
    _, out_dir, out = built
    names = [p.name for p in out["figures"]]
    assert sorted(names) == sorted(EXPECTED_FIGURES)
    assert not any(n.startswith("grad_flow") for n in names)  # a one-batch diagnostic: a CSV
    on_disk = sorted(p.name for p in (out_dir / "figures").iterdir())
    assert on_disk == sorted(EXPECTED_FIGURES)  # and no temp files left behind
    for p in out["figures"]:
        data = p.read_bytes()
        assert len(data) > 5000 and data[:8] == b"\x89PNG\r\n\x1a\n", p


def test_a_figure_not_drawn_leaves_its_reason_in_the_figures_section(built):
    _, _, out = built
    md = out["report"].read_text()
    for ds in ("shakespeare", "arithmetic"):
        section = md.split(f"## {ds}\n")[1].split("### Figures")[1].split("\n## ")[0]
        assert (f"{ds}: non-embedding parameters vs test loss not drawn: the parameter counts "
                "span 99,800 to 100,000 (0.2% apart)") in section
    assert "params_vs_loss" not in md


def test_forest_plots_are_in_each_datasets_headline_loss(built):
    _, _, out = built
    md = out["report"].read_text()
    assert ("**shakespeare: test loss difference to baseline, the loss of this dataset's "
            "verdicts (paired by seed: raw 95% t-interval and Holm-adjusted interval)**") in md
    assert ("**arithmetic: answer loss difference to baseline, the loss of this dataset's "
            "verdicts (paired by seed: raw 95% t-interval and Holm-adjusted interval)**") in md


def test_no_exact_match_figure_when_no_variant_solved_any_problem(tmp_path):
    write_runs(tmp_path / "runs")
    for path in (tmp_path / "runs" / "arithmetic").glob("*/metrics.json"):
        doc = json.loads(path.read_text())
        for run in doc["runs"].values():
            for values in run["per_op"].values():
                values["exact_match"] = 0.0
        path.write_text(json.dumps(doc))
    out = report.build_report(make_cfg(), tmp_path / "runs", tmp_path / "reports")
    names = {p.name for p in out["figures"]}
    assert "exact_match_by_op.png" not in names and "char_accuracy_by_op.png" in names
    assert not (tmp_path / "reports" / "figures" / "exact_match_by_op.png").exists()
    md = out["report"].read_text()
    figures_section = md.split("## arithmetic\n")[1].split("### Figures")[1]
    assert ("arithmetic: exact match by operation not drawn: no variant solved any problem "
            "(exact match 0 on every operation, variant and seed).") in figures_section


def test_every_tick_label_of_every_report_figure_is_at_least_9_points(tmp_path, drawn):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from synthetic_study import ENV

    figs = drawn
    write_runs(tmp_path / "runs", probe=True)
    report.build_report(make_cfg(), tmp_path / "runs", tmp_path / "reports", environment=ENV)
    assert len(figs) >= len(EXPECTED_FIGURES)
    small = []
    for fig in figs:
        FigureCanvasAgg(fig).draw()
        for ax in fig.axes:
            if not ax.get_visible():
                continue
            for label in [*ax.get_xticklabels(), *ax.get_yticklabels()]:
                if label.get_visible() and label.get_text() and label.get_fontsize() < 9:
                    small.append((ax.get_title()[:40], label.get_text(), label.get_fontsize()))
    assert not small


def test_the_tuning_figures_of_arithmetic_label_their_axes_in_its_objective(tmp_path, drawn):
    from lmablate.report.figures import plotting, tuning_figure
    from lmablate.report.collect import collect
    from lmablate.report.families import variant_palette

    figs = drawn
    write_runs(tmp_path / "runs")
    runs = collect(tmp_path / "runs")
    tuned = runs.tuned.assign(objective="val_answer_loss_mean")
    palette = variant_palette(make_cfg())
    tuning_figure.plot_lr_response(runs.trials, tuned, "arithmetic", tmp_path / "t.png",
                                   palette=palette)
    labels = [ax.get_ylabel() for ax in figs[0].axes if ax.get_ylabel()]
    assert len(labels) == 3
    assert all(lab.startswith("validation answer loss, mean over the run")
               and lab.endswith("(nats/answer char)") for lab in labels), labels
    # the bracket figure's axis comes from the same function
    assert plotting.objective_label("val_answer_loss_mean", "at the full budget") == (
        "validation answer loss, mean over the run at the full budget\n(nats/answer char)")
    assert plotting.objective_label("val_loss", "at the full budget") == (
        "validation loss at the full budget\n(nats/char)")
