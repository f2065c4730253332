"""The report's "How each variant responds to the learning rate", per dataset: the learning-rate
sensitivity (:func:`lmablate.report.stats.sensitivity.lr_sensitivity`, Wortsman et al. 2023,
sec. 2.2) and what tuning chose (best.json), from ``lr_sensitivity.csv``, ``tuned.csv`` and the
trials. Losses in nats/char; the words are ``_lr.md.j2``'s.
"""

from __future__ import annotations

from typing import Any, Sequence

import pandas as pd

from lmablate.config.study import StudyConfig
from lmablate.report.stats.sensitivity import design_is_shared, width_summary
from lmablate.report.text.mdtable import missing
from lmablate.report.text.templating import macro_text

LR = "_lr.md.j2"  # the section's sentences and table


def _rows(sens: pd.DataFrame, tuned: pd.DataFrame, widths: pd.DataFrame,
          order: Sequence[str]) -> list[dict[str, Any]]:
    """A row per variant of ``sens`` or ``tuned`` (one dataset), None for a missing value;
    ``ratio``: tokens per parameter of the tuned width (``widths``:
    :func:`~lmablate.report.stats.sensitivity.width_summary`)."""
    ratios = {int(r.d_model): r.tokens_per_parameter for r in widths.itertuples()}
    rows = []
    for variant in order:
        s, t = sens[sens["variant"] == variant], tuned[tuned["variant"] == variant]
        if s.empty and t.empty:
            continue
        s, t = (x.iloc[0] if len(x) else {} for x in (s, t))
        r = {k: None if missing(x.get(c)) else x.get(c) for k, x, c in (
            ("n", s, "n_design"), ("best", s, "best_design_lr"), ("lr", t, "lr"),
            ("width", t, "d_model"), ("full", t, "full_budget"))}
        ratio = None if r["width"] is None else ratios.get(int(r["width"]))
        rows.append(dict(r, variant=variant, sensitivity=s.get("lr_sensitivity"),
                         diverged=s.get("n_design_diverged"), extended=t.get("extended"),
                         on_edge=t.get("on_edge"), ratio=None if missing(ratio) else ratio))
    return rows


def lr_section(cfg: StudyConfig, sensitivity: pd.DataFrame, tuned: pd.DataFrame,
               trials: pd.DataFrame, dataset: str, order: Sequence[str],
               has_figure: bool = False) -> list[str]:
    """The lines below the section's heading: the dataset's design and L0 (S is defined in
    ``_tuning.md.j2``), a row per variant (S, design points, best design lr, tuned values and
    flags) and the variants without S; none without a sensitivity row or a figure."""
    sens = sensitivity[sensitivity["dataset"] == dataset] if len(sensitivity) else sensitivity
    if sens.empty and not has_figure:
        return []
    tu = cfg.tune
    design = sens.dropna(subset=["design_d_model"])
    l0 = sens["uniform_loss"].dropna()
    lines = [macro_text(
        LR, "design", n=int(design["n_design"].max()) if len(design) else tu.trials_per_batch,
        tu=tu, width=", ".join(str(int(w)) for w in pd.unique(design["design_d_model"])) or "–",
        ratio=", ".join(f"{x:.3g}" for x in
                        pd.unique(design["design_tokens_per_parameter"].dropna())),
        fraction=", ".join(f"{x:g}" for x in pd.unique(design["budget_fraction"].dropna()))
        or f"{tu.rungs[0][1]:g}", l0=float(l0.iloc[0]) if len(l0) else None,
        shared=design_is_shared(trials, dataset)), ""]
    lines += macro_text(LR, "table", rows=_rows(
        sens, tuned[tuned["dataset"] == dataset] if len(tuned) else tuned,
        width_summary(trials[trials["dataset"] == dataset] if len(trials) else trials),
        order)).split("\n")
    missing_s = [(r.variant, r.note) for r in sens.itertuples()
                 if isinstance(r.note, str) and r.note]
    return lines + ([macro_text(LR, "no_sensitivity", missing=missing_s), ""] if missing_s else [])
