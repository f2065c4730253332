"""The report's "Methodology": what was trained, at what compute, tuned how, tested how, and on
what machine, from the config, the ablation table and the recorded environment.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import pandas as pd

from lmablate.config.study import StudyConfig
from lmablate.report.stats.statistics import (ALPHA, CONFIDENCE, MIN_SEEDS_FOR_TEST, POWER,
                                          VERDICT_IDENTICAL)
from lmablate.report.text.mdtable import integer, md_table
from lmablate.report.text.templating import macro_text

METHODS = "_methods.md.j2"  # the sentences of "Methodology"


def _compute_table(cfg: StudyConfig, ablation: pd.DataFrame, datasets: Sequence[str],
                   order: Sequence[str]) -> str:
    """Per dataset x variant: tuned width, steps, tokens and training FLOPs of its final runs,
    and those FLOPs as a share of the dataset's budget."""
    rows = []
    for ds in datasets:
        budget = cfg.headline_budget(ds) if ds in cfg.train.budget_flops else None
        for variant in order:
            v = ablation[(ablation["dataset"] == ds) & (ablation["variant"] == variant)]
            if v.empty:
                continue
            flops = v["train_flops"].dropna()
            rows.append({
                "dataset": ds, "variant": variant,
                "d_model": ", ".join(integer(x) for x in v["d_model"].dropna().unique()) or "–",
                "steps": ", ".join(integer(x) for x in v["steps"].dropna().unique()) or "–",
                "tokens": integer(v["tokens"].max()),
                "training FLOPs": f"{flops.max():.3g}" if len(flops) else "–",
                "of budget": (f"{flops.max() / budget:.1%}" if len(flops) and budget else "–"),
            })
    return md_table(pd.DataFrame(rows)) if rows else "_No runs._"


def _settings(cfg: StudyConfig, ablation: pd.DataFrame,
              environment: Mapping[str, Any] | None) -> dict[str, Any]:
    """The values the template does not take from the config itself."""
    tu = cfg.tune
    own = [(name, cfg.for_dataset(name).model.context_length,
            cfg.for_dataset(name).train.batch_size) for name, d in cfg.datasets.items()
           if d.context_length is not None or d.batch_size is not None]
    kinds = {d.kind for d in cfg.datasets.values()}
    env = dict(environment or {})
    shown = {"hardware", "device", "gpu", "torch", "torch_version"}  # in the machine row
    total = ablation["train_seconds"].sum(min_count=1)
    return {
        "kinds": [f"{name} ({d.kind})" for name, d in cfg.datasets.items()],
        "changes": [f"{v}: " + ", ".join(f"{k}={val}" for k, val in cfg.variants[v].items())
                    for v in cfg.study_variants if cfg.variants.get(v)],
        "budgets": [f"{name} " + ", ".join(f"{b:.3g}" for b in cfg.budgets(name))
                    for name in cfg.datasets],
        "middle": math.sqrt(tu.tokens_per_parameter[0] * tu.tokens_per_parameter[1]),
        "own": own, "text": bool(kinds - {"arithmetic"}), "arithmetic": "arithmetic" in kinds,
        "hardware": next((env[k] for k in ("hardware", "device", "gpu", "cpu") if env.get(k)),
                         None),
        "torch": next((env[k] for k in ("torch", "torch_version") if env.get(k)), None),
        "train_seconds": None if pd.isna(total) else float(total), "n_runs": len(ablation),
        "facts": [f"{key}: " + (", ".join(f"{k}={_env_value(v)}" for k, v in value.items())
                                if isinstance(value, Mapping) else _env_value(value))
                  for key, value in env.items() if key not in shown],
        "confidence": CONFIDENCE, "alpha": ALPHA, "power": POWER, "identical": VERDICT_IDENTICAL,
        "min_seeds": MIN_SEEDS_FOR_TEST}


def methods_section(cfg: StudyConfig, ablation: pd.DataFrame,
                    environment: Mapping[str, Any] | None, datasets: Sequence[str],
                    order: Sequence[str]) -> list[str]:
    """The Markdown lines of "Methodology" (the words are ``_methods.md.j2``'s): the study's
    design as a table (the FLOPs formula of Kaplan et al. 2020; the machine from
    ``environment``: ``hardware``/``device`` and ``torch``/``torch_version``, then every other
    key), then each final run's width, steps, tokens, training FLOPs and share of the budget
    (``datasets`` x ``order``)."""
    settings = dict(_settings(cfg, ablation, environment),
                    compute=_compute_table(cfg, ablation, datasets, order))
    return macro_text(METHODS, "methods", cfg=cfg, tr=cfg.train, tu=cfg.tune, m=cfg.model,
                      ev=cfg.evaluate, s=settings).split("\n")


def _env_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.1f}" if abs(v) >= 10 else f"{v:.3g}"
    return str(v)
