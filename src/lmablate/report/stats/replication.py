"""Replicates of the study (``study.replicates``): does each verdict come out the same when
the whole study is tuned and trained again on fresh seeds, and what do the replicates say
together?

* :func:`replicate_verdicts`: each replicate's comparison with the baseline in the dataset's
  headline loss, as that replicate's report gives it (paired by seed, Holm-corrected, checked
  against its tuning uncertainty), with its tuned learning rates and widths.
* :func:`combine_replicates`: per dataset x variant, whether the replicates' verdicts agree, and
  one comparison over all of them whose interval counts the tuning draw.
* :func:`tuning_spread`: per dataset x variant, how far the tuned and the final losses move
  between replicates, beside the tuning uncertainty a single study reports.
* :func:`combine_speed`: the same for an arithmetic dataset's learning speed
  (:mod:`~lmablate.report.stats.learning_speed`): each replicate's verdict, their agreement, and
  the replicates' ratios of tokens to learn combined on the log scale.

The combined comparison. Within replicate r the paired differences are
d_rs = mu + u_r + e_rs, where u_r (variance s_b^2) is what the replicate's own draw of tuning
and seeds adds to every seed of it, and e_rs (variance s_w^2) the seed-to-seed noise. With n
seeds per replicate, the replicate means d_r are independent with variance s_b^2 + s_w^2 / n,
so the Student-t interval of their mean with R - 1 degrees of freedom is exact for the balanced
one-way random-effects model (the "summary measures" analysis; Searle, Casella & McCulloch 1992,
"Variance Components", sec. 3.5) and conservative when replicates hold different seed counts.
It counts the tuning draw where a single study's interval, over seeds alone, cannot. Holm's
method then runs over a dataset's variants, as within one replicate
(:func:`~lmablate.report.stats.statistics.holm_correct`). Units: those of the headline loss
(nats per character, or nats per answer character).
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from lmablate.report.collect import BASELINE, rows_of
from lmablate.report.stats.learning_speed import VERDICT_FASTER, VERDICT_SLOWER
from lmablate.report.stats.statistics import (ALPHA, TUNED_METRIC, TUNED_METRICS, VERDICT_BETTER,
                                              VERDICT_NSD, VERDICT_WORSE, holm_correct,
                                              mean_interval)

VERDICT_FEW_REPLICATES = "too few replicates"  # one replicate holds the variant: no spread
VERDICT_SAME_IN_EVERY = "identical in every replicate"  # no spread between replicates: no test

REPLICATE_COLUMNS = [
    "dataset", "metric", "variant", "replicate", "n_pairs", "lr", "d_model", "baseline_lr",
    "baseline_d_model", "mean_diff", "ci_holm_low", "ci_holm_high", "p_holm",
    "tuning_uncertainty", "verdict",
]
COMBINED_COLUMNS = [
    "dataset", "metric", "variant", "replicates", "n_pairs", "verdicts", "agree", "same_sign",
    "mean_diff", "sd_between", "sd_tuning_draw", "df", "ci95_low", "ci95_high", "p_value",
    "p_holm", "ci_holm_low", "ci_holm_high", "verdict",
]
SPREAD_COLUMNS = [
    "dataset", "variant", "replicates", "tuned_lr", "tuned_d_model", "tuned_loss",
    "tuned_loss_range", "final_mean", "final_sd_between", "seed_se", "sd_tuning_draw",
    "tuning_uncertainty", "covered",
]
SPEED_REPLICATION_COLUMNS = [
    "dataset", "variant", "threshold", "replicates", "n_both", "ratios", "verdicts", "agree",
    "same_direction", "ratio", "df", "ratio_low", "ratio_high", "p_value", "p_holm",
    "ratio_holm_low", "ratio_holm_high", "verdict",
]
# a replicate's verdicts are joined with this in the tables ("better / better / worse")
JOIN = " / "


def _tuned(tuned: pd.DataFrame, dataset: str, variant: str, column: str) -> float:
    """The tuned ``column`` of one dataset x variant (NaN where it has none)."""
    if column not in tuned:
        return math.nan
    row = rows_of(tuned, dataset, variant)
    return float(row[column].iloc[0]) if len(row) and pd.notna(row[column].iloc[0]) else math.nan


def replicate_verdicts(comparisons: Mapping[int, pd.DataFrame],
                       tuned: Mapping[int, pd.DataFrame],
                       headline: Mapping[str, str]) -> pd.DataFrame:
    """Each replicate's comparisons with the baseline in each dataset's headline loss.

    Args:
        comparisons: replicate -> its comparisons
            (:func:`~lmablate.report.stats.statistics.compare`, then ``tuning_check``).
        tuned: replicate -> its tuned values (``tuned.csv``'s columns, ``best.json``).
        headline: dataset -> its headline loss (:func:`~lmablate.report.headline.
            headline_loss`), the metric whose comparisons are kept.

    Returns:
        Columns :data:`REPLICATE_COLUMNS`, by dataset, variant (in the comparisons' order),
        then replicate; ``lr`` per step, ``d_model``, the differences and intervals in the
        headline loss's unit.
    """
    rows = []
    for r in sorted(comparisons):
        c = comparisons[r]
        for dataset in dict.fromkeys(c["dataset"].astype(str)):
            metric = headline.get(dataset)
            t = tuned.get(r, pd.DataFrame(columns=["dataset", "variant", "lr", "d_model"]))
            for _, row in c[(c["dataset"] == dataset) & (c["metric"] == metric)].iterrows():
                variant = str(row["variant"])
                rows.append({
                    "dataset": dataset, "metric": metric, "variant": variant, "replicate": r,
                    "n_pairs": int(row["n_pairs"]), "lr": _tuned(t, dataset, variant, "lr"),
                    "d_model": _tuned(t, dataset, variant, "d_model"),
                    "baseline_lr": _tuned(t, dataset, BASELINE, "lr"),
                    "baseline_d_model": _tuned(t, dataset, BASELINE, "d_model"),
                    **{k: row[k] for k in ("mean_diff", "ci_holm_low", "ci_holm_high",
                                           "p_holm", "tuning_uncertainty", "verdict")}})
    out = pd.DataFrame(rows, columns=REPLICATE_COLUMNS)
    if out.empty:
        return out
    order = {(d, v): i for i, (d, v) in enumerate(dict.fromkeys(zip(out["dataset"],
                                                                      out["variant"])))}
    out["_order"] = [order[k] for k in zip(out["dataset"], out["variant"])]
    return (out.sort_values(["_order", "replicate"], kind="stable")
            .drop(columns="_order").reset_index(drop=True))


def combine_replicates(verdicts: pd.DataFrame, sd_within: pd.DataFrame | None = None,
                       alpha: float = ALPHA) -> pd.DataFrame:
    """Per dataset x variant over the replicates of :func:`replicate_verdicts`: their verdicts
    (``verdicts``, joined with :data:`JOIN`), whether every replicate gave the same one
    (``agree``) and a difference of the same sign (``same_sign``), and the combined comparison
    of the module docstring: the mean of the replicates' mean differences, its Student-t
    interval with R - 1 degrees of freedom (``ci95_*``), the t-test's p-value, Holm-corrected
    over the dataset's variants (``p_holm``, ``ci_holm_*`` at the level Holm judges it at), and
    the verdict: better or worse where Holm rejects, else no significant difference; "too few
    replicates" with one, "identical in every replicate" when their means do not differ.
    ``sd_between`` is the SD of the replicates' mean differences; ``sd_tuning_draw`` the SD a replicate's draw adds beyond its seeds,
    sqrt(max(0, sd_between^2 - mean(sd_diff^2) / n)) (the ANOVA estimator of s_b), where
    ``sd_within`` (dataset, variant, replicate, sd_diff) gives each replicate's SD of paired
    differences; NaN without it.

    Returns:
        Columns :data:`COMBINED_COLUMNS`, one row per dataset x variant, in ``verdicts``'
        order; differences in the headline loss's unit.
    """
    rows, families = [], {}
    for (dataset, variant), g in verdicts.groupby(["dataset", "variant"], sort=False):
        g = g.sort_values("replicate")
        means = g["mean_diff"].to_numpy(float)
        means = means[np.isfinite(means)]
        k = len(means)
        row = {"dataset": dataset, "metric": g["metric"].iloc[0], "variant": variant,
               "replicates": int(len(g)), "n_pairs": int(g["n_pairs"].sum()),
               "verdicts": JOIN.join(map(str, g["verdict"])),
               "agree": bool(g["verdict"].nunique() == 1),
               "same_sign": bool(k == len(g) and (np.all(means > 0) or np.all(means < 0))),
               "mean_diff": float(means.mean()) if k else math.nan,
               "sd_between": float(means.std(ddof=1)) if k > 1 else math.nan,
               "sd_tuning_draw": math.nan, "df": k - 1 if k > 1 else math.nan,
               **dict.fromkeys(("ci95_low", "ci95_high", "p_value", "p_holm", "ci_holm_low",
                                "ci_holm_high"), math.nan),
               "verdict": VERDICT_FEW_REPLICATES}
        if sd_within is not None and k > 1:
            w = rows_of(sd_within, dataset, variant)
            n = g["n_pairs"].to_numpy(float)
            if len(w) == len(g) and np.all(n > 0):
                within = float(np.mean(w["sd_diff"].to_numpy(float) ** 2 / n))
                row["sd_tuning_draw"] = math.sqrt(max(0.0, row["sd_between"] ** 2 - within))
        if k > 1 and row["sd_between"] <= 1e-12 * max(1.0, abs(row["mean_diff"])):
            row.update(verdict=VERDICT_SAME_IN_EVERY, **dict.fromkeys(
                ("ci95_low", "ci95_high", "ci_holm_low", "ci_holm_high"), row["mean_diff"]))
        elif k > 1:
            sem = row["sd_between"] / math.sqrt(k)
            t = row["mean_diff"] / sem
            low, high = mean_interval(row["mean_diff"], sem, k)
            row.update(ci95_low=float(low), ci95_high=float(high),
                       p_value=float(2 * stats.t.sf(abs(t), k - 1)), verdict=VERDICT_NSD,
                       _sem=sem, _df=k - 1)
            families.setdefault((dataset, row["metric"]), []).append(len(rows))
        rows.append(row)
    for (_, metric), family in families.items():
        holm_correct(rows, family, alpha, higher=False)  # headline losses: lower is better
    out = pd.DataFrame(rows, columns=COMBINED_COLUMNS)
    for col in ("agree", "same_sign"):
        out[col] = out[col].astype(bool)
    return out


def tuning_spread(tuned: Mapping[int, pd.DataFrame], ablation: Mapping[int, pd.DataFrame],
                  headline: Mapping[str, str]) -> pd.DataFrame:
    """Per dataset x variant across replicates: the tuned values (``tuned_lr``,
    ``tuned_d_model``, ``tuned_loss``: best.json's objective at the full budget, joined with
    :data:`JOIN`) and the range of the tuned loss; the mean final headline loss of each
    replicate (``final_mean``, joined), their SD (``final_sd_between``), the seeds' standard
    error of one replicate's mean (``seed_se``, root mean square over replicates) and what the
    tuning draw adds beyond it, ``sd_tuning_draw`` = sqrt(max(0, final_sd_between^2 -
    seed_se^2)); beside replicate 0's reported ``tuning_uncertainty`` (the 95th percentile of
    its bracket's regret; NaN where its objective is not the headline loss, as the mean answer
    loss over a run is not). ``covered``: the reported uncertainty is at least 1.96 x
    ``sd_tuning_draw``, the half-width of 95% of a normal tuning draw; None where either is
    missing. Losses in the headline loss's unit.

    Args:
        tuned: replicate -> its tuned values (``tuned.csv``'s columns).
        ablation: replicate -> its final runs (``ablation.csv``'s columns).
        headline: dataset -> its headline loss, a column of ``ablation``.
    """
    rows = []
    first = ablation[min(ablation)]
    t0 = tuned.get(min(ablation), _NO_TUNED)
    for (dataset, variant), _ in first.groupby(["dataset", "variant"], observed=True,
                                               sort=False):
        dataset, variant = str(dataset), str(variant)
        metric = headline[dataset]
        reps = sorted(r for r in ablation if len(rows_of(ablation[r], dataset, variant)))
        finals, ses = zip(*(_final_mean_se(rows_of(ablation[r], dataset, variant)[metric])
                            for r in reps))
        sd_between, se, draw = _tuning_draw(finals, ses)
        lrs, widths, losses = ([_tuned(tuned.get(r, _NO_TUNED), dataset, variant, column)
                                for r in reps] for column in ("lr", "d_model", "val_loss"))
        u = _reported_uncertainty(t0, dataset, variant, metric)
        tl = np.asarray(losses, float)
        rows.append({
            "dataset": dataset, "variant": variant, "replicates": len(reps),
            "tuned_lr": JOIN.join(f"{v:.3g}" for v in lrs),
            "tuned_d_model": JOIN.join("-" if math.isnan(v) else str(int(v)) for v in widths),
            "tuned_loss": JOIN.join(f"{v:.4f}" for v in losses),
            "tuned_loss_range": (float(np.nanmax(tl) - np.nanmin(tl))
                                 if np.isfinite(tl).sum() > 1 else math.nan),
            "final_mean": JOIN.join(f"{v:.4f}" for v in finals),
            "final_sd_between": sd_between, "seed_se": se, "sd_tuning_draw": draw,
            "tuning_uncertainty": u,
            "covered": (bool(u >= 1.96 * draw) if math.isfinite(u) and math.isfinite(draw)
                        else None),
        })
    return pd.DataFrame(rows, columns=SPREAD_COLUMNS)


_NO_TUNED = pd.DataFrame(columns=["dataset", "variant"])  # a replicate without tuned values


def _final_mean_se(final: pd.Series) -> tuple[float, float]:
    """The mean of one replicate's ``final`` losses (its seeds') and its standard error (NaN
    where too few are finite)."""
    x = final.to_numpy(float)
    x = x[np.isfinite(x)]
    return (float(x.mean()) if len(x) else math.nan,
            float(x.std(ddof=1) / math.sqrt(len(x))) if len(x) > 1 else math.nan)


def _tuning_draw(finals: Sequence[float], ses: Sequence[float]) -> tuple[float, float, float]:
    """The SD of the replicates' ``finals``, the root mean square of their seed standard errors
    ``ses`` and what the tuning draw adds beyond those, sqrt(max(0, SD^2 - SE^2))."""
    f = np.asarray(finals, float)
    sd_between = float(np.nanstd(f, ddof=1)) if np.isfinite(f).sum() > 1 else math.nan
    se = math.sqrt(float(np.nanmean(np.square(ses)))) if np.isfinite(ses).any() else math.nan
    draw = (math.sqrt(max(0.0, sd_between ** 2 - se ** 2))
            if math.isfinite(sd_between) and math.isfinite(se) else math.nan)
    return sd_between, se, draw


def _reported_uncertainty(t0: pd.DataFrame, dataset: str, variant: str, metric: str) -> float:
    """Replicate 0's reported ``tuning_uncertainty`` of one dataset x variant; NaN where its
    tuning objective is not the headline ``metric``."""
    objective = (rows_of(t0, dataset, variant)["objective"] if "objective" in t0
                 else pd.Series(dtype=object))
    if len(objective) and TUNED_METRICS.get(str(objective.iloc[0]), TUNED_METRIC) != metric:
        return math.nan  # another unit (the mean answer loss over a run): it covers nothing
    return _tuned(t0, dataset, variant, "tuning_uncertainty")


def not_replicated(combined: pd.DataFrame) -> pd.DataFrame:
    """The rows of :func:`combine_replicates` whose replicates did not all give the same
    verdict: each is named in the report's Findings."""
    return combined[~combined["agree"]] if len(combined) else combined



def combine_speed(comparisons: Mapping[int, pd.DataFrame], threshold: float = 0.5,
                  alpha: float = ALPHA) -> pd.DataFrame:
    """Per dataset x variant, the learning-speed comparisons with the baseline of every
    replicate at exact match ``threshold``, and their combination.

    Each replicate's ratio of tokens to learn (variant / baseline, the geometric mean over the
    seeds on which both learned; :func:`~lmablate.report.stats.learning_speed.compare_speed`)
    is one observation, combined as the headline losses are (:func:`combine_replicates`, the
    module docstring's summary-measures analysis) on the log scale: the geometric mean of the
    replicates' ratios (``ratio``), its Student-t interval with R - 1 degrees of freedom
    (``ratio_low``/``ratio_high``), the t-test of log ratio 0, Holm-corrected over the dataset's
    variants (``p_holm``, ``ratio_holm_*``). The verdict is faster or slower where Holm rejects.
    The interval counts the tuning draw, as the log-rank test of one replicate cannot; a
    replicate where no seed pair learned has no ratio and is left out of it.

    Args:
        comparisons: replicate -> its ``compare_speed`` table (``learning_speed_comparisons.csv``).

    Returns:
        Columns :data:`SPEED_REPLICATION_COLUMNS`, one row per dataset x variant in replicate
        0's order; ``ratios`` and ``verdicts`` per replicate joined with :data:`JOIN`,
        ``n_both`` the seed pairs that both learned, summed over replicates; ratios unitless.
    """
    rows = []
    for r in sorted(comparisons):
        c = comparisons[r]
        for x in c[c["threshold"] == threshold].itertuples():
            rows.append({"dataset": str(x.dataset), "metric": "log_tokens_to_learn",
                         "variant": str(x.variant), "replicate": r, "n_pairs": int(x.n_both),
                         "mean_diff": (math.log(x.ratio) if x.ratio > 0 else math.nan),
                         "verdict": x.verdict, "ratio": x.ratio})
    if not rows:
        return pd.DataFrame(columns=SPEED_REPLICATION_COLUMNS)
    per = pd.DataFrame(rows)
    combined = combine_replicates(per.drop(columns="ratio"), alpha=alpha)
    named = {VERDICT_BETTER: VERDICT_FASTER, VERDICT_WORSE: VERDICT_SLOWER}
    out = []
    for x in combined.itertuples():
        g = per[(per["dataset"] == x.dataset) & (per["variant"] == x.variant)]
        out.append({
            "dataset": x.dataset, "variant": x.variant, "threshold": threshold,
            "replicates": x.replicates, "n_both": x.n_pairs,
            "ratios": JOIN.join("-" if math.isnan(v) else f"{v:.2f}" for v in g["ratio"]),
            "verdicts": x.verdicts, "agree": x.agree, "same_direction": x.same_sign,
            "ratio": math.exp(x.mean_diff), "df": x.df,
            **{f"ratio{k}": math.exp(getattr(x, f"ci{k}")) for k in ("95_low", "95_high")},
            "p_value": x.p_value, "p_holm": x.p_holm,
            **{f"ratio_holm_{k}": math.exp(getattr(x, f"ci_holm_{k}")) for k in ("low", "high")},
            "verdict": named.get(x.verdict, x.verdict)})
    frame = pd.DataFrame(out).rename(columns={"ratio95_low": "ratio_low",
                                              "ratio95_high": "ratio_high"})
    return frame[SPEED_REPLICATION_COLUMNS]
