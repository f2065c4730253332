"""The report's opening section, "Findings": the study's answer, then what it could not decide.

This module picks the rows and numbers; every sentence is a macro of
``report/templates/_findings.md.j2`` (:func:`say`), its numbers formatted there by the filters
of :mod:`lmablate.report.text.templating`.

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
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from lmablate.report.collect import BASELINE, present
from lmablate.report.headline import headline_loss
from lmablate.report.stats.learning_speed import THRESHOLDS
from lmablate.report.stats.scaling import (SCALING_TITLE, TREND_FEW, TREND_GROWS, TREND_NONE,
                                      TREND_SHRINKS)
from lmablate.report.stats.statistics import (ALPHA, CONFIDENCE, METRICS, POWER, VERDICT_BETTER,
                                          VERDICT_NSD, VERDICT_WORSE)
from lmablate.report.stats.success import LEARNED_EXACT_MATCH
from lmablate.report.stats.replication import JOIN
from lmablate.report.stats.convergence import CONVERGENCE_COLUMNS, TAIL
from lmablate.report.text.limits import TRIGRAM, trigram_reference
from lmablate.report.text.mdtable import join_names as _names
from lmablate.report.text.templating import macro_text

FINDINGS = "_findings.md.j2"  # the sentences of "Findings", one macro each

MAX_SEEDS = 1000  # past this, "more than 1,000 seeds": the difference is lost in the spread


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


def _value(x: Any, finite: bool = False) -> Any:
    """A table cell for a template: None for a missing number (or, ``finite``, an infinite
    one), a Python int for a numpy integer, otherwise as it is."""
    if x is None or (isinstance(x, (float, np.floating))
                     and (math.isnan(x) or (finite and math.isinf(x)))):
        return None
    if isinstance(x, (np.integer,)):
        return int(x)
    return x


def _record(row: Any, keys: Sequence[str], finite: bool = False) -> dict[str, Any]:
    """``keys`` of a table row (a Series or a namedtuple) as a template's dict (:func:`_value`
    of each cell)."""
    get = row.get if isinstance(row, pd.Series) else (lambda k: getattr(row, k, None))
    return {k: _value(get(k), finite) for k in keys}


def say(macro: str, /, **fields: Any) -> str:
    """The sentence of :data:`FINDINGS`' macro ``macro`` with ``fields``."""
    return macro_text(FINDINGS, macro, **fields)


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
    other = BASELINE if above[0] == variant else variant
    return say("caveat", above=above, other=other, trigram=trigram, unit=unit, short=short,
               name=TRIGRAM)


EFFECT_KEYS = ("variant", "verdict", "mean_diff", "variant_mean", "baseline_mean", "ci95_low",
               "ci95_high", "ci_holm_low", "ci_holm_high", "tuning_uncertainty", "n_pairs")


def _headline(comparisons: pd.DataFrame, dataset: str,
              references: pd.DataFrame | None = None) -> tuple[str, str, pd.DataFrame, Any]:
    """``dataset``'s headline loss (:func:`lmablate.report.headline.headline_loss`): its label,
    unit, comparison rows and trigram reference (None where it has none)."""
    metric = headline_loss(comparisons, dataset)
    label, unit, _ = METRICS[metric]
    c = comparisons[(comparisons["dataset"] == dataset) & (comparisons["metric"] == metric)]
    return label, unit, c, trigram_reference(references, dataset, metric)


def verdict_table(comparisons: pd.DataFrame, datasets: Sequence[str],
                  references: pd.DataFrame | None = None,
                  success: pd.DataFrame | None = None) -> list[str]:
    """The study's verdicts as one Markdown table, a row per dataset x variant in its headline
    loss (:func:`lmablate.report.headline.headline_loss`): verdict, Δ and its share of the
    baseline, the Holm-adjusted interval, MDE, the tuning uncertainty that checks the verdict
    (or that none does) and what limits it: the trigram caveat (:func:`reference_caveat`,
    short form) and, from ``success`` (``success.csv``), a side of the pair that learned the
    task on fewer than all its seeds; no lines without comparisons."""
    rows = []
    for ds in datasets:
        label, unit, c, trigram = _headline(comparisons, ds, references)
        learned = _learned(success, ds)
        for i, (_, row) in enumerate(c.iterrows()):
            r = _record(row, EFFECT_KEYS + ("mde",))
            base = r["baseline_mean"]
            limits = [reference_caveat(r["variant"], row["variant_mean"], row["baseline_mean"],
                                       trigram, unit, short=True)]
            limits += [learned[v] for v in (BASELINE, r["variant"]) if v in learned]
            rows.append(dict(r, dataset=ds, label=label, unit=unit, first=i == 0,
                             share=r["mean_diff"] / abs(base) if base else None,
                             limits=[x for x in limits if x]))
    return say("verdict_table", rows=rows).splitlines() + [""] if rows else []


def _learned(success: pd.DataFrame | None, dataset: str) -> dict[str, str]:
    """variant -> "<variant> learned on k/n seeds" for each variant of ``dataset`` whose
    seeds did not all learn the task (``success.csv``)."""
    t = _rows_of(success, dataset)
    return {str(r.variant): say("learned_on", variant=r.variant, k=int(r.n_learned),
                                n=int(r.n_seeds))
            for r in t.itertuples() if int(r.n_learned) < int(r.n_seeds)}


def _undecided(c: pd.DataFrame, unit: str) -> list[str]:
    """What would decide each "no significant difference": seeds needed at the observed spread,
    and that comparison's MDE (its ``mde``, as in the comparison table)."""
    nsd = c[c["verdict"] == VERDICT_NSD]
    if nsd.empty:
        return []
    m = int(c["p_value"].notna().sum())  # the Holm family: every comparison with a test
    rows = [dict(_record(r, ("variant", "mean_diff", "sd_diff", "mde")),
                 need=seeds_needed(r.mean_diff, r.sd_diff, m)) for r in nsd.itertuples()]
    return [say("undecided", rows=rows, unit=unit, power=POWER, m=m,
                n=int(nsd["n_pairs"].max()), max_seeds=MAX_SEEDS)]


def _replication(replication: pd.DataFrame | None, dataset: str, unit: str) -> list[str]:
    """With replicates: the verdicts every replicate gave alike, one line for each that did not
    replicate, and the combined verdicts whose intervals count the tuning draw
    (:func:`~lmablate.report.stats.replication.combine_replicates`)."""
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
    """With replicates: each learning-speed verdict that did not replicate, one line each, and
    the combined ratios of tokens to learn whose intervals count the tuning draw
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
    table, comparisons = (_rows_of(t, dataset) for t in speed)
    t = table[table["threshold"] == threshold] if len(table) else table
    if t.empty:
        return []
    c = comparisons[comparisons["threshold"] == threshold] if len(comparisons) else comparisons
    rows = [_record(r, ("variant", "median_tokens", "median_low", "median_high", "n_learned",
                        "n_seeds")) for r in t.itertuples()]
    tests = [_record(r, ("variant", "verdict", "p_holm", "ratio", "ratio_low", "ratio_high",
                         "n_both"), finite=True) for r in c.itertuples()]
    return [say("speed", rows=rows, comparisons=tests, threshold=threshold,
                confidence=CONFIDENCE, budget=t["budget_tokens"].max(), baseline=BASELINE)]


def _convergence(conv: pd.DataFrame, dataset: str) -> list[str]:
    """Still-falling curves: every seed of every variant fell over the last part of training."""
    c = conv[conv["dataset"] == dataset]
    if c.empty:
        return []
    falling = c[c["seeds_falling"] == c["seeds"]]
    if falling.empty:
        return [say("levelled", tail=TAIL)]
    who = ("every variant" if len(falling) == len(c)
           else _names(list(map(str, falling["variant"]))))
    return [say("falling", who=who, tail=TAIL, from_step=falling["from_step"].min(),
                low=falling["drop"].min(), high=falling["drop"].max())]


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
        scheme = positions.get(str(variant), "")
        parts.append({"name": f"{variant} ({scheme})" if scheme and scheme != str(variant)
                      else str(variant),
                      "first": d["mean"].iloc[0], "first_factor": int(d["factor"].iloc[0]),
                      "last": d["mean"].iloc[-1], "last_factor": int(d["factor"].iloc[-1])})
    return [say("extrapolation", parts=parts, fixed_names=fixed)] if parts else []


def _length(length: pd.DataFrame, dataset: str) -> list[str]:
    """Exact match at the longest trained operand length against the lengths past it."""
    d = length[(length["dataset"] == dataset) & length["mean"].notna()]
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
    """One bullet on how the effects change with compute, where ``dataset`` has a scaling
    study's trends: the variants whose gain grows, shrinks, or shows no detectable trend."""
    t = _rows_of(trends, dataset)
    if t.empty:
        return []
    groups = [(label, list(map(str, t[t["trend"] == label]["variant"])))
              for label in (TREND_GROWS, TREND_SHRINKS, TREND_NONE, TREND_FEW)
              if (t["trend"] == label).any()]
    return [say("trends", n_budgets=int(t["n_budgets"].max()), groups=groups)]


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
    other = [{"variant": v, "d_model": int(r.d_model), "steps": int(r.steps)}
             for v, r in first.iterrows() if v != BASELINE and r.d_model != base.d_model]
    if not other:
        return []
    return [say("widths", other=other, baseline=BASELINE,
                base={"d_model": int(base.d_model), "steps": int(base.steps)})]


def _dataset_lines(ds: str, comparisons: pd.DataFrame, tables: Mapping[str, Any],
                   variants: Sequence[str]) -> list[str]:
    """One dataset's block of "Findings", ending with an empty line."""
    label, unit, c, _ = _headline(comparisons, ds)
    if c.empty:
        lines = [say("nothing_compared", ds=ds, variants=list(variants), baseline=BASELINE), ""]
    else:
        lines = [say("opener", ds=ds, label=label, unit=unit, n_pairs=int(c["n_pairs"].max()),
                     baseline=BASELINE, alpha=ALPHA), ""]
    lines += _widths(tables["ablation"], ds) if not c.empty else []
    lines += _undecided(c, unit)
    lines += _replication(tables["replication"], ds, unit)
    lines += success_lines(tables["success"], ds)
    lines += speed_lines(tables["speed"], ds)
    lines += _speed_replication(tables["speed_replication"], ds)
    lines += _convergence(tables["convergence"], ds)
    lines += _extrapolation(tables["extrapolation"], ds, tables["positions"])
    lines += _length(tables["length"], ds)
    return lines + _trends(tables["trends"], ds) + [""]


def findings_section(comparisons: pd.DataFrame, *, datasets: Sequence[str],
                     variants: Sequence[str] = (), **tables: Any) -> list[str]:
    """The Markdown lines of "Findings" (see the module docstring), one block per dataset; the
    heading is the template's (``report/templates/report.md.j2``), the sentences
    :data:`FINDINGS`'.

    Args:
        comparisons: :func:`~lmablate.report.stats.statistics.compare` (``comparisons.csv``).
        datasets: the datasets in study order.
        variants: the variants with results, in study order: a dataset without comparisons
            says whether the study has one variant.
        tables: any of ``replication`` (``replication.csv``: with replicates, which verdicts
            replicated), ``references`` (``references.csv``, nats/char: the trigram caveat of
            :func:`reference_caveat`), ``convergence``
            (:func:`lmablate.report.stats.convergence.convergence_table`), ``extrapolation``
            (``extrapolation.csv``), ``length`` (``length_generalisation.csv``), ``positions``
            (variant -> position scheme), ``trends`` (``scaling_trends.csv``), ``success``
            (``success.csv``), ``speed`` (``(learning_speed.csv,
            learning_speed_comparisons.csv)``), ``speed_replication``
            (``learning_speed_replication.csv``) and ``ablation`` (``ablation.csv``: a line
            names each variant compared at another tuned width); a missing one adds no line.

    Raises:
        TypeError: a table this function does not know.
    """
    known = {"replication", "references", "convergence", "extrapolation", "length",
             "positions", "trends", "success", "speed", "speed_replication", "ablation"}
    if set(tables) - known:
        raise TypeError(f"findings_section: unknown tables {sorted(set(tables) - known)}")
    empty = pd.DataFrame(columns=["dataset", "variant", "factor", "mean", "split", "digits"])
    given = {k: tables.get(k) for k in known}
    given["convergence"] = (given["convergence"] if given["convergence"] is not None
                            else pd.DataFrame(columns=CONVERGENCE_COLUMNS))
    for k in ("extrapolation", "length"):
        given[k] = given[k] if given[k] is not None else empty
    given["positions"] = given["positions"] or {}
    return [line for ds in datasets
            for line in _dataset_lines(ds, comparisons, given, variants)]


def verdict_lines(comparisons: pd.DataFrame, datasets: Sequence[str],
                  references: pd.DataFrame | None = None) -> list[str]:
    """The verdicts as console lines, one per dataset, in its headline loss, e.g.
    ``shakespeare, test loss (nats/char): rope better -0.126 [-0.174, -0.078]; ...``, the
    interval Holm-adjusted; the rest grouped under their verdict as written (``no significant
    difference: ...``). ``references`` (``references.csv``) adds, per comparison, where a model
    is not below the trigram (:func:`reference_caveat`, short form, nats/char)."""
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
