"""The report's opening section, "Findings": per dataset, in its headline loss, the verdicts
against the baseline and what the study could not decide, and the same verdicts as a table
(:func:`verdict_table`) and as console lines (:func:`verdict_lines`). This module picks the rows;
the sentences are macros of ``_findings.md.j2``. Losses in nats/char, accuracies as fractions.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from lmablate.report.collect import BASELINE, present
from lmablate.report.headline import headline_loss
from lmablate.report.stats.learning_speed import THRESHOLDS
from lmablate.report.stats.scaling import TREND_FEW, TREND_GROWS, TREND_NONE, TREND_SHRINKS
from lmablate.report.stats.statistics import (ALPHA, CONFIDENCE, METRICS, POWER, VERDICT_BETTER,
                                          VERDICT_NSD, VERDICT_WORSE)
from lmablate.report.stats.success import LEARNED_EXACT_MATCH
from lmablate.report.stats.replication import JOIN
from lmablate.report.stats.convergence import TAIL
from lmablate.report.text.limits import TRIGRAM, trigram_reference
from lmablate.report.text.mdtable import join_names as _names
from lmablate.report.text.templating import macro_text

FINDINGS = "_findings.md.j2"  # the sentences of "Findings", one macro each

MAX_SEEDS = 1000  # past this, "more than 1,000 seeds": the difference is lost in the spread


def seeds_needed(mean_diff: float, sd_diff: float, n_compared: int, alpha: float = ALPHA,
                 power: float = POWER, cap: int = MAX_SEEDS) -> int | None:
    """Paired seeds a two-sided paired t-test needs to detect a true difference of
    ``|mean_diff|`` with probability ``power`` when the per-seed differences have SD ``sd_diff``
    (same unit), at Holm's strictest level ``alpha / n_compared`` (that of
    :func:`lmablate.report.stats.statistics.min_detectable_effect`): the smallest whole number,
    at least 2, from the noncentral t power function (``statsmodels`` ``TTestPower``; Cohen
    1988, ch. 2). None for a zero or missing difference or spread, or past ``cap`` seeds.
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


def _record(row: Any, keys: Sequence[str], finite: bool = False) -> dict[str, Any]:
    """``keys`` of a row (Series or namedtuple) for a template: None for NaN (``finite``: and
    for inf), numpy integers as ``int``."""
    get = row.get if isinstance(row, pd.Series) else (lambda k: getattr(row, k, None))
    out = {}
    for k in keys:
        x = get(k)
        if isinstance(x, (float, np.floating)) and (math.isnan(x) or finite and math.isinf(x)):
            x = None
        out[k] = int(x) if isinstance(x, np.integer) else x
    return out


def say(macro: str, /, **fields: Any) -> str:
    """The sentence of :data:`FINDINGS`' macro ``macro`` with ``fields``."""
    return macro_text(FINDINGS, macro, **fields)


def reference_caveat(variant: str, variant_mean: float, baseline_mean: float,
                     trigram: float | None, unit: str, short: bool = False) -> str:
    """Which side of a comparison is not below the trigram reference ``trigram`` (nats/char, as
    the means), as a clause; "" when both are below or there is none. ``short``: the console
    form, e.g. ``neither past the trigram 2.159``."""
    if trigram is None or not math.isfinite(trigram):
        return ""
    above = [name for name, x in ((variant, variant_mean), (BASELINE, baseline_mean))
             if pd.notna(x) and float(x) >= trigram]
    if not above:
        return ""
    return say("caveat", above=above, other=BASELINE if above[0] == variant else variant,
               trigram=trigram, unit=unit, short=short, name=TRIGRAM)


EFFECT_KEYS = ("variant", "verdict", "mean_diff", "variant_mean", "baseline_mean", "ci95_low",
               "ci95_high", "ci_holm_low", "ci_holm_high", "tuning_uncertainty", "n_pairs")


def _headline(comparisons: pd.DataFrame, dataset: str,
              references: pd.DataFrame | None = None) -> tuple[str, str, pd.DataFrame, Any]:
    """``dataset``'s headline loss: label, unit, comparison rows, trigram reference (or None)."""
    metric = headline_loss(comparisons, dataset)
    c = comparisons[(comparisons["dataset"] == dataset) & (comparisons["metric"] == metric)]
    return *METRICS[metric][:2], c, trigram_reference(references, dataset, metric)


def verdict_table(comparisons: pd.DataFrame, datasets: Sequence[str],
                  references: pd.DataFrame | None = None,
                  success: pd.DataFrame | None = None) -> list[str]:
    """The verdicts as one Markdown table, a row per dataset x variant in its headline loss:
    verdict, Δ and its share of the baseline, Holm-adjusted interval, MDE, tuning uncertainty
    and what limits it (the trigram caveat, short form; from ``success.csv``, a side that
    learned the task on fewer than all its seeds); no lines without comparisons."""
    rows = []
    for ds in datasets:
        label, unit, c, trigram = _headline(comparisons, ds, references)
        t = _rows_of(success, ds)
        learned = {str(r.variant): say("learned_on", variant=r.variant, k=int(r.n_learned),
                                       n=int(r.n_seeds))
                   for r in t.itertuples() if int(r.n_learned) < int(r.n_seeds)}
        for i, (_, row) in enumerate(c.iterrows()):
            r = _record(row, EFFECT_KEYS + ("mde",))
            base = r["baseline_mean"]
            limits = [reference_caveat(r["variant"], row["variant_mean"], base, trigram, unit,
                                       short=True)]
            limits += [learned[v] for v in (BASELINE, r["variant"]) if v in learned]
            rows.append(dict(r, dataset=ds, label=label, unit=unit, first=i == 0,
                             share=r["mean_diff"] / abs(base) if base else None,
                             limits=[x for x in limits if x]))
    return say("verdict_table", rows=rows).splitlines() + [""] if rows else []


def _undecided(c: pd.DataFrame, unit: str) -> list[str]:
    """Seeds that would decide each "no significant difference", and its MDE."""
    nsd = c[c["verdict"] == VERDICT_NSD]
    if nsd.empty:
        return []
    m = int(c["p_value"].notna().sum())  # the Holm family: every comparison with a test
    rows = [dict(_record(r, ("variant", "mean_diff", "sd_diff", "mde")),
                 need=seeds_needed(r.mean_diff, r.sd_diff, m)) for r in nsd.itertuples()]
    return [say("undecided", rows=rows, unit=unit, power=POWER, m=m,
                n=int(nsd["n_pairs"].max()), max_seeds=MAX_SEEDS)]


def _replication(replication: pd.DataFrame | None, dataset: str, unit: str) -> list[str]:
    """The verdicts alike in every replicate, each one that did not replicate, and the
    combined verdicts (:func:`~lmablate.report.stats.replication.combine_replicates`)."""
    r = _rows_of(replication, dataset)
    if r.empty:
        return []
    k = int(r["replicates"].max())
    same = [{"variant": x.variant, "verdict": x.verdicts.split(JOIN)[0]}
            for x in r[r["agree"]].itertuples()]
    lines = [say("replicated", k=k, rows=same)] if same else []
    lines += [say("not_replicated", k=k, variant=x.variant, verdicts=x.verdicts)
              for x in r[~r["agree"]].itertuples()]
    rows = [_record(x, ("variant", "verdict", "mean_diff", "ci_holm_low", "ci_holm_high"))
            for x in r.itertuples()]
    return lines + [say("combined", k=k, rows=rows, unit=unit)]


def _speed_replication(speed: pd.DataFrame | None, dataset: str) -> list[str]:
    """Each learning-speed verdict that did not replicate, and the combined ratios
    (:func:`~lmablate.report.stats.replication.combine_speed`)."""
    s = _rows_of(speed, dataset)
    if s.empty:
        return []
    k = int(s["replicates"].max())
    lines = [say("not_replicated", k=k, variant=x.variant, verdicts=x.verdicts, ratios=x.ratios)
             for x in s[~s["agree"]].itertuples()]
    rows = [_record(x, ("variant", "verdict", "ratio", "ratio_holm_low", "ratio_holm_high"))
            for x in s.itertuples()]
    return lines + [say("combined_speed", k=k, rows=rows)]


def _rows_of(table: pd.DataFrame | None, dataset: str) -> pd.DataFrame:
    """``table``'s rows of ``dataset``; an empty frame for no table."""
    if table is None or table.empty:
        return pd.DataFrame(columns=["dataset"])
    return table[table["dataset"] == dataset]


def success_lines(table: pd.DataFrame | None, dataset: str) -> list[str]:
    """The bullet of each variant's seeds that learned the task, their share with its interval,
    and the seeds that did not (:func:`lmablate.report.stats.success.success_table`)."""
    t = _rows_of(table, dataset)
    if t.empty:
        return []
    keys = ("variant", "n_learned", "n_seeds", "share", "ci95_low", "ci95_high", "not_learned")
    rows = [_record(t[t["variant"] == v].iloc[0], keys) for v in present(t["variant"])]
    for r in rows:
        r["n_learned"], r["n_seeds"] = int(r["n_learned"]), int(r["n_seeds"])
    return [say("success", rows=rows, threshold=LEARNED_EXACT_MATCH, confidence=CONFIDENCE)]


def speed_lines(speed: tuple[pd.DataFrame, pd.DataFrame] | None, dataset: str,
                threshold: float = THRESHOLDS[0]) -> list[str]:
    """The learning-speed bullet at ``threshold``: each variant's Kaplan-Meier median tokens to
    learn with its interval and seeds learned, then each log-rank comparison with the
    baseline (:mod:`lmablate.report.stats.learning_speed`)."""
    if speed is None:
        return []
    t, c = (x[x["threshold"] == threshold] if len(x) else x
            for x in (_rows_of(x, dataset) for x in speed))
    if t.empty:
        return []
    rows = [_record(r, ("variant", "median_tokens", "median_low", "median_high", "n_learned",
                        "n_seeds")) for r in t.itertuples()]
    tests = [_record(r, ("variant", "verdict", "p_holm", "ratio", "ratio_low", "ratio_high",
                         "n_both"), finite=True) for r in c.itertuples()]
    return [say("speed", rows=rows, comparisons=tests, threshold=threshold,
                confidence=CONFIDENCE, budget=t["budget_tokens"].max(), baseline=BASELINE)]


def _convergence(conv: pd.DataFrame | None, dataset: str) -> list[str]:
    """Still-falling curves: every seed of a variant fell over the last part of training."""
    c = _rows_of(conv, dataset)
    if c.empty:
        return []
    falling = c[c["seeds_falling"] == c["seeds"]]
    if falling.empty:
        return [say("levelled", tail=TAIL)]
    who = "every variant" if len(falling) == len(c) else _names(list(map(str, falling["variant"])))
    return [say("falling", who=who, tail=TAIL, from_step=falling["from_step"].min(),
                low=falling["drop"].min(), high=falling["drop"].max())]


def _measured(table: pd.DataFrame | None, dataset: str) -> pd.DataFrame:
    t = _rows_of(table, dataset)
    return t[t["mean"].notna()] if len(t) else t


def _extrapolation(table: pd.DataFrame | None, dataset: str,
                   positions: Mapping[str, str]) -> list[str]:
    """The loss from 1x to the longest context each variant ran at, per position scheme."""
    e = _measured(table, dataset)
    if e.empty or e["factor"].max() <= 1:
        return []
    parts, fixed = [], []
    for variant, d in e.groupby("variant", observed=True, sort=False):
        d, variant = d.sort_values("factor"), str(variant)
        if len(d) < 2:
            fixed.append(variant)
            continue
        scheme = positions.get(variant, "")
        parts.append({"name": f"{variant} ({scheme})" if scheme and scheme != variant
                      else variant, "first": d["mean"].iloc[0], "last": d["mean"].iloc[-1],
                      "first_factor": int(d["factor"].iloc[0]),
                      "last_factor": int(d["factor"].iloc[-1])})
    return [say("extrapolation", parts=parts, fixed_names=fixed)] if parts else []


def _length(length: pd.DataFrame | None, dataset: str) -> list[str]:
    """Exact match at the longest trained operand length against the lengths past it."""
    d = _measured(length, dataset)
    if d.empty:
        return []
    trained, longer = d[d["split"] == "test"], d[d["split"] != "test"]
    if trained.empty or longer.empty:
        return []
    top = int(trained["digits"].max())
    at = trained[trained["digits"] == top]["mean"]
    by_value: dict[str, list[str]] = {}  # "0.00" -> ["3", "4"]: one clause per value
    for k, v in longer.groupby("digits")["mean"].max().items():
        by_value.setdefault(f"{v:.2f}", []).append(str(int(k)))
    return [say("length", low=at.min(), high=at.max(), top=top, past=list(by_value.items()))]


def _trends(trends: pd.DataFrame | None, dataset: str) -> list[str]:
    """How the effects change with compute (a scaling study's trends), one bullet."""
    t = _rows_of(trends, dataset)
    if t.empty:
        return []
    groups = [(label, list(map(str, t[t["trend"] == label]["variant"])))
              for label in (TREND_GROWS, TREND_SHRINKS, TREND_NONE, TREND_FEW)
              if (t["trend"] == label).any()]
    return [say("trends", n_budgets=int(t["n_budgets"].max()), groups=groups)]


def _widths(ablation: pd.DataFrame | None, dataset: str) -> list[str]:
    """The variants compared with the baseline at another tuned ``d_model``, if any."""
    a = _rows_of(ablation, dataset)
    if a.empty or "d_model" not in a:
        return []
    first = a.groupby("variant", observed=True, sort=False)[["d_model", "steps"]].first()
    if BASELINE not in first.index:
        return []
    base = first.loc[BASELINE]
    other = [{"variant": v, "d_model": int(r.d_model), "steps": int(r.steps)}
             for v, r in first.iterrows() if v != BASELINE and r.d_model != base.d_model]
    return [say("widths", other=other, baseline=BASELINE, base={
        "d_model": int(base.d_model), "steps": int(base.steps)})] if other else []


TABLES = ("replication", "references", "convergence", "extrapolation", "length", "positions",
          "trends", "success", "speed", "speed_replication", "ablation")


def findings_section(comparisons: pd.DataFrame, *, datasets: Sequence[str],
                     variants: Sequence[str] = (), **tables: Any) -> list[str]:
    """The Markdown lines of "Findings", one block per dataset, each ending with an empty line.

    ``comparisons``: ``comparisons.csv``; ``variants``: those with results, in study order;
    ``tables``: any of :data:`TABLES`, the CSV of that name (``speed``: the pair
    ``(learning_speed.csv, learning_speed_comparisons.csv)``, ``positions``: variant ->
    position scheme, ``references``: nats/char); a missing one adds no line.

    Raises:
        TypeError: a table this function does not know.
    """
    if set(tables) - set(TABLES):
        raise TypeError(f"findings_section: unknown tables {sorted(set(tables) - set(TABLES))}")
    t = {k: tables.get(k) for k in TABLES}
    lines = []
    for ds in datasets:
        label, unit, c, _ = _headline(comparisons, ds)
        if c.empty:
            lines += [say("nothing_compared", ds=ds, variants=list(variants), baseline=BASELINE),
                      ""]
        else:
            lines += [say("opener", ds=ds, label=label, unit=unit, baseline=BASELINE,
                          n_pairs=int(c["n_pairs"].max()), alpha=ALPHA), "",
                      *_widths(t["ablation"], ds), *_undecided(c, unit)]
        lines += _replication(t["replication"], ds, unit) + success_lines(t["success"], ds)
        lines += speed_lines(t["speed"], ds) + _speed_replication(t["speed_replication"], ds)
        lines += _convergence(t["convergence"], ds)
        lines += _extrapolation(t["extrapolation"], ds, t["positions"] or {})
        lines += _length(t["length"], ds) + _trends(t["trends"], ds) + [""]
    return lines


def verdict_lines(comparisons: pd.DataFrame, datasets: Sequence[str],
                  references: pd.DataFrame | None = None) -> list[str]:
    """The verdicts as console lines, one per dataset, in its headline loss, e.g.
    ``shakespeare, test loss (nats/char): rope better -0.126 [-0.174, -0.078]; ...`` (Holm-
    adjusted interval), the rest grouped under their verdict; with ``references``, where a
    model is not below the trigram (:func:`reference_caveat`, short form)."""
    out = []
    for ds in datasets:
        label, unit, c, trigram = _headline(comparisons, ds, references)
        rows = [dict(_record(r, EFFECT_KEYS), caveat=reference_caveat(
            str(r.variant), r.variant_mean, r.baseline_mean, trigram, unit, short=True))
            for _, r in c.iterrows()]
        decided = [r for r in rows if r["verdict"] in (VERDICT_BETTER, VERDICT_WORSE)]
        rest: dict[str, list[str]] = {}  # verdict as written -> variants, in row order
        for r in rows:
            if r not in decided:
                rest.setdefault(str(r["verdict"]), []).append(
                    r["variant"] + (f" ({r['caveat']})" if r["caveat"] else ""))
        out.append(say("console", ds=ds, label=label, unit=unit, decided=decided,
                       rest=list(rest.items())))
    return out
