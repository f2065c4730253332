"""The report's section "How each variant responds to the learning rate", per dataset.

The learning-rate sensitivity of each variant (:func:`lmablate.report.stats.sensitivity.
lr_sensitivity`, Wortsman et al. 2023, sec. 2.2), what its tuning chose (best.json, the
range-edge flags) and the tuning figure, written from ``lr_sensitivity.csv``, ``tuned.csv`` and
the trials. Losses in nats/char.
"""

from __future__ import annotations

from typing import Any, Sequence

import pandas as pd

from lmablate.config.study import StudyConfig
from lmablate.report.stats.sensitivity import design_is_shared, width_summary
from lmablate.report.text.mdtable import md_table, num
from lmablate.report.text.templating import macro_text

LR = "_lr.md.j2"  # the section's sentences

def _missing(x: Any) -> bool:
    """None, NaN or an empty string."""
    return x is None or (isinstance(x, str) and not x) or (not isinstance(x, str) and pd.isna(x))


def _lr_table(sens: pd.DataFrame, tuned: pd.DataFrame, widths: pd.DataFrame,
              order: Sequence[str]) -> str:
    """One row per variant of ``sens`` or ``tuned`` (one dataset): S, its design points, the
    best design lr, and the tuned values of ``tuned`` (best.json) with the tokens per
    parameter of the tuned width (``widths``: :func:`~lmablate.report.stats.sensitivity.
    width_summary`)."""
    ratios = {int(r.d_model): r.tokens_per_parameter for r in widths.itertuples()}
    rows = []
    for variant in order:
        s, t = sens[sens["variant"] == variant], tuned[tuned["variant"] == variant]
        if s.empty and t.empty:
            continue
        s = s.iloc[0].to_dict() if len(s) else {}
        t = t.iloc[0].to_dict() if len(t) else {}
        n, width = s.get("n_design"), t.get("d_model")
        ratio = None if _missing(width) else ratios.get(int(width))
        rows.append({
            "variant": variant,
            "LR sensitivity S (nats)": num(s.get("lr_sensitivity")),
            "design points (diverged)": "–" if _missing(n) else
            f"{int(n)} ({int(s['n_design_diverged'])})",
            "best design lr": "–" if _missing(s.get("best_design_lr")) else
            f"{s['best_design_lr']:.3g}",
            "tuned lr": "–" if _missing(t.get("lr")) else f"{t['lr']:.3g}",
            "tuned d_model (tokens/param)": "–" if _missing(width) else f"{int(width)}" + (
                "" if _missing(ratio) else f" ({ratio:.3g})"),
            "trained at full budget": "–" if _missing(t.get("full_budget")) else (
                "yes" if str(t["full_budget"]).strip().lower() in ("true", "1", "yes")
                else "no"),
            "range extended": "–" if _missing(t.get("extended")) else str(t["extended"]),
            "on edge": "–" if _missing(t.get("on_edge")) else str(t["on_edge"]),
        })
    return md_table(pd.DataFrame(rows)) if rows else "_No tuning trials._"


def lr_section(cfg: StudyConfig, sensitivity: pd.DataFrame, tuned: pd.DataFrame,
                trials: pd.DataFrame, dataset: str, order: Sequence[str],
                has_figure: bool = False) -> list[str]:
    """"How each variant responds to the learning rate", below its heading and above its
    figure (both the template's): the dataset's design and L0 (the sensitivity is defined
    once, in ``_tuning.md.j2``), the table (:func:`_lr_table`) and the variants without one;
    no lines when the dataset has neither a sensitivity row nor a figure (``has_figure``)."""
    sens = sensitivity[sensitivity["dataset"] == dataset] if len(sensitivity) else sensitivity
    if sens.empty and not has_figure:
        return []
    tu = cfg.tune
    design = sens.dropna(subset=["design_d_model"])
    n = int(design["n_design"].max()) if len(design) else tu.trials_per_batch
    width = ", ".join(str(int(w)) for w in pd.unique(design["design_d_model"])) or "–"
    ratio = ", ".join(f"{x:.3g}" for x in pd.unique(design["design_tokens_per_parameter"]
                                                     .dropna()))
    fraction = ", ".join(f"{x:g}" for x in pd.unique(design["budget_fraction"].dropna())) \
        or f"{tu.rungs[0][1]:g}"
    l0 = sens["uniform_loss"].dropna()
    missing = [(r.variant, r.note) for r in sens.itertuples() if isinstance(r.note, str) and r.note]
    lines = [macro_text(LR, "design", n=n, tu=tu, width=width, ratio=ratio, fraction=fraction,
                        l0=float(l0.iloc[0]) if len(l0) else None,
                        shared=design_is_shared(trials, dataset)), "",
             _lr_table(sens, tuned[tuned["dataset"] == dataset] if len(tuned) else tuned,
                       width_summary(trials[trials["dataset"] == dataset]
                                     if len(trials) else trials), order), ""]
    if missing:
        lines += [macro_text(LR, "no_sensitivity", missing=missing), ""]
    return lines
