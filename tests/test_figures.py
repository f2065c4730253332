"""Tests of lmablate.report.families (variant families and their colours) and of what the
figures of lmablate.report.figures.losses show: reference lines, the forest plot's intervals and
labels, the learning-rate figure's panels, the palette argument.

The figures are inspected, not just written: a fixture records the matplotlib Figure each
``plot_*`` call draws (it wraps ``plotting.figure``), and text and artist positions are
measured on an Agg renderer. Frames are small and synthetic, written under ``tmp_path``.
"""

from __future__ import annotations

import colorsys
import itertools
import math

import numpy as np
import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgb

from lmablate.report.families import FAMILIES, family_palette, variant_family
from lmablate.report.figures import arithmetic_figures as arith_figs
from lmablate.report.figures import losses as figures
from lmablate.report.figures import model_figures, plotting, tuning_figure
from lmablate.report.stats import statistics
from lmablate.report.text import limits

# the variants of params.yaml (overrides of the baseline model config), in study order
VARIANTS = {
    "baseline": {},
    "gelu": {"ffn": "gelu"},
    "swiglu": {"ffn": "swiglu"},
    "geglu": {"ffn": "geglu"},
    "rmsnorm": {"norm": "rmsnorm"},
    "post_norm": {"norm_placement": "post"},
    "sinusoidal": {"position": "sinusoidal"},
    "rope": {"position": "rope"},
    "alibi": {"position": "alibi"},
    "nope": {"position": "none"},
    "gqa": {"n_kv_heads": 2},
    "mqa": {"n_kv_heads": 1},
    "llama": {"norm": "rmsnorm", "position": "rope", "ffn": "swiglu"},
}
EXPECTED_FAMILIES = {
    "baseline": "baseline", "gelu": "FFN", "swiglu": "FFN", "geglu": "FFN",
    "rmsnorm": "norm", "post_norm": "norm",
    "sinusoidal": "position", "rope": "position", "alibi": "position", "nope": "position",
    "gqa": "attention", "mqa": "attention", "llama": "combined",
}
ORDER = list(VARIANTS)
REFERENCES = {"unigram (KN)": 3.30, "bigram (KN)": 2.48, "trigram (KN)": 2.20}
DS = "shakespeare"


def renderer_of(fig):
    """An Agg renderer of ``fig`` after a full draw (constrained layout included)."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def drawn_extents(ax, renderer, pad_px=8.0):
    """Display boxes of everything drawn in ``ax``'s data area: collections (interval lines,
    markers; padded by ``pad_px`` for the marker size), patches (bars) and lines (caps)."""
    boxes = []
    for coll in ax.collections:
        lim = coll.get_datalim(ax.transData)  # in data units; empty collections give inf
        if np.isfinite(lim.get_points()).all():
            boxes.append(lim.transformed(ax.transData).padded(pad_px))
    boxes += [a.get_window_extent(renderer) for a in [*ax.patches, *ax.lines]]
    return boxes


def legend_texts(fig):
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes)]
    return [t.get_text() for leg in legends if leg is not None for t in leg.get_texts()]


def horizontal_lines(ax):
    """The y values of ``ax``'s horizontal lines spanning the axes (axhline)."""
    ys = []
    for line in ax.lines:
        x, y = np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float)
        if len(y) == 2 and y[0] == y[1] and list(x) == [0.0, 1.0]:
            ys.append(float(y[0]))
    return ys


def categorical(df):
    df["variant"] = pd.Categorical(df["variant"], [v for v in ORDER if v in set(df["variant"])])
    return df


def ablation_frame(variants=ORDER, seeds=(0, 1, 2)):
    """Test losses 1.95 .. 2.10 nats/char, a per-seed spread of 0.01; parameter counts
    100,000 .. 340,000."""
    rows = [{"dataset": DS, "variant": v, "seed": s,
             "test_loss": 1.95 + 0.15 * i / max(len(variants) - 1, 1) + 0.005 * s,
             "n_params_non_embedding": 100_000 + 20_000 * i}
            for i, v in enumerate(variants) for s in seeds]
    return categorical(pd.DataFrame(rows))


def history_frame(variants=ORDER, tokens_per_step=1024):
    """Validation curves from log(vocab) ~ 4.2 down to ~2.0, and answer losses from ~1.0 down
    to ~0.01, at ``tokens_per_step`` training tokens a step."""
    rows = [{"dataset": DS, "variant": v, "seed": s, "step": step,
             "tokens": step * tokens_per_step,
             "val_loss": 2.0 + 0.01 * i + (4.2 - 2.0) * math.exp(-step / 60),
             "val_answer_loss": 0.01 * (1 + i) + math.exp(-step / 50)}
            for i, v in enumerate(variants) for s in range(3) for step in range(0, 301, 50)]
    return categorical(pd.DataFrame(rows))


def comparison_row(variant, verdict, mean_diff, half_width, holm_half_width=None, p=0.01,
                   n_pairs=3):
    low, high = mean_diff - half_width, mean_diff + half_width
    holm = half_width * 1.5 if holm_half_width is None else holm_half_width
    return {"dataset": DS, "metric": "test_loss", "higher_is_better": False,
            "baseline": "baseline", "variant": variant, "n_pairs": n_pairs,
            "mean_diff": mean_diff, "ci95_low": low, "ci95_high": high,
            "ci_holm_low": mean_diff - holm, "ci_holm_high": mean_diff + holm,
            "p_value": p / 3, "p_holm": p, "reject_holm": p < statistics.ALPHA,
            "verdict": verdict}


def comparisons_frame(rows):
    c = pd.DataFrame(rows).reindex(columns=statistics.COMPARISON_COLUMNS)
    return categorical(c)


# ---- families -------------------------------------------------------------------------------

def test_variant_family_of_every_configured_variant():
    assert {v: variant_family(o) for v, o in VARIANTS.items()} == EXPECTED_FAMILIES


def test_variant_family_is_other_for_unknown_keys_and_combined_across_families():
    assert variant_family({"dropout": 0.1}) == "other"
    assert variant_family({"rope_base": 500_000}) == "position"
    assert variant_family({"n_heads": 8, "n_kv_heads": 2}) == "attention"
    assert variant_family({"ffn": "swiglu", "ffn_hidden": 256}) == "FFN"
    assert variant_family({"ffn": "swiglu", "dropout": 0.1}) == "combined"
    assert set(EXPECTED_FAMILIES.values()) <= set(FAMILIES)


@pytest.fixture
def palette():
    return family_palette({v: variant_family(o) for v, o in VARIANTS.items()})


def test_family_palette_gives_every_variant_a_clearly_distinct_colour_in_order(palette):
    assert list(palette) == ORDER
    for a, b in itertools.combinations(ORDER, 2):
        distance = float(np.linalg.norm(np.subtract(palette[a], palette[b])))
        assert distance > 0.2, (a, b, distance)  # RGB in [0, 1]: 0.2 is a visible step


def _hue_distance(a, b):
    d = abs(colorsys.rgb_to_hls(*a)[0] - colorsys.rgb_to_hls(*b)[0])
    return min(d, 1 - d)  # hue is an angle: 0.99 is next to 0.01


def test_family_palette_variants_of_a_family_are_closer_in_hue_than_to_other_families(palette):
    by_family = {}
    for v, f in EXPECTED_FAMILIES.items():
        if f != "baseline":  # a grey has no hue
            by_family.setdefault(f, []).append(palette[v])
    for fam, other in itertools.permutations(by_family, 2):
        within = max((_hue_distance(a, b) for a, b in itertools.combinations(by_family[fam], 2)),
                     default=0.0)
        between = min(_hue_distance(a, b) for a in by_family[fam] for b in by_family[other])
        assert within < between, (fam, other, within, between)


def test_family_palette_baseline_is_darkest_and_no_shade_is_near_white(palette):
    lightness = {v: colorsys.rgb_to_hls(*c)[1] for v, c in palette.items()}
    assert min(lightness, key=lightness.get) == "baseline"
    assert lightness["baseline"] < 0.15
    assert max(lightness.values()) < 0.8  # the pale end of a colour map vanishes on white


def test_family_palette_rejects_an_unknown_family():
    with pytest.raises(ValueError, match="unknown families"):
        family_palette({"x": "attn"})


# ---- palette argument -----------------------------------------------------------------------

def _legend_colours(ax):
    leg = ax.get_legend()
    return {t.get_text(): to_rgb(h.get_color()) for t, h in zip(leg.get_texts(),
                                                                  leg.legend_handles)
            if hasattr(h, "get_color")}


def test_val_loss_curves_use_the_given_palette_and_keep_the_study_order(drawn, tmp_path,
                                                                         palette):
    assert figures.plot_val_loss_curves(history_frame(), DS, tmp_path / "v.png",
                                        palette=palette) == tmp_path / "v.png"
    ax = drawn[0].axes[0]
    colours = _legend_colours(ax)
    assert [t for t in colours if t in VARIANTS] == ORDER
    for v in ORDER:
        assert np.allclose(colours[v], palette[v]), v


def test_params_vs_loss_uses_the_given_palette(drawn, tmp_path, palette):
    figures.plot_params_vs_loss(ablation_frame(), DS, tmp_path / "p.png", palette=palette)
    colours = _legend_colours(drawn[0].axes[0])
    for v in ORDER:
        assert np.allclose(colours[v], palette[v]), v


def test_a_palette_without_a_variant_is_an_error_naming_it(tmp_path, palette):
    partial = {v: c for v, c in palette.items() if v != "rope"}
    with pytest.raises(ValueError, match="rope"):
        figures.plot_val_loss_curves(history_frame(), DS, tmp_path / "v.png", palette=partial)


# ---- reference lines ------------------------------------------------------------------------

def test_val_loss_curves_draw_a_labelled_line_at_every_reference(drawn, tmp_path, palette):
    figures.plot_val_loss_curves(history_frame(), DS, tmp_path / "v.png", palette=palette,
                                 references=REFERENCES)
    ax = drawn[0].axes[0]
    assert sorted(horizontal_lines(ax)) == sorted(REFERENCES.values())
    texts = legend_texts(drawn[0])
    for name, value in REFERENCES.items():
        assert f"{name}: {value:.3f}" in texts


def test_val_loss_curves_name_a_reference_far_from_the_curves_without_stretching_the_axis(
        drawn, tmp_path, palette):
    refs = {"trigram (KN)": 2.20, "floor": 0.50}
    figures.plot_val_loss_curves(history_frame(), DS, tmp_path / "v.png", palette=palette,
                                 references=refs)
    fig = drawn[0]
    ax = fig.axes[0]
    assert horizontal_lines(ax) == [2.20]
    assert "floor: 0.500 (off the axis, below)" in legend_texts(fig)
    renderer_of(fig)
    assert ax.get_ylim()[0] > 1.5  # the curves end at 2.0-2.1: the far line does not set it


def test_val_loss_curves_put_every_variant_on_the_compute_axis_where_equal_budgets_end_together(
        drawn, tmp_path, palette):
    # a wider variant costs twice the FLOPs per token and trains half the tokens a step
    h = pd.concat([history_frame(["baseline"]), history_frame(["swiglu"], tokens_per_step=512)])
    h = categorical(h.reset_index(drop=True))
    figures.plot_val_loss_curves(h, DS, tmp_path / "v.png", palette=palette,
                                 flops_per_token={"baseline": 1000.0, "swiglu": 2000.0})
    ax = drawn[0].axes[0]
    assert ax.get_xlabel() == "training compute (FLOPs)"
    ends = sorted({float(line.get_xdata()[-1]) for line in ax.get_lines()
                   if len(line.get_xdata()) > 1})
    assert ends == [300 * 1024 * 1000.0]


def test_val_loss_curves_of_an_answer_loss_falling_a_hundredfold_are_on_a_log_axis(
        drawn, tmp_path, palette):
    figures.plot_val_loss_curves(history_frame(["baseline", "rope"]), DS, tmp_path / "v.png",
                                 palette=palette, metric="val_answer_loss")
    ax = drawn[0].axes[0]
    assert ax.get_yscale() == "log"
    assert ax.get_ylabel() == "validation answer loss (nats/answer char)"
    figures.plot_val_loss_curves(history_frame(["baseline", "rope"]), DS, tmp_path / "w.png",
                                 palette=palette)
    assert drawn[1].axes[0].get_yscale() == "linear"


def test_the_test_loss_figure_draws_the_headline_metric_it_is_given(drawn, tmp_path):
    a = ablation_frame()
    a["answer_loss"] = a["test_loss"] - 2.0
    figures.plot_test_loss(a, DS, tmp_path / "t.png", metric="answer_loss")
    ax = drawn[0].axes[0]
    assert ax.get_ylabel() == "answer loss (nats/answer char)"
    assert ax.get_ylim()[1] < 1.0  # the answer losses, not the test losses around 2


def test_test_loss_draws_a_near_reference_and_names_a_far_one_off_the_axis(drawn, tmp_path):
    refs = {"unigram (KN)": 3.30, "trigram (KN)": 2.20, "floor": 0.50}
    figures.plot_test_loss(ablation_frame(), DS, tmp_path / "t.png", references=refs)
    fig = drawn[0]
    ax = fig.axes[0]
    lines = horizontal_lines(ax)
    assert 2.20 in lines
    assert 3.30 not in lines and 0.50 not in lines
    texts = legend_texts(fig)
    assert "trigram (KN): 2.200" in texts
    assert "unigram (KN): 3.300 (off the axis, above)" in texts
    assert "floor: 0.500 (off the axis, below)" in texts
    renderer_of(fig)
    low, high = ax.get_ylim()
    assert high < 3.30 and low > 0.50  # the far references do not stretch the axis
    assert high - low < 1.0  # and the variants' 0.15-nat spread stays readable


def test_test_loss_without_references_draws_only_the_baseline_mean(drawn, tmp_path):
    figures.plot_test_loss(ablation_frame(), DS, tmp_path / "t.png")
    assert len(horizontal_lines(drawn[0].axes[0])) == 1


# ---- forest plot ----------------------------------------------------------------------------

def wide_forest_frame():
    """12 variants, the later ones with intervals reaching the right edge of the data."""
    verdicts = [statistics.VERDICT_BETTER, statistics.VERDICT_WORSE, statistics.VERDICT_NSD]
    rows = [comparison_row(v, verdicts[i % 3], mean_diff=-0.05 + 0.02 * i,
                           half_width=0.01 + 0.02 * i, p=0.001 * (i + 1))
            for i, v in enumerate(ORDER[1:])]
    return comparisons_frame(rows)


def test_forest_labels_lie_right_of_the_data_area_clear_of_markers_intervals_and_legend(
        drawn, tmp_path):
    c = wide_forest_frame()
    assert figures.plot_forest(c, DS, tmp_path / "f.png") == tmp_path / "f.png"
    fig = drawn[0]
    ax = fig.axes[0]
    renderer = renderer_of(fig)
    notes = ax.texts
    assert len(notes) == len(c)
    data_area = ax.get_window_extent(renderer)
    drawn_data = drawn_extents(ax, renderer)
    assert len(drawn_data) > 2 * len(c)  # the intervals and markers were found
    legend = fig.legends[0].get_window_extent(renderer)
    for note in notes:
        box = note.get_window_extent(renderer)
        assert not box.overlaps(data_area), note.get_text()
        assert not any(box.overlaps(d) for d in drawn_data), note.get_text()
        assert not box.overlaps(legend), note.get_text()
        # and not cut off by the figure's edge
        assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1, note.get_text()
        assert fig.bbox.y0 <= box.y0 and box.y1 <= fig.bbox.y1, note.get_text()
    # the labels are in the variants' rows, one per row, in order
    ys = [note.xy[1] for note in notes]
    assert ys == list(range(len(c)))
    assert notes[0].get_text() == "p_Holm=0.001 *"


def test_forest_draws_the_raw_interval_and_the_holm_interval_and_names_both(drawn, tmp_path):
    row = comparison_row("gelu", statistics.VERDICT_BETTER, mean_diff=-0.1, half_width=0.02,
                         holm_half_width=0.04, p=0.004)
    figures.plot_forest(comparisons_frame([row]), DS, tmp_path / "f.png")
    fig = drawn[0]
    ax = fig.axes[0]
    bars = [(p.get_x(), p.get_x() + p.get_width()) for p in ax.patches]
    assert np.allclose(bars, [(-0.14, -0.06)])  # the Holm interval, as a bar
    segments = [s for coll in ax.collections if hasattr(coll, "get_segments")
                for s in coll.get_segments()]
    assert any(np.allclose(sorted(s[:, 0]), [-0.12, -0.08]) for s in segments)  # raw interval
    texts = legend_texts(fig)
    assert "95% t-interval (raw)" in texts and "Holm-adjusted interval" in texts
    assert "Holm" in ax.get_title() and "95% t-interval" in ax.get_title()


def test_forest_draws_the_holm_interval_widened_by_the_tuning_uncertainty(drawn, tmp_path):
    """A dotted box from ci_holm_low - u to ci_holm_high + u: a verdict stands only when it
    is clear of 0 (statistics.tuning_check), so the reader sees why one reads undecided."""
    row = {**comparison_row("gelu", statistics.VERDICT_UNDECIDED_TUNING, mean_diff=-0.1,
                            half_width=0.02, holm_half_width=0.04, p=0.004),
           "tuning_uncertainty": 0.07}
    other = comparison_row("rope", statistics.VERDICT_NSD, mean_diff=0.01, half_width=0.02,
                           holm_half_width=0.04, p=0.6)  # no bracket: no box
    figures.plot_forest(comparisons_frame([row, other]), DS, tmp_path / "f.png")
    fig = drawn[0]
    ax = fig.axes[0]
    boxes = [(p.get_x(), p.get_x() + p.get_width()) for p in ax.patches if not p.get_fill()]
    assert np.allclose(boxes, [(-0.21, 0.01)])
    assert fig.axes[0].get_xlim()[1] > 0.05  # the box and the other row's bar in view
    assert any("tuning uncertainty" in t for t in legend_texts(fig))
    assert "tuning uncertainty" in ax.get_title()


def test_forest_marks_a_difference_identical_on_every_seed(drawn, tmp_path):
    rows = [comparison_row("gelu", statistics.VERDICT_NSD, -0.01, 0.02, p=0.6),
            {**comparison_row("rmsnorm", statistics.VERDICT_IDENTICAL, 0.0, 0.0),
             "p_value": np.nan, "p_holm": np.nan, "ci_holm_low": np.nan,
             "ci_holm_high": np.nan, "reject_holm": False},
            {**comparison_row("rope", statistics.VERDICT_FEW, 0.03, np.nan, n_pairs=2),
             "p_holm": np.nan}]
    figures.plot_forest(comparisons_frame(rows), DS, tmp_path / "f.png")
    fig = drawn[0]
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.texts] == [
        "p_Holm=0.6", statistics.VERDICT_IDENTICAL, "n=2: no test"]
    marker_colours = [to_rgb(c) for coll in ax.collections if hasattr(coll, "get_offsets")
                      and len(coll.get_offsets()) == 3 for c in coll.get_facecolors()]
    assert np.allclose(marker_colours[1],
                       to_rgb(figures.VERDICT_COLORS[statistics.VERDICT_IDENTICAL]))
    assert statistics.VERDICT_IDENTICAL in legend_texts(fig)


def test_forest_draws_comparisons_without_holm_interval_columns(drawn, tmp_path):
    row = comparison_row("gelu", statistics.VERDICT_BETTER, -0.1, 0.02, p=0.004)
    old = comparisons_frame([row]).drop(columns=["ci_holm_low", "ci_holm_high"])
    assert figures.plot_forest(old, DS, tmp_path / "f.png") == tmp_path / "f.png"
    assert len(drawn[0].axes[0].patches) == 0  # no Holm bar to draw


# ---- size and units ---------------------------------------------------------------------------

def test_params_vs_loss_is_not_drawn_over_a_narrow_range_and_says_why(drawn, tmp_path, palette):
    narrow = ablation_frame(variants=("baseline", "gelu", "rope"))
    narrow["n_params_non_embedding"] = narrow["variant"].map(
        {"baseline": 14_376, "gelu": 14_560, "rope": 14_376}).astype(int)
    assert figures.plot_params_vs_loss(narrow, DS, tmp_path / "p.png", palette=palette) is None
    assert not drawn and not (tmp_path / "p.png").exists()
    assert figures.params_too_narrow(narrow, DS) == (
        f"{DS}: non-embedding parameters vs test loss not drawn: the parameter counts span "
        "14,376 to 14,560 (1.3% apart), too narrow a range to show a trend in size (the "
        "figure needs the largest at least 1.2 times the smallest).")
    # at 1.2x it is drawn, and then there is nothing to say
    wide = narrow.assign(n_params_non_embedding=narrow["n_params_non_embedding"]
                         .map({14_376: 10_000, 14_560: 12_000}))
    assert figures.plot_params_vs_loss(wide, DS, tmp_path / "p.png", palette=palette)
    assert figures.params_too_narrow(wide, DS) is None


def test_every_loss_axis_is_in_nats_per_char(drawn, tmp_path, palette):
    figures.plot_val_loss_curves(history_frame(), DS, tmp_path / "v.png", palette=palette)
    figures.plot_test_loss(ablation_frame(), DS, tmp_path / "t.png")
    figures.plot_params_vs_loss(ablation_frame(), DS, tmp_path / "p.png", palette=palette)
    curves = categorical(pd.DataFrame({"variant": ["baseline", "rope"] * 2,
                                       "position": [0, 0, 16, 16], "loss": [2.0, 2.1, 1.9, 2.0],
                                       "seeds": 3, "factor": 2}))
    figures.plot_position_loss(curves, DS, 16, tmp_path / "x.png", palette=palette)
    tuning_figure.plot_lr_response(lr_trials(), lr_tuned(), DS, tmp_path / "lr.png",
                                   palette=palette)
    labels = [ax.get_ylabel() for fig in drawn for ax in fig.axes if "loss" in ax.get_ylabel()]
    assert len(labels) == 7
    assert all(label.endswith("(nats/char)") for label in labels), labels


# ---- tuning ---------------------------------------------------------------------------------

def lr_trials(variants=("baseline", "gelu")):
    """Trials of a study per variant (trials.csv): the shared design of 4 learning rates at
    d_model 48 (gelu's largest diverged), 2 TPE trials, and 2 at the full budget."""
    lrs = [1.8e-3, 5.6e-3, 1.8e-2, 5.6e-2]
    rows = []
    for i, v in enumerate(variants):
        design = [(0, 0, lr, 48, 2.6 - 0.1 * k + 0.01 * i) for k, lr in enumerate(lrs)]
        others = [(0, 1, 3e-3, 32, 2.45), (0, 1, 2e-2, 64, 2.5),
                  (1, 2, 3e-3, 32, 2.0 + 0.01 * i), (1, 2, 1.8e-2, 48, 2.1)]
        for slot, (rung, batch, lr, d, value) in enumerate(design + others):
            diverged = v == "gelu" and slot == 3
            rows.append({"dataset": DS, "variant": v, "number": slot, "rung": rung,
                         "batch": batch, "budget_fraction": (0.125, 1.0)[rung],
                         "state": "FAIL" if diverged else "COMPLETE",
                         "value": np.nan if diverged else value, "params_lr": lr,
                         "params_d_model": d,
                         "tokens_per_parameter": {32: 40.0, 48: 20.0, 64: 11.0}[d]})
    return categorical(pd.DataFrame(rows))


def lr_tuned(variants=("baseline", "gelu")):
    """best.json of each study: the full-budget trial at lr 3e-3, d_model 32, searched over
    lr 1e-3 .. 1e-1 (gelu's range extended up to 1) and the widths 32, 48, 64."""
    return categorical(pd.DataFrame({"dataset": DS, "variant": list(variants), "lr": 3e-3,
                                     "d_model": 32, "full_budget": True, "lr_low": 1e-3,
                                     "lr_high": [1.0 if v == "gelu" else 1e-1 for v in variants],
                                     "d_model_choices": "32 48 64"}))


def display_x(ax, collection):
    """The display x of each point of a scatter ``collection`` of ``ax`` (after a draw)."""
    renderer_of(ax.figure)
    return collection.get_offset_transform().transform(collection.get_offsets())[:, 0]


def test_lr_response_joins_each_variants_design_and_marks_diverged_and_tuned_trials(
        drawn, tmp_path, palette):
    path = tuning_figure.plot_lr_response(lr_trials(), lr_tuned(), DS, tmp_path / "lr.png",
                                          palette=palette)
    assert path == tmp_path / "lr.png" and path.read_bytes()[:4] == b"\x89PNG"
    left, middle, right = drawn[0].axes[:3]
    assert left.get_xscale() == "log"
    assert "nats/char" in left.get_ylabel() and "0.125 of the budget" in left.get_title()
    assert "d_model 48" in left.get_title() and "one seed" in left.get_title()
    # one line per variant through its completed design points, in the variant's colour
    lines = {tuple(to_rgb(line.get_color())): line for line in left.lines}
    base, gelu = lines[tuple(palette["baseline"])], lines[tuple(palette["gelu"])]
    assert list(base.get_xdata()) == pytest.approx([1.8e-3, 5.6e-3, 1.8e-2, 5.6e-2])
    assert list(gelu.get_xdata()) == pytest.approx([1.8e-3, 5.6e-3, 1.8e-2])  # 1 diverged
    # each variant's tuned configuration starred at its first-rung trial (3e-3, 2.45); both
    # chose it, so the two stars are fanned out sideways, one star's width apart, around it
    stars = [c for c in left.collections if c.get_sizes().size and c.get_sizes()[0] == 260]
    assert [c.get_offsets().tolist() for c in stars] == [[[3e-3, 2.45]]] * 2
    assert [to_rgb(c.get_facecolor()[0]) for c in stars] == [
        pytest.approx(palette["baseline"]), pytest.approx(palette["gelu"])]
    true_x = left.transData.transform([[3e-3, 2.45]])[0, 0]
    xs = [display_x(left, c)[0] for c in stars]
    px_per_point = drawn[0].dpi / 72
    assert xs[1] - xs[0] == pytest.approx(tuning_figure.STAR_SPREAD * px_per_point)
    assert (xs[0] + xs[1]) / 2 == pytest.approx(true_x)
    # the isoFLOP panel: ticks at the first-rung widths, labelled with tokens per parameter
    assert [t.get_text() for t in middle.get_xticklabels()] == ["32\n40", "48\n20", "64\n11"]
    assert "isoFLOP" in middle.get_title() and "0.125 of the budget" in middle.get_title()
    # the full budget on an axis of its own: its diamonds, filled for the chosen trial
    assert "the full budget" in right.get_title()
    diamonds = [c for c in right.collections if len(c.get_offsets())]
    assert sorted(y for c in diamonds for _, y in c.get_offsets()) == [2.0, 2.01, 2.1, 2.1]
    assert not [c for c in middle.collections if c.get_paths()
                and len(c.get_offsets()) and 2.0 in c.get_offsets()[:, 1]]
    # the figure's legend names the variants alone; each panel's legend its own markers
    assert [t.get_text() for t in drawn[0].legends[0].get_texts()] == ["baseline", "gelu"]
    assert "diverged (at the top edge)" in [t.get_text() for t in left.get_legend().get_texts()]
    assert [t.get_text() for t in right.get_legend().get_texts()] == ["chosen", "not chosen"]
    texts = legend_texts(drawn[0])
    assert any(t.startswith("tuned configuration\n(overlapping ones fanned out") for t in texts)
    # the searched ranges: shaded beyond them, the union of the variants' lr ranges
    assert "outside the searched range\n(lr 0.001 to 1; d_model 32 48 64)" in texts
    for ax, (low, high) in ((left, (1e-3, 1.0)), (middle, (32, 64))):
        edges = sorted(x for line in ax.lines if line.get_linestyle() == "--"
                       for x in set(line.get_xdata()))
        assert edges == pytest.approx([low, high])
        lim = ax.get_xlim()
        spans = sorted((p.get_x(), p.get_x() + p.get_width()) for p in ax.patches
                       if to_rgb(p.get_facecolor()) == to_rgb(tuning_figure.OUTSIDE))
        assert len(spans) == 2
        assert spans[0][0] == pytest.approx(lim[0]) and spans[0][1] <= low
        assert spans[1][0] >= high and spans[1][1] == pytest.approx(lim[1])


def test_star_offsets_fan_out_only_stars_that_would_cover_each_other():
    spread = tuning_figure.STAR_SPREAD
    # three variants chose the same trial, a fourth one far away, a fifth at the same lr
    # but a much lower loss
    offsets = tuning_figure.star_offsets([2e-2, 2e-2, 2e-2, 2e-3, 2.05e-2],
                                         [2.5, 2.5, 2.501, 2.5, 2.2], lr_span=2.0,
                                         loss_span=1.0)
    assert offsets.tolist() == [-spread, 0.0, spread, 0.0, 0.0]
    # two near stars keep their left-to-right order: the one at the lower lr goes left
    near = tuning_figure.star_offsets([2.1e-2, 2e-2], [2.5, 2.5], lr_span=2.0, loss_span=1.0)
    assert near.tolist() == [spread / 2, -spread / 2]


def test_search_bounds_are_the_union_of_the_variants_ranges():
    tuned = lr_tuned()
    assert tuning_figure.search_bounds(tuned, DS) == (1e-3, 1.0, [32, 48, 64])
    assert tuning_figure.search_bounds(tuned, "other") == (None, None, [])
    assert tuning_figure.search_bounds(None, DS) == (None, None, [])


def test_lr_response_is_none_without_first_rung_trials_or_rung_columns(drawn, tmp_path,
                                                                       palette):
    trials = lr_trials()
    plot = tuning_figure.plot_lr_response
    assert plot(trials, None, "other", tmp_path / "a.png", palette=palette) is None
    old = trials.drop(columns=["rung", "batch"])  # trials.csv before successive halving
    assert plot(old, None, DS, tmp_path / "b.png", palette=palette) is None
    assert plot(pd.DataFrame(), None, DS, tmp_path / "c.png", palette=palette) is None
    assert not drawn and not list(tmp_path.iterdir())


# ---- length generalisation --------------------------------------------------------------------

def length_frame():
    """Exact match by operand digits 1-4 of three seeds; rope cannot run 4 digits (n/a)."""
    rows = []
    for v_idx, v in enumerate(("baseline", "gelu", "rope")):
        for seed in range(3):
            for d in (1, 2, 3, 4):
                na = (v, d) == ("rope", 4)
                rows.append({"dataset": "arith", "variant": v, "seed": seed, "digits": d,
                             "split": "test" if d <= 2 else "length",
                             "exact_match": None if na else 1.0 - 0.2 * d + 0.01 * seed * v_idx,
                             "n": {1: 6, 2: 94, 3: 500, 4: 500}[d],
                             "note": "n/a (learned table of 8 positions)" if na else ""})
    return categorical(pd.DataFrame(rows))


def test_length_generalisation_draws_exact_match_by_length_leaving_out_na(drawn, tmp_path,
                                                                        palette):
    frame = length_frame()
    path = arith_figs.plot_length_generalisation(frame, "arith", 2, tmp_path / "l.png",
                                                 palette=palette)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ax = drawn[0].axes[0]
    assert ax.get_ylim() == pytest.approx((-0.02, 1.02))
    assert [int(t) for t in ax.get_xticks()] == [1, 2, 3, 4]
    # each length's problems per seed under its tick, the few marked
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        "1\n6 problems †", "2\n94 problems", "3\n500 problems", "4\n500 problems"]
    assert "fewer than 30" in ax.get_xlabel()
    # the data lines (not the error bars' caps), told apart by their palette colour
    lines = {v: line for line in ax.lines
             if len(line.get_xdata()) > 2 and line.get_linestyle() == "-"
             for v in ("baseline", "gelu", "rope")
             if np.allclose(to_rgb(line.get_color()), palette[v])}
    at = {v: np.round(np.asarray(lines[v].get_xdata(), float)).astype(int).tolist()
          for v in lines}
    assert at == {"baseline": [1, 2, 3, 4], "gelu": [1, 2, 3, 4],
                  "rope": [1, 2, 3]}  # rope's n/a length left out
    gelu = frame[frame["variant"] == "gelu"]
    assert lines["gelu"].get_ydata().tolist() == pytest.approx(
        gelu.groupby("digits")["exact_match"].mean().tolist())
    # the error bars' caps sit at the 95% t-interval of each length's seeds
    caps = [line.get_ydata().tolist() for line in ax.lines if line.get_marker() == "_"
            and len(line.get_xdata()) == 4
            and np.allclose(to_rgb(line.get_color()), palette["gelu"])]
    want = [statistics.fraction_interval(g) for _, g in gelu.groupby("digits")["exact_match"]]
    assert len(caps) == 2
    np.testing.assert_allclose(sorted(caps), [[w[0] for w in want], [w[1] for w in want]],
                               rtol=1e-12)
    dashed = [line for line in ax.lines if list(line.get_xdata()) == [2, 2]]
    assert len(dashed) == 1 and dashed[0].get_linestyle() == "--"
    assert "longest training length (2 digits)" in legend_texts(drawn[0])
    assert "longer than any training problem" in legend_texts(drawn[0])
    assert arith_figs.plot_length_generalisation(frame.iloc[:0], "arith", 2, tmp_path / "x.png",
                                                 palette=palette) is None
    assert not (tmp_path / "x.png").exists()


# ---- by operation -----------------------------------------------------------------------------

def per_op_frame(zero=False):
    """Exact match and char accuracy per operation of three seeds (all 0 when ``zero``)."""
    rows = [{"dataset": "arith", "variant": v, "seed": seed, "op": op,
             "exact_match": 0.0 if zero else 0.2 * (i + 1) + 0.01 * seed + 0.1 * k,
             "char_accuracy": 0.0 if zero else 0.5 + 0.1 * i + 0.01 * seed + 0.05 * k}
            for i, v in enumerate(("baseline", "gelu", "rope")) for seed in range(3)
            for k, op in enumerate(("add", "sub"))]
    return categorical(pd.DataFrame(rows))


ARITH_REFERENCES = pd.DataFrame([
    {"dataset": "arith", "reference": "all zeros", "metric": "exact_match", "value": 0.008,
     "detail": "`000$`"},
    {"dataset": "arith", "reference": "most frequent answer", "metric": "exact_match",
     "value": 0.011, "detail": "`050$`"},
    {"dataset": "arith", "reference": "best constant answer", "metric": "char_accuracy",
     "value": 0.45, "detail": "`710$`"}])


def test_by_op_draws_means_and_intervals_per_variant_beside_the_floor(drawn, tmp_path,
                                                                      palette):
    frame = per_op_frame()
    path = arith_figs.plot_by_op(frame, "arith", tmp_path / "c.png", "char_accuracy",
                                 palette=palette, references=ARITH_REFERENCES)
    assert path.read_bytes()[:4] == b"\x89PNG"
    ax = drawn[0].axes[0]
    assert horizontal_lines(ax) == [0.45]  # the floor of char accuracy, and only it
    assert 'best constant answer "710$" (all operations): 0.450' in legend_texts(drawn[0])
    # each variant's means in its palette colour, one per operation
    for v in ("baseline", "gelu", "rope"):
        means = [line for line in ax.lines if line.get_marker() == "o"
                 and len(line.get_xdata()) == 2  # one mean per operation
                 and np.allclose(to_rgb(line.get_color()), palette[v])]
        want = frame[frame["variant"] == v].groupby("op")["char_accuracy"].mean()
        assert len(means) == 1
        assert means[0].get_ydata().tolist() == pytest.approx(want.loc[["add", "sub"]].tolist())
    assert "char accuracy (fraction)" == ax.get_ylabel()


def test_by_op_draws_nothing_when_no_variant_solved_any_problem(drawn, tmp_path, palette):
    frame = per_op_frame(zero=True)
    assert arith_figs.plot_by_op(frame, "arith", tmp_path / "e.png", "exact_match",
                                 palette=palette, references=ARITH_REFERENCES) is None
    assert not drawn and not (tmp_path / "e.png").exists()
    assert arith_figs.nothing_solved(frame, "arith", "exact_match") == (
        "arith: exact match by operation not drawn: no variant solved any problem (exact match "
        "0 on every operation, variant and seed).")
    assert arith_figs.nothing_solved(per_op_frame(), "arith", "exact_match") is None


# ---- embeddings -------------------------------------------------------------------------------

def test_char_class_names_the_unknown_symbol_apart_from_upper_case():
    from lmablate.data.tokenizer import UNK, CharTokenizer
    assert UNK.isupper()  # why str.isupper alone misclassed it
    tok = CharTokenizer("abAB1 ,")
    chars = [tok.decode([i]) for i in range(tok.vocab_size)]
    classes = [model_figures.char_class(c, tok.unk) for c in chars]
    assert classes[tok.unk_id] == "unknown symbol"
    assert classes.count("unknown symbol") == 1
    assert model_figures.char_class("A") == "upper case"
    assert model_figures.char_class(" ") == "whitespace"


def test_embedding_pca_labels_do_not_overlap_and_the_unknown_symbol_is_labelled(drawn,
                                                                             tmp_path):
    from lmablate.data.tokenizer import UNK
    rng = np.random.default_rng(0)
    chars = [UNK, *"abcdefghijklmnopqrstuvwxyzABCDEFGHIJ0123456789 .,;!?"]
    # a dense cluster (most labels cannot all fit) around the centre
    embs = {v: rng.normal(scale=0.05, size=(len(chars), 8)) for v in ("baseline", "rope")}
    model_figures.plot_embedding_pca(embs, chars, "emb", tmp_path / "e.png")
    fig = drawn[0]
    renderer = renderer_of(fig)
    for ax in fig.axes[:2]:
        shown = [t for t in ax.texts if t.get_visible()]
        boxes = [t.get_window_extent(renderer) for t in shown]
        assert 0 < len(shown) < len(chars)
        assert not any(a.overlaps(b) for a, b in itertools.combinations(boxes, 2))
        assert UNK in [t.get_text() for t in shown]
        assert min(t.get_fontsize() for t in ax.texts) >= 8
    assert "unknown symbol" in legend_texts(fig)
    hidden = sum(not t.get_visible() for ax in fig.axes for t in ax.texts)
    assert f"dots without a label: {hidden} of {2 * len(chars)}" in fig.get_suptitle()


def test_panels_lays_out_n_panels_at_most_max_cols_a_row_and_hides_the_rest(tmp_path):
    from lmablate.report.figures import plotting
    with plotting.panels(tmp_path / "p.png", 3, 2, (2.0, 1.5), (1.0, 0.5)) as (fig, axes):
        assert axes.shape == (2, 2)
        assert [ax.get_visible() for ax in axes.ravel()] == [True, True, True, False]
        assert tuple(fig.get_size_inches()) == (5.0, 3.5)
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_learning_speed_draws_each_variants_share_learned_as_a_step_line(drawn, tmp_path,
                                                                         palette):
    from lmablate.report.stats.learning_speed import SPEED_COLUMNS
    rows = [{"dataset": "arith", "variant": v, "seed": s, "threshold": t,
             "tokens": 1e6 * (s + 1) if v == "gelu" or s < 2 else 5e6,
             "learned": v == "gelu" or s < 2}
            for v in ("baseline", "gelu") for s in range(4) for t in (0.5, 0.9)]
    speed = categorical(pd.DataFrame(rows, columns=SPEED_COLUMNS))
    path = arith_figs.plot_learning_speed(speed, "arith", tmp_path / "s.png", palette=palette)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fig = drawn[0]
    assert len(fig.axes) == 2 and [a.get_title() for a in fig.axes[:2]] == [
        "exact match ≥ 0.5 on the probe problems", "exact match ≥ 0.9 on the probe problems"]
    ax = fig.axes[0]
    steps = {v: line for line in ax.lines for v in ("baseline", "gelu")
             if line.get_drawstyle().startswith("steps")
             and np.allclose(to_rgb(line.get_color()), palette[v])}
    assert steps["gelu"].get_ydata()[-1] == pytest.approx(1.0)  # every seed learned
    assert steps["baseline"].get_ydata()[-1] == pytest.approx(0.5)  # 2 of 4, the rest censored
    assert ax.get_xlim()[1] == pytest.approx(5 * 1.03)
    assert "baseline (4 seeds)" in legend_texts(fig)
    assert arith_figs.plot_learning_speed(speed.iloc[:0], "arith", tmp_path / "x.png",
                                          palette=palette) is None


def test_learning_speed_draws_no_panel_for_a_threshold_no_seed_reached(drawn, tmp_path,
                                                                        palette):
    from lmablate.report.stats.learning_speed import SPEED_COLUMNS
    rows = [{"dataset": "arith", "variant": v, "seed": s, "threshold": t,
             "tokens": 1e6 * (s + 1) if t == 0.5 else 5e6, "learned": t == 0.5}
            for v in ("baseline", "gelu") for s in range(4) for t in (0.5, 0.9)]
    speed = categorical(pd.DataFrame(rows, columns=SPEED_COLUMNS))
    arith_figs.plot_learning_speed(speed, "arith", tmp_path / "s.png", palette=palette)
    assert [a.get_title() for a in drawn[0].axes] == ["exact match ≥ 0.5 on the probe problems"]
    never = speed.assign(learned=False, tokens=5e6)
    arith_figs.plot_learning_speed(never, "arith", tmp_path / "n.png", palette=palette)
    assert [a.get_title() for a in drawn[1].axes] == ["exact match ≥ 0.5 on the probe problems"]
