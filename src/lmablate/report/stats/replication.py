"""Replicates of the study: each replicate's verdicts, whether they agree, and their combination,
the t-interval of the replicates' mean differences (R - 1 df), exact for the balanced one-way
random-effects model (Searle, Casella & McCulloch 1992, sec. 3.5). Units: the headline loss's."""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np
import pandas as pd
from scipy import stats

from lmablate.report.collect import BASELINE, rows_of
from lmablate.report.stats.learning_speed import VERDICT_FASTER, VERDICT_SLOWER
from lmablate.report.stats.statistics import (ALPHA, INTERVAL_COLUMNS, TUNED_METRIC,
                                              TUNED_METRICS, VERDICT_BETTER, VERDICT_NSD,
                                              VERDICT_WORSE, holm_correct, mean_interval)

VERDICT_FEW_REPLICATES = "too few replicates"  # one replicate holds the variant: no spread
VERDICT_SAME_IN_EVERY = "identical in every replicate"  # no spread between replicates: no test

REPLICATE_COLUMNS = ("dataset metric variant replicate n_pairs lr d_model baseline_lr "
                     "baseline_d_model mean_diff ci_holm_low ci_holm_high p_holm "
                     "tuning_uncertainty verdict").split()
COMBINED_COLUMNS = ("dataset metric variant replicates n_pairs verdicts agree same_sign mean_diff "
                    "sd_between sd_tuning_draw df ci95_low ci95_high p_value p_holm ci_holm_low "
                    "ci_holm_high verdict").split()
SPREAD_COLUMNS = ("dataset variant replicates tuned_lr tuned_d_model tuned_loss tuned_loss_range "
                  "final_mean final_sd_between seed_se sd_tuning_draw tuning_uncertainty "
                  "covered").split()
SPEED_REPLICATION_COLUMNS = ("dataset variant threshold replicates n_both ratios verdicts agree "
                             "same_direction ratio df ratio_low ratio_high p_value p_holm "
                             "ratio_holm_low ratio_holm_high verdict").split()
JOIN = " / "  # joins a row's values per replicate ("better / better / worse")
_NO_TUNED = pd.DataFrame(columns=["dataset", "variant"])  # a replicate without tuned values


def _tuned(tuned: pd.DataFrame, dataset: str, variant: str, column: str) -> float:
    x = rows_of(tuned, dataset, variant).get(column, pd.Series(dtype=float))
    return float(x.iloc[0]) if len(x) and pd.notna(x.iloc[0]) else math.nan


def replicate_verdicts(comparisons: Mapping[int, pd.DataFrame],
                       tuned: Mapping[int, pd.DataFrame],
                       headline: Mapping[str, str]) -> pd.DataFrame:
    """Each replicate's comparisons (``tuning_check``'s) in each dataset's ``headline`` loss with
    its ``tuned.csv`` values (:data:`REPLICATE_COLUMNS`), by dataset, variant, replicate."""
    rows = []
    for r in sorted(comparisons):
        c, t = comparisons[r], tuned.get(r, _NO_TUNED)
        for dataset in dict.fromkeys(c["dataset"].astype(str)):
            metric = headline.get(dataset)
            for _, row in c[(c["dataset"] == dataset) & (c["metric"] == metric)].iterrows():
                variant = str(row["variant"])
                rows.append({
                    "dataset": dataset, "metric": metric, "variant": variant, "replicate": r,
                    "n_pairs": int(row["n_pairs"]), **{k: row[k] for k in REPLICATE_COLUMNS[9:]},
                    **{p + k: _tuned(t, dataset, v, k) for k in ("lr", "d_model")
                       for p, v in (("", variant), ("baseline_", BASELINE))}})
    out = pd.DataFrame(rows, columns=REPLICATE_COLUMNS)
    if out.empty:
        return out
    return (out.assign(_order=out.groupby(["dataset", "variant"], sort=False).ngroup())
            .sort_values(["_order", "replicate"], kind="stable")
            .drop(columns="_order").reset_index(drop=True))


def combine_replicates(verdicts: pd.DataFrame, sd_within: pd.DataFrame | None = None,
                       alpha: float = ALPHA) -> pd.DataFrame:
    """Per dataset x variant of :func:`replicate_verdicts` (:data:`COMBINED_COLUMNS`): whether
    they ``agree``, and the module docstring's comparison, Holm over the dataset's variants;
    ``sd_tuning_draw`` = sqrt(max(0, sd_between^2 - mean(sd_diff^2 / n))) (ANOVA estimator)
    from ``sd_within`` (dataset, variant, replicate, sd_diff)."""
    rows, families = [], {}
    for (dataset, variant), g in verdicts.groupby(["dataset", "variant"], sort=False):
        g = g.sort_values("replicate")
        means = g["mean_diff"].to_numpy(float)
        means = means[np.isfinite(means)]
        k = len(means)
        row = {"dataset": dataset, "metric": g["metric"].iloc[0], "variant": variant,
               "replicates": len(g), "n_pairs": int(g["n_pairs"].sum()),
               "verdicts": JOIN.join(map(str, g["verdict"])), "agree": g["verdict"].nunique() == 1,
               "same_sign": k == len(g) and (np.all(means > 0) or np.all(means < 0)),
               "mean_diff": float(means.mean()) if k else math.nan,
               **dict.fromkeys(COMBINED_COLUMNS[9:18], math.nan), "verdict": VERDICT_FEW_REPLICATES}
        if k > 1:
            row.update(sd_between=float(means.std(ddof=1)), df=k - 1)
        if sd_within is not None and k > 1:
            w = rows_of(sd_within, dataset, variant)
            n = g["n_pairs"].to_numpy(float)
            if len(w) == len(g) and np.all(n > 0):
                within = float(np.mean(w["sd_diff"].to_numpy(float) ** 2 / n))
                row["sd_tuning_draw"] = math.sqrt(max(0.0, row["sd_between"] ** 2 - within))
        if k > 1 and row["sd_between"] <= 1e-12 * max(1.0, abs(row["mean_diff"])):
            row.update(verdict=VERDICT_SAME_IN_EVERY,
                       **dict.fromkeys(INTERVAL_COLUMNS, row["mean_diff"]))
        elif k > 1:
            sem = row["sd_between"] / math.sqrt(k)
            low, high = mean_interval(row["mean_diff"], sem, k)
            row.update(ci95_low=float(low), ci95_high=float(high), verdict=VERDICT_NSD,
                       p_value=float(2 * stats.t.sf(abs(row["mean_diff"] / sem), k - 1)),
                       _sem=sem, _df=k - 1)
            families.setdefault((dataset, row["metric"]), []).append(len(rows))
        rows.append(row)
    for family in families.values():
        holm_correct(rows, family, alpha, higher=False)  # headline losses: lower is better
    return pd.DataFrame(rows, columns=COMBINED_COLUMNS).astype({"agree": bool, "same_sign": bool})


def tuning_spread(tuned: Mapping[int, pd.DataFrame], ablation: Mapping[int, pd.DataFrame],
                  headline: Mapping[str, str]) -> pd.DataFrame:
    """Per dataset x variant across replicates (columns :data:`SPREAD_COLUMNS`, in the headline
    loss's unit): the tuned lr, width, loss and mean final headline loss per replicate joined,
    ``sd_tuning_draw`` = sqrt(max(0, final_sd_between^2 - seed_se^2)) (RMS seed standard error)
    and whether replicate 0's ``tuning_uncertainty`` ``covered`` 1.96 x it."""
    rows = []
    t0 = tuned.get(min(ablation), _NO_TUNED)
    for (dataset, variant), _ in ablation[min(ablation)].groupby(["dataset", "variant"],
                                                                 observed=True, sort=False):
        dataset, variant = str(dataset), str(variant)
        metric = headline[dataset]
        reps = sorted(r for r in ablation if len(rows_of(ablation[r], dataset, variant)))
        xs = [rows_of(ablation[r], dataset, variant)[metric].to_numpy(float) for r in reps]
        xs = [x[np.isfinite(x)] for x in xs]
        finals = [float(x.mean()) if len(x) else math.nan for x in xs]
        ses = [float(x.std(ddof=1) / math.sqrt(len(x))) if len(x) > 1 else math.nan for x in xs]
        f = np.asarray(finals, float)
        sd_between = float(np.nanstd(f, ddof=1)) if np.isfinite(f).sum() > 1 else math.nan
        se = math.sqrt(float(np.nanmean(np.square(ses)))) if np.isfinite(ses).any() else math.nan
        draw = float(np.sqrt(np.maximum(0.0, sd_between ** 2 - se ** 2)))  # NaN from a NaN
        lrs, widths, losses = ([_tuned(tuned.get(r, _NO_TUNED), dataset, variant, column)
                                for r in reps] for column in ("lr", "d_model", "val_loss"))
        objective = rows_of(t0, dataset, variant).get("objective", pd.Series(dtype=object))
        # another unit (the mean answer loss over a run) covers nothing
        u = (math.nan if len(objective) and TUNED_METRICS.get(str(objective.iloc[0]),
                                                              TUNED_METRIC) != metric
             else _tuned(t0, dataset, variant, "tuning_uncertainty"))
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
            "covered": bool(u >= 1.96 * draw) if math.isfinite(u + draw) else None})
    return pd.DataFrame(rows, columns=SPREAD_COLUMNS)


def combine_speed(comparisons: Mapping[int, pd.DataFrame], threshold: float = 0.5,
                  alpha: float = ALPHA) -> pd.DataFrame:
    """Each replicate's learning-speed comparisons at ``threshold`` (``compare_speed``'s) and
    their :func:`combine_replicates` on the log scale (:data:`SPEED_REPLICATION_COLUMNS`)."""
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
    out = combine_replicates(per.drop(columns="ratio"), alpha=alpha).rename(columns={
        "n_pairs": "n_both", "same_sign": "same_direction", "mean_diff": "ratio",
        "ci95_low": "ratio_low", "ci95_high": "ratio_high", "ci_holm_low": "ratio_holm_low",
        "ci_holm_high": "ratio_holm_high"})
    for col in ("ratio", "ratio_low", "ratio_high", "ratio_holm_low", "ratio_holm_high"):
        out[col] = out[col].map(math.exp)  # math's exp, to the last bit as before
    ratios = per.groupby(["dataset", "variant"], sort=False)["ratio"].agg(
        lambda g: JOIN.join("-" if math.isnan(v) else f"{v:.2f}" for v in g))
    return out.assign(threshold=threshold, ratios=[ratios[k] for k in zip(out.dataset,
                                                                            out.variant)],
                      verdict=out["verdict"].replace({VERDICT_BETTER: VERDICT_FASTER,
                                                      VERDICT_WORSE: VERDICT_SLOWER})
                      )[SPEED_REPLICATION_COLUMNS]
