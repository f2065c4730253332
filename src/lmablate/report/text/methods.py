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
                     "was chosen](#how-the-learning-rate-was-chosen))")
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
    parts = (["the validation loss (text)"] if kinds - {"arithmetic"} else []) + (
        ["the answer loss of the validation problems (arithmetic: nats per answer character, "
         "the metric of its verdicts)"] if "arithmetic" in kinds else [])
    return " and ".join(parts)


def methods_section(cfg: StudyConfig, ablation: pd.DataFrame,
                    environment: Mapping[str, Any] | None, datasets: Sequence[str],
                    order: Sequence[str]) -> list[str]:
    """The Markdown lines of "Methodology" (its heading is the template's): the study's
    design in prose (datasets, seeds, baseline and variants, the compute budget and FLOPs
    formula of Kaplan et al. 2020, the tuning protocol, the training settings), the table of
    what each final run spent (:func:`_compute_table`: width, steps, tokens, training FLOPs
    and their share of the budget, for ``datasets`` x ``order``), the statistics used, and
    the machine (``environment``: free-form facts; ``hardware``/``device`` and
    ``torch``/``torch_version`` are used in the prose, every key is listed)."""
    tr, tu, m, ev = cfg.train, cfg.tune, cfg.model, cfg.evaluate
    kinds = ", ".join(f"{name} ({d.kind})" for name, d in cfg.datasets.items())
    changes = [f"{v}: " + ", ".join(f"{k}={val}" for k, val in cfg.variants[v].items())
               for v in cfg.study_variants if cfg.variants.get(v)]
    budgets = ", ".join(f"{name} " + ", ".join(f"{b:.3g}" for b in cfg.budgets(name))
                        for name in cfg.datasets)
    text = (
        (f"Each of {len(cfg.study_variants)} variants was" if len(cfg.study_variants) > 1
         else f"The one variant, {cfg.study_variants[0]}, was") + " trained on each of "
        f"{len(cfg.datasets)} datasets ({kinds}) with {len(cfg.seeds)} seeds "
        f"({', '.join(map(str, cfg.seeds))}); the same seeds are used for every variant, so "
        f"results can be paired by seed. "
        f"The baseline is a {m.n_layers}-layer GPT with {m.n_heads} heads, {m.ffn} "
        f"feed-forward, {m.norm_placement}-{m.norm}, {m.position} positions and a context of "
        f"{m.context_length} characters{_own_windows(cfg)}" + (
            f"; the variants change {'; '.join(changes)}. "
                                            if changes else ". ") +
        f"Every final run of a dataset spends the same training compute (FLOPs: {budgets}; "
        f"6 N + 6 n_layers n_ctx d_model per token, Kaplan et al. 2020), so its number of "
        f"optimizer steps of {tr.batch_size} sequences x {m.context_length} tokens (or the "
        f"dataset's own) follows "
        f"from its width. "
        f"Before training, the learning rate (log-uniform in [{tu.lr_low:g}, {tu.lr_high:g}], "
        f"extended by 10x past an edge within [{tu.lr_limits[0]:g}, {tu.lr_limits[1]:g}]) and "
        f"d_model ({_widths_text(tu)}) were tuned per dataset x variant by successive halving "
        f"with Optuna: {_rungs_text(tu)}; every trial below the full budget on seed "
        f"{tu.seed} (not a final seed), "
        f"objective {_objective_text(cfg)} at the end of the trial; the first "
        f"{tu.trials_per_batch} configurations are the same for every variant, "
        f"{tu.trials_per_batch} learning rates evenly spaced in log over the range at the "
        f"width nearest {math.sqrt(tu.tokens_per_parameter[0] * tu.tokens_per_parameter[1]):g}"
        f" training tokens per parameter (the design of the learning-rate sensitivity), the "
        f"rest of the first rung proposed by TPE with each study's own seed (sampler seed "
        f"{tu.sampler_seed}); the tuned values (per variant below) replace the configured "
        f"learning rate {tr.lr:g} and width {m.d_model}. "
        f"Each run then trained with a {tr.lr_schedule} learning-rate "
        f"schedule warming up over {tr.warmup_fraction:.0%} of its steps, weight decay "
        f"{tr.weight_decay:g}, "
        f"betas ({tr.beta1:g}, {tr.beta2:g}), gradient clipping at {tr.grad_clip:g}, "
        f"validation every {tr.eval_interval} steps over {tr.eval_iters} batches. "
        f"Test loss is measured on up to {ev.max_batches} batches of held-out data; arithmetic "
        f"answers are greedy-decoded for up to {ev.max_problems} test problems."
    )
    if cfg.match_params:
        text += (" Each variant's feed-forward width was adjusted so that its non-embedding "
                 "parameter count matches the baseline's at the same d_model.")
    stats_text = (
        f"Statistics: each table gives the mean over seeds ± the half-width of its "
        f"{CONFIDENCE:.0%} Student-t interval. Variants are compared with the baseline by a "
        f"two-sided paired t-test on the per-seed differences (scipy.stats.ttest_rel); the "
        f"p-values of all variants within a dataset x metric are corrected with Holm's method "
        f"(statsmodels multipletests) at a family-wise α = {ALPHA}. Next to the raw "
        f"{CONFIDENCE:.0%} interval of Δ stands its Holm-adjusted interval, the t-interval at "
        f"level 1 − α·p/p_Holm, which excludes 0 exactly when the verdict is better or worse. "
        f"A difference that is the same on every seed has no spread to test against: it is "
        f"reported as \"{VERDICT_IDENTICAL}\", without a p-value. MDE, one per comparison, is "
        f"the smallest true difference its paired t-test would detect with {POWER:.0%} power "
        f"at its observed SD of the differences and Holm's strictest level α/m (statsmodels "
        f"TTestPower). With "
        f"fewer than {MIN_SEEDS_FOR_TEST} paired seeds no test is run. Arithmetic answers are "
        f"also compared problem by problem (sign-flip permutation test over the same test "
        f"problems, Holm-corrected), a diagnostic whose p-values treat the problems as "
        f"independent, not a verdict. Reference points come from the data: n-gram "
        f"cross-entropies of the test split under train-split counts, and scores of answers "
        f"that ignore the question."
    )
    lines = [text, "",
             "**Compared at equal training compute.** Within a dataset every final run spends "
             "the same training FLOPs (`train.budget_flops`); each variant's width was tuned, "
             "and its step count follows from that width, so a narrower model trains more "
             "steps:", "", _compute_table(cfg, ablation, datasets, order), "",
             stats_text, ""]
    env = dict(environment or {})
    hardware = next((env[k] for k in ("hardware", "device", "gpu", "cpu") if env.get(k)), None)
    torch_v = next((env[k] for k in ("torch", "torch_version") if env.get(k)), None)
    total = ablation["train_seconds"].sum(min_count=1)
    if hardware or torch_v:
        sentence = (f"Runs executed on {hardware or 'unrecorded hardware'} with torch "
                    f"{torch_v or '(version not recorded)'}")
    else:
        sentence = "Environment not recorded"
    if pd.notna(total):
        sentence += (f"; training took {total:,.1f} s in total over {len(ablation)} runs "
                     f"(sum of train_seconds)")
    lines += [sentence + ".", ""]
    if env:
        lines += ["Environment:", ""]
        for key, value in env.items():
            if isinstance(value, Mapping):
                value = ", ".join(f"{k}={_env_value(v)}" for k, v in value.items())
            lines.append(f"- {key}: {_env_value(value)}")
        lines.append("")
    return lines


def _env_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.1f}" if abs(v) >= 10 else f"{v:.3g}"
    return str(v)
