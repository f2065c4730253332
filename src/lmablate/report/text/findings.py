"""The report's opening section, "Findings": the study's answer, then what it could not decide.

Per dataset, in the dataset's headline loss (:func:`lmablate.report.headline.headline_loss`):

* one sentence per variant: its verdict against the baseline (paired by seed, Holm-corrected,
  :func:`lmablate.report.stats.statistics.compare`) with the effect, its raw and Holm-adjusted
  intervals, a caveat in the same sentence where the variant or the baseline is not below the
  trigram reference of the data (:func:`trigram_reference`, :func:`reference_caveat`);
* with replicates of the study, which verdicts every replicate gave alike, one line for each
  that did not replicate, and the verdicts combined over replicates
  (:mod:`lmablate.report.stats.replication`);
* the one figure that shows them (the forest plot of the headline loss), placed by the report
  template after the dataset's lines;
* what the study could not decide and what would decide it: for every "no significant
  difference", the seeds a paired t-test would need to detect a true difference as large as
  the observed one, at the observed seed-to-seed spread (:func:`seeds_needed`), and that
  comparison's minimum detectable effect (``comparisons.csv``'s ``mde``, the number of the
  comparison table's MDE column);
* the training and evaluation facts the verdicts rest on: validation loss still falling at the
  end of training (:func:`lmablate.report.stats.convergence.convergence_table`), the loss past the training context and exact
  match past the trained operand length.

Diagnostics are not findings: the one-batch gradient shares of ``grad_flow.csv``
(:func:`lmablate.report.tables.gradient_table`) and the attention maps appear only as
labelled figures further down the report.

Every number comes from a table the report stage also writes as CSV (``comparisons.csv``,
``references.csv``, ``replication.csv``, ``convergence.csv``, ``extrapolation.csv``,
``length_generalisation.csv``), so a sentence here can be checked against its row there.
:func:`verdict_lines` gives the same verdicts as a few console lines, printed at the end of the
report stage. Units: losses in nats/char (the answer loss per answer character), accuracies as
fractions.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from lmablate.report.collect import BASELINE, present
from lmablate.report.headline import headline_loss
from lmablate.report.stats.learning_speed import speed_lines
from lmablate.report.stats.scaling import (SCALING_TITLE, TREND_FEW, TREND_GROWS, TREND_NONE,
                                      TREND_SHRINKS)
from lmablate.report.stats.statistics import (ALPHA, METRICS, POWER, VERDICT_BETTER, VERDICT_FEW,
                                          VERDICT_IDENTICAL, VERDICT_NSD,
                                          VERDICT_UNDECIDED_TUNING, VERDICT_WORSE)
from lmablate.report.stats.success import success_lines
from lmablate.report.stats.replication import JOIN
from lmablate.report.stats.convergence import CONVERGENCE_COLUMNS, TAIL
from lmablate.report.text.limits import TRIGRAM, trigram_reference
from lmablate.report.text.mdtable import join_names as _names

MAX_SEEDS = 1000  # past this, "more than 1,000 seeds": the difference is lost in the spread


def _signed(x: float, digits: int = 3) -> str:
    """``+0.062`` / ``-0.126``: an effect with its sign always shown."""
    return f"{x:+.{digits}f}"


def seeds_needed(mean_diff: float, sd_diff: float, n_compared: int, alpha: float = ALPHA,
                 power: float = POWER, cap: int = MAX_SEEDS) -> int | None:
    """Paired seeds a two-sided paired t-test needs to detect a true difference of
    ``|mean_diff|`` with probability ``power`` when the per-seed differences have SD
    ``sd_diff``, at Holm's strictest level ``alpha / n_compared`` (the level of the study's
    minimum detectable effect, :func:`lmablate.report.stats.statistics.min_detectable_effect`).

    Solved from the noncentral t power function (``statsmodels.stats.power.TTestPower``;
    Cohen 1988, ch. 2) for the smallest whole number of pairs, at least 2. None when the
    question has no answer: a zero or missing difference or spread, or more than ``cap`` seeds
    needed (the difference is lost in the seed spread). Same unit for both arguments.
    """
    if not (np.isfinite(mean_diff) and np.isfinite(sd_diff)) or mean_diff == 0 or sd_diff <= 0:
        return None
    from statsmodels.stats.power import TTestPower  # imported on use: only the report needs it
    effect, level = abs(mean_diff) / sd_diff, alpha / max(n_compared, 1)

    def reached(n: int) -> bool:  # False where statsmodels' noncentral t gives NaN
        return bool(TTestPower().power(effect_size=effect, nobs=n, alpha=level,
                                       alternative="two-sided") >= power)
    try:  # the real-valued answer, then the whole number next to it (power grows with n)
        guess = float(TTestPower().solve_power(effect_size=effect, nobs=None, alpha=level,
                                               power=power, alternative="two-sided"))
    except (ValueError, RuntimeError):
        guess = math.nan
    if not math.isfinite(guess) or guess > cap + 1:
        return None
    n = max(2, math.ceil(guess - 1e-9))
    while n > 2 and reached(n - 1):
        n -= 1
    while n <= cap and not reached(n):
        n += 1
    return n if n <= cap else None


def reference_caveat(variant: str, variant_mean: float, baseline_mean: float,
                     trigram: float | None, unit: str, short: bool = False) -> str:
    """Which side of a comparison is not below the trigram reference ``trigram`` (same unit as
    the means: nats/char), as a clause for the verdict's own sentence; "" when both are below
    it or there is no reference. ``short``: the console form, e.g. ``neither past the trigram
    2.159``."""
    if trigram is None or not math.isfinite(trigram):
        return ""
    above = [name for name, x in ((variant, variant_mean), (BASELINE, baseline_mean))
             if pd.notna(x) and float(x) >= trigram]
    if not above:
        return ""
    if short:
        who = "neither" if len(above) == 2 else f"{above[0]} not"
        return f"{who} past the {TRIGRAM} {trigram:.3f}"
    ref = f"the {TRIGRAM} reference, {trigram:.3f} {unit}"
    if len(above) == 2:
        return (f"neither model is past {ref}: the comparison is between models that have "
                f"learned little more than {TRIGRAM} counts")
    other = BASELINE if above[0] == variant else variant
    return (f"{above[0]} is not past {ref}, {other} is: one side of the comparison has learned "
            f"little more than {TRIGRAM} counts")


def _effect(row: pd.Series, unit: str, trigram: float | None = None) -> str:
    """One variant's verdict against the baseline as a sentence; a verdict string this module
    does not know is stated as it is, never as better or worse."""
    v, d, verdict = row["variant"], float(row["mean_diff"]), str(row["verdict"])
    caveat = reference_caveat(v, row["variant_mean"], row["baseline_mean"], trigram, unit)
    caveat = f" ({caveat})" if caveat else ""
    base = float(row["baseline_mean"])
    share = f"{d / abs(base):+.1%} of the baseline's; " if base and math.isfinite(base) else ""
    means = f"{share}{row['variant_mean']:.3f} against {row['baseline_mean']:.3f}"
    raw = f"95% CI [{row['ci95_low']:.3f}, {row['ci95_high']:.3f}]"
    if verdict in (VERDICT_BETTER, VERDICT_WORSE):
        text = (f"**{v}: {verdict}**{caveat}, {_signed(d)} {unit} ({means}; {raw}, "
                f"Holm-adjusted [{row['ci_holm_low']:.3f}, {row['ci_holm_high']:.3f}]).")
        return text
    if verdict == VERDICT_UNDECIDED_TUNING:
        u = row.get("tuning_uncertainty")
        inside = ("its tuning uncertainty was not measured" if u is None or pd.isna(u) else
                  f"it is within the larger of the two variants' tuning uncertainties, "
                  f"{float(u):.3f} {unit}, so a missed learning rate could explain it")
        return (f"{v}: undecided (tuning){caveat}, {_signed(d)} {unit} ({means}; {raw}, "
                f"Holm-adjusted [{row['ci_holm_low']:.3f}, {row['ci_holm_high']:.3f}]): "
                f"significant over seeds, but {inside}.")
    if verdict == VERDICT_IDENTICAL:
        return f"{v}: identical on every seed{caveat} ({_signed(d)} {unit})."
    if verdict == VERDICT_FEW:
        return (f"{v}: not tested{caveat}, only {int(row['n_pairs'])} seed(s) pair with the "
                f"baseline ({_signed(d)} {unit}).")
    return f"{v}: {verdict}{caveat}, {_signed(d)} {unit} ({means}; {raw})."


def _undecided(c: pd.DataFrame, unit: str) -> list[str]:
    """What would decide each "no significant difference": seeds needed at the observed spread,
    and that comparison's MDE (its ``mde``, as in the comparison table)."""
    nsd = c[c["verdict"] == VERDICT_NSD]
    if nsd.empty:
        return []
    m = int(c["p_value"].notna().sum())  # the Holm family: every comparison with a test
    n = int(nsd["n_pairs"].max())
    parts = []
    for r in nsd.itertuples():
        need = seeds_needed(r.mean_diff, r.sd_diff, m)
        parts.append(f"{r.variant} about {need:,}" if need is not None else
                     f"{r.variant} more than {MAX_SEEDS:,}")
        parts[-1] += (f" (Δ {_signed(r.mean_diff)}, SD of the per-seed differences "
                      f"{r.sd_diff:.3f}, MDE {r.mde:.3f} {unit})")
    return [f"- **Too few seeds to decide: {_names(list(nsd['variant']))}.** Paired seeds "
            f"that would detect a true difference as large as the observed one ({POWER:.0%} "
            f"power, Holm's α/{m}, at the observed spread): {'; '.join(parts)}; the study has "
            f"{n} ([MDE](#how-to-read-this-report))."]


def _replication(replication: pd.DataFrame | None, dataset: str, unit: str) -> list[str]:
    """With replicates: the verdicts every replicate gave alike, one line for each that did not
    replicate, and the combined verdicts whose intervals count the tuning draw
    (:func:`~lmablate.report.stats.replication.combine_replicates`)."""
    if replication is None or replication.empty:
        return []
    r = replication[replication["dataset"] == dataset]
    if r.empty:
        return []
    k = int(r["replicates"].max())
    lines = []
    same = r[r["agree"]]
    if len(same):
        lines.append(f"- **Replicated in all {k} replicates:** " + "; ".join(
            f"{x.variant} ({x.verdicts.split(JOIN)[0]})" for x in same.itertuples()) + ".")
    for x in r[~r["agree"]].itertuples():
        lines.append(f"- **Not replicated: {x.variant}.** Its verdicts in the {k} replicates: "
                     f"{x.verdicts}.")
    combined = "; ".join(
        f"{x.variant} {x.verdict}, {_signed(x.mean_diff)} [{x.ci_holm_low:.3f}, "
        f"{x.ci_holm_high:.3f}]" if pd.notna(x.ci_holm_low) else f"{x.variant} {x.verdict}"
        for x in r.itertuples())
    lines.append(f"- **Over all {k} replicates** (each replicate's mean Δ, a t-interval with "
                 f"{k - 1} degree{'s' * (k != 2)} of freedom that counts the tuning draw, "
                 f"Holm-adjusted; {unit}): {combined}.")
    return lines


def _speed_replication(speed: pd.DataFrame | None, dataset: str) -> list[str]:
    """With replicates: each learning-speed verdict that did not replicate, one line each, and
    the combined ratios of tokens to learn whose intervals count the tuning draw
    (:func:`~lmablate.report.stats.replication.combine_speed`)."""
    s = speed[speed["dataset"] == dataset] if speed is not None and len(speed) else None
    if s is None or s.empty:
        return []
    k = int(s["replicates"].max())
    lines = [f"- **Learning speed not replicated: {x.variant}.** Its verdicts in the {k} "
             f"replicates: {x.verdicts} (ratios {x.ratios})." for x in s[~s["agree"]].itertuples()]
    combined = "; ".join(
        f"{x.variant} {x.verdict}, {x.ratio:.2f} [{x.ratio_holm_low:.2f}, "
        f"{x.ratio_holm_high:.2f}]" if pd.notna(x.ratio_holm_low) else f"{x.variant} {x.verdict}"
        for x in s.itertuples())
    lines.append(f"- **Learning speed over all {k} replicates** (the ratio of tokens to learn, "
                 f"variant / baseline, Holm-adjusted, counting the tuning draw): {combined}.")
    return lines


def _convergence(conv: pd.DataFrame, dataset: str) -> list[str]:
    """Still-falling curves: every seed of every variant fell over the last part of training."""
    c = conv[conv["dataset"] == dataset]
    if c.empty:
        return []
    falling = c[c["seeds_falling"] == c["seeds"]]
    if falling.empty:
        return [f"- Validation loss had levelled off: over the last {TAIL:.0%} of training no "
                "variant fell on every seed."]
    who = ("every variant" if len(falling) == len(c)
           else _names(list(map(str, falling["variant"]))))
    return [f"- **Validation loss was still falling when training stopped** for {who}: over "
            f"the last {TAIL:.0%} of training (from step {int(falling['from_step'].min()):,}) "
            f"it fell on every seed, by {falling['drop'].min():.3f} to "
            f"{falling['drop'].max():.3f} nats/char. More compute would lower these losses; "
            "whether the ranking holds at a larger budget is not measured here."]


def _extrapolation(table: pd.DataFrame, dataset: str, positions: Mapping[str, str]) -> list[str]:
    """The loss from 1x to the longest context each variant ran at, per position scheme."""
    e = table[(table["dataset"] == dataset) & table["mean"].notna()]
    if e.empty or e["factor"].max() <= 1:
        return []
    parts, fixed = [], []
    for variant, d in e.groupby("variant", observed=True, sort=False):
        d = d.sort_values("factor")
        if len(d) < 2:
            fixed.append(str(variant))
            continue
        a, b = d.iloc[0], d.iloc[-1]
        scheme = positions.get(str(variant), "")
        named = f"{variant} ({scheme})" if scheme and scheme != str(variant) else str(variant)
        parts.append(f"{named} "
                     f"{'rises' if b['mean'] > a['mean'] else 'falls'} from {a['mean']:.3f} at "
                     f"{int(a['factor'])}x to {b['mean']:.3f} at {int(b['factor'])}x")
    if not parts:
        return []
    tail = (f"; {_names(fixed)} cannot run past the context (a learned table of positions)"
            if fixed else "")
    return [f"- **Past the training context** the test loss of {'; '.join(parts)}{tail}."]


def _length(length: pd.DataFrame, dataset: str) -> list[str]:
    """Exact match at the longest trained operand length against the lengths past it."""
    d = length[(length["dataset"] == dataset) & length["mean"].notna()]
    trained, longer = d[d["split"] == "test"], d[d["split"] != "test"]
    if trained.empty or longer.empty:
        return []
    top = int(trained["digits"].max())
    at = trained[trained["digits"] == top]
    past = longer.groupby("digits")["mean"].max()
    by_value: dict[str, list[str]] = {}  # "0.00" -> ["3", "4"]: one clause per value
    for k, v in past.items():
        by_value.setdefault(f"{v:.2f}", []).append(str(int(k)))
    return [f"- **Past the trained operand length** exact match goes from "
            f"{at['mean'].min():.2f}–{at['mean'].max():.2f} at {top} digits (trained) to at most "
            + ", ".join(f"{v} at {_names(ks)} digits" for v, ks in by_value.items())
            + ", over every variant."]


def _trends(trends: pd.DataFrame | None, dataset: str) -> list[str]:
    """One bullet on how the effects change with compute, where ``dataset`` has a scaling
    study's trends: the variants whose gain grows, shrinks, or shows no detectable trend."""
    if trends is None or trends.empty:
        return []
    t = trends[trends["dataset"] == dataset]
    if t.empty:
        return []
    parts = [f"{label}: {', '.join(map(str, t[t['trend'] == label]['variant']))}"
             for label in (TREND_GROWS, TREND_SHRINKS, TREND_NONE, TREND_FEW)
             if (t["trend"] == label).any()]
    return [f"- **Across {int(t['n_budgets'].max())} budgets**, the slope of each difference "
            f"per decade of compute (Holm-corrected; \"{SCALING_TITLE}\" below): "
            f"{'; '.join(parts)}."]


def _widths(ablation: pd.DataFrame | None, dataset: str) -> list[str]:
    """A line naming each variant compared with the baseline at another tuned ``d_model`` (and
    so over another number of steps of the same budget); none when every width is the
    baseline's."""
    if ablation is None or ablation.empty or "d_model" not in ablation:
        return []
    a = ablation[ablation["dataset"] == dataset]
    first = a.groupby("variant", observed=True, sort=False)[["d_model", "steps"]].first()
    if BASELINE not in first.index:
        return []
    base = first.loc[BASELINE]
    other = [f"{v} at d_model {int(r.d_model)} ({int(r.steps):,} steps)"
             for v, r in first.iterrows() if v != BASELINE and r.d_model != base.d_model]
    if not other:
        return []
    return [f"- **Compared at another width**: {'; '.join(other)}, against the {BASELINE}'s "
            f"d_model {int(base.d_model)} ({int(base.steps):,} steps). Each variant runs at "
            "its tuned width on the same budget, so such a difference is the variant's at its "
            "best width, not the feature's at one width."]


def _nothing_compared(variants: Sequence[str]) -> str:
    """The Findings opener of a dataset without comparisons: a one-variant study, or runs
    missing for a comparison."""
    if len(variants) == 1:
        return (f"the study has one variant, {variants[0]}: nothing is compared, so the "
                "report describes it and draws no verdict.")
    return (f"no variant is compared with the {BASELINE}: a comparison needs results of the "
            f"{BASELINE} and of another variant on the same seeds.")


def findings_section(comparisons: pd.DataFrame, *, datasets: Sequence[str],
                     replication: pd.DataFrame | None = None,
                     references: pd.DataFrame | None = None,
                     convergence: pd.DataFrame | None = None,
                     extrapolation: pd.DataFrame | None = None,
                     length: pd.DataFrame | None = None,
                     positions: Mapping[str, str] | None = None,
                     trends: pd.DataFrame | None = None,
                     success: pd.DataFrame | None = None,
                     speed: tuple[pd.DataFrame, pd.DataFrame] | None = None,
                     speed_replication: pd.DataFrame | None = None,
                     variants: Sequence[str] = (),
                     ablation: pd.DataFrame | None = None) -> list[str]:
    """The Markdown lines of "Findings" (see the module docstring), one block per dataset; the
    heading is the template's (``report/templates/report.md.j2``).

    Args:
        comparisons: :func:`~lmablate.report.stats.statistics.compare` (``comparisons.csv``).
        datasets: the datasets in study order.
        replication: ``replication.csv``
            (:func:`~lmablate.report.stats.replication.combine_replicates`): with replicates,
            a line names each verdict that did not replicate.
        references: ``references.csv`` (nats/char): its trigram row of a dataset's headline
            loss adds the caveat of :func:`reference_caveat` to each verdict.
        convergence: :func:`lmablate.report.stats.convergence.convergence_table`.
        extrapolation: ``extrapolation.csv``; length: ``length_generalisation.csv``.
        positions: variant -> its position scheme, for the extrapolation sentence.
        trends: a scaling study's :func:`lmablate.report.stats.scaling.effect_trends`
            (``scaling_trends.csv``): how each effect changes with compute.
        success: :func:`lmablate.report.stats.success.success_table` (``success.csv``): the
            seeds of each variant that learned an arithmetic task.
        speed: ``(learning_speed.csv, learning_speed_comparisons.csv)``
            (:mod:`lmablate.report.stats.learning_speed`): how fast each variant learned it.
        speed_replication: ``learning_speed_replication.csv``
            (:func:`~lmablate.report.stats.replication.combine_speed`): with replicates, a line
            names each learning-speed verdict that did not replicate, and one gives the
            combined ratios.
        variants: the variants with results, in study order: a dataset without comparisons
            says whether the study has one variant (:func:`_nothing_compared`).
        ablation: ``ablation.csv`` (a run per row, with ``d_model`` and ``steps``): a line
            names each variant compared at another tuned width than the baseline's.
    """
    empty = pd.DataFrame(columns=["dataset", "variant", "factor", "mean", "split", "digits"])
    lines: list[str] = []
    for ds in datasets:
        metric = headline_loss(comparisons, ds)
        label, unit, _ = METRICS[metric]
        c = comparisons[(comparisons["dataset"] == ds) & (comparisons["metric"] == metric)]
        if c.empty:
            lines += [f"**{ds}**: {_nothing_compared(variants)}", ""]
        else:
            lines += [f"**{ds}**: {label} ({unit}, lower is better) of every variant against "
                      f"the {BASELINE}, paired over {int(c['n_pairs'].max())} seeds, "
                      f"Holm-corrected at α = {ALPHA}.", ""]
        trigram = trigram_reference(references, ds, metric)
        lines += [f"- {_effect(r, unit, trigram)}" for _, r in c.iterrows()]
        lines += _widths(ablation, ds) if not c.empty else []
        lines += _undecided(c, unit)
        lines += _replication(replication, ds, unit)
        if success is not None and len(success):
            lines += success_lines(success, ds, present(success["variant"]))
        if speed is not None:
            lines += speed_lines(*speed, ds)
        lines += _speed_replication(speed_replication, ds)
        lines += _convergence(convergence if convergence is not None
                              else pd.DataFrame(columns=CONVERGENCE_COLUMNS), ds)
        lines += _extrapolation(extrapolation if extrapolation is not None else empty, ds,
                                positions or {})
        lines += _length(length if length is not None else empty, ds)
        lines += _trends(trends, ds)
        lines.append("")
    return lines


def verdict_lines(comparisons: pd.DataFrame, datasets: Sequence[str],
                  references: pd.DataFrame | None = None) -> list[str]:
    """The verdicts as console lines, one per dataset, in its headline loss, e.g.
    ``shakespeare, test loss (nats/char): rope better -0.126 [-0.174, -0.078]; ...``, the
    interval Holm-adjusted; the rest grouped under their verdict as written (``no significant
    difference: ...``). ``references`` (``references.csv``) adds, per comparison, where a model
    is not below the trigram (:func:`reference_caveat`, short form, nats/char)."""
    out = []
    for ds in datasets:
        metric = headline_loss(comparisons, ds)
        label, unit, _ = METRICS[metric]
        c = comparisons[(comparisons["dataset"] == ds) & (comparisons["metric"] == metric)]
        trigram = trigram_reference(references, ds, metric)

        def caveat(r) -> str:
            text = reference_caveat(str(r.variant), r.variant_mean, r.baseline_mean, trigram,
                                    unit, short=True)
            return f" ({text})" if text else ""
        decided = c[c["verdict"].isin([VERDICT_BETTER, VERDICT_WORSE])]
        parts = [f"{r.variant} {r.verdict} {_signed(r.mean_diff)} "
                 f"[{r.ci_holm_low:.3f}, {r.ci_holm_high:.3f}]{caveat(r)}"
                 for r in decided.itertuples()]
        rest: dict[str, list[str]] = {}  # verdict as written -> variants, in row order
        for r in c.loc[~c.index.isin(decided.index)].itertuples():
            rest.setdefault(str(r.verdict), []).append(f"{r.variant}{caveat(r)}")
        parts += [f"{verdict}: {', '.join(names)}" for verdict, names in rest.items()]
        out.append(f"{ds}, {label} ({unit}): {'; '.join(parts) or 'no variant compared'}")
    return out
