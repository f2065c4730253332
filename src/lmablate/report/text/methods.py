"""The report's "Methodology": what was trained, at what compute, tuned how, tested how, and on
what machine. Every value comes from the config, the ablation table or the environment the
report stage records; none is typed by hand.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import pandas as pd

from lmablate.config.study import StudyConfig
from lmablate.report.stats.statistics import (ALPHA, CONFIDENCE, MIN_SEEDS_FOR_TEST, POWER,
                                          VERDICT_IDENTICAL)
from lmablate.report.text.mdtable import integer, md_table, tuning_seeds


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


def _rungs_text(tu) -> str:
    """``tune.rungs`` in words: "8 configurations at 0.125 of the budget, then the full-budget
    bracket: 3 learning rates 2x apart ..."."""
    parts = [f"{tu.rungs[0][0]} configurations at {tu.rungs[0][1]:g} of the budget"]
    parts += [f"the best {n} at {f:g}" for n, f in tu.rungs[1:-1]]
    if len(tu.rungs) > 1:
        parts.append(f"the full-budget bracket on {tuning_seeds(tu)} ([How the learning rate "
                     "was chosen](appendix.md#how-the-learning-rate-was-chosen))")
    return ", then ".join(parts)


def _own_windows(cfg: StudyConfig) -> str:
    """The datasets whose models see other windows than ``model``/``train`` give
    (``datasets.<name>.context_length``, ``batch_size``), e.g. " (arithmetic: 16 characters
    in batches of 64 sequences)"; empty when none does."""
    own = []
    for name, ds in cfg.datasets.items():
        if ds.context_length is None and ds.batch_size is None:
            continue
        mine = cfg.for_dataset(name)
        own.append(f"{name}: {mine.model.context_length} characters in batches of "
                   f"{mine.train.batch_size} sequences")
    return f" ({'; '.join(own)})" if own else ""


def _widths_text(tu) -> str:
    """The widths searched, in words."""
    if tu.d_model_choices is not None:
        return "one of " + ", ".join(map(str, tu.d_model_choices))
    low, high = tu.tokens_per_parameter
    return (f"{tu.n_widths} multiples of 2 n_heads with {low:g} to {high:g} training tokens per "
            "non-embedding parameter at the budget (Hoffmann et al. 2022), extended by a step "
            "past an edge")


def _objective_text(cfg: StudyConfig) -> str:
    """What the trials were ranked by, per kind of dataset in the study
    (:func:`lmablate.evaluate.answer_probe.objective_name`)."""
    kinds = {d.kind for d in cfg.datasets.values()}
    answer = ("the mean over the trial's evaluations of the answer loss of the validation "
              "problems (arithmetic: nats per answer character; the area under its curve)"
              if cfg.tune.arithmetic_objective == "mean" else
              "the answer loss of the validation problems at the end of the trial (arithmetic: "
              "nats per answer character, the metric of its verdicts)")
    parts = (["the validation loss at the end of the trial (text)"] if kinds - {"arithmetic"} else []) + (
        [answer] if "arithmetic" in kinds else [])
    return " and ".join(parts)


def methods_section(cfg: StudyConfig, ablation: pd.DataFrame,
                    environment: Mapping[str, Any] | None, datasets: Sequence[str],
                    order: Sequence[str]) -> list[str]:
    """The Markdown lines of "Methodology" (its heading is the template's): a two-column
    table of the study's design (datasets, seeds, baseline and variants, the compute budget
    and FLOPs formula of Kaplan et al. 2020, the tuning protocol, the training settings, the
    statistics, the machine: ``environment``'s free-form facts, ``hardware``/``device`` and
    ``torch``/``torch_version`` first, then every key), then the table of what each final run
    spent (:func:`_compute_table`: width, steps, tokens, training FLOPs and their share of the
    budget, for ``datasets`` x ``order``)."""
    tr, tu, m, ev = cfg.train, cfg.tune, cfg.model, cfg.evaluate
    kinds = ", ".join(f"{name} ({d.kind})" for name, d in cfg.datasets.items())
    changes = [f"{v}: " + ", ".join(f"{k}={val}" for k, val in cfg.variants[v].items())
               for v in cfg.study_variants if cfg.variants.get(v)]
    budgets = ", ".join(f"{name} " + ", ".join(f"{b:.3g}" for b in cfg.budgets(name))
                        for name in cfg.datasets)
    middle = math.sqrt(tu.tokens_per_parameter[0] * tu.tokens_per_parameter[1])
    rows = [
        ("design", (f"{len(cfg.study_variants)} variants" if len(cfg.study_variants) > 1
                    else f"1 variant ({cfg.study_variants[0]})")
         + f" x {len(cfg.datasets)} datasets "
         f"({kinds}) x {len(cfg.seeds)} seeds ({', '.join(map(str, cfg.seeds))}); the same "
         "seeds for every variant, so results pair by seed"),
        ("baseline", f"a {m.n_layers}-layer GPT with {m.n_heads} heads, {m.ffn} feed-forward, "
         f"{m.norm_placement}-{m.norm}, {m.position} positions and a context of "
         f"{m.context_length} characters{_own_windows(cfg)}"),
        ("variants", "; ".join(changes) or "–"),
        ("compute", f"the same training FLOPs for every final run of a dataset (FLOPs: "
         f"{budgets}; 6 N + 6 n_layers n_ctx d_model per token, Kaplan et al. 2020): the "
         f"optimizer steps of {tr.batch_size} sequences x {m.context_length} tokens (or the "
         "dataset's own) follow from the tuned width"
         + ("; each variant's feed-forward width set so that its non-embedding parameters "
            "match the baseline's at the same d_model" if cfg.match_params else "")),
        ("tuning", f"learning rate (log-uniform in [{tu.lr_low:g}, {tu.lr_high:g}], extended "
         f"by 10x past an edge within [{tu.lr_limits[0]:g}, {tu.lr_limits[1]:g}]) and d_model "
         f"({_widths_text(tu)}) per dataset x variant, by successive halving with Optuna: "
         f"{_rungs_text(tu)}; every trial below the full budget on seed {tu.seed} (not a "
         f"final seed); objective {_objective_text(cfg)}; the first "
         f"{tu.trials_per_batch} configurations shared by every variant, {tu.trials_per_batch} "
         f"learning rates evenly spaced in log over the range at the width nearest "
         f"{middle:g} training tokens per parameter, the rest proposed by TPE (sampler seed "
         f"{tu.sampler_seed}); the tuned values replace the configured learning rate "
         f"{tr.lr:g} and width {m.d_model}"),
        ("training", f"AdamW, {tr.lr_schedule} schedule with {tr.warmup_fraction:.0%} warm-up, "
         f"weight decay {tr.weight_decay:g}, betas ({tr.beta1:g}, {tr.beta2:g}), gradient "
         f"clipping at {tr.grad_clip:g}; validation every {tr.eval_interval} steps over "
         f"{tr.eval_iters} batches"),
        ("evaluation", f"test loss on up to {ev.max_batches} batches of held-out data; "
         f"arithmetic answers greedy-decoded for up to {ev.max_problems} test problems; "
         "reference points from the data (n-gram cross-entropies of the test split under "
         "train-split counts, scores of answers that ignore the question)"),
        ("statistics", f"mean over seeds ± the half-width of its {CONFIDENCE:.0%} Student-t "
         "interval; each variant against the baseline by a two-sided paired t-test on the "
         "per-seed differences (scipy.stats.ttest_rel), Holm-corrected over a dataset x "
         f"metric (statsmodels multipletests) at family-wise α = {ALPHA}, with the "
         "Holm-adjusted interval (the t-interval at level 1 − α·p/p_Holm, which excludes 0 "
         f"exactly when the verdict is better or worse); a difference the same on every seed "
         f"is \"{VERDICT_IDENTICAL}\", untested; MDE at {POWER:.0%} power, Holm's α/m "
         f"(statsmodels TTestPower); no test below {MIN_SEEDS_FOR_TEST} paired seeds"),
    ]
    env = dict(environment or {})
    hardware = next((env[k] for k in ("hardware", "device", "gpu", "cpu") if env.get(k)), None)
    torch_v = next((env[k] for k in ("torch", "torch_version") if env.get(k)), None)
    total = ablation["train_seconds"].sum(min_count=1)
    machine = (f"{hardware or 'unrecorded hardware'}, torch {torch_v or '(not recorded)'}"
               if hardware or torch_v else "not recorded")
    if pd.notna(total):
        machine += (f"; {total:,.1f} s of training summed over the {len(ablation)} runs (runs "
                    "in parallel overlap, so the study's wall time is shorter)")
    rows.append(("machine", machine))
    shown = {"hardware", "device", "gpu", "torch", "torch_version"}  # in the machine row
    facts = [f"{key}: " + (", ".join(f"{k}={_env_value(v)}" for k, v in value.items())
                           if isinstance(value, Mapping) else _env_value(value))
             for key, value in env.items() if key not in shown]
    if facts:
        rows.append(("environment", "; ".join(facts)))
    table = md_table(pd.DataFrame(rows, columns=["aspect", "setting"]))
    return [table, "",
            "**Compared at equal training compute.** Within a dataset every final run spends "
            "the same training FLOPs (`train.budget_flops`); its step count follows from its "
            "tuned width, so a narrower model trains more steps:", "",
            _compute_table(cfg, ablation, datasets, order), ""]


def _env_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.1f}" if abs(v) >= 10 else f"{v:.3g}"
    return str(v)
