"""The report's tables: :func:`compute_tables` runs the statistics over the collected runs,
:func:`csv_tables` names the CSV of ``reports/`` each frame goes to. Nothing here writes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import pandas as pd

from lmablate.config.study import StudyConfig
from lmablate.report.collect import (ABLATION_COLUMNS, BASELINE, TUNED_COLUMNS, RunOutputs,
                                       present)
from lmablate.report.stats import extrapolation as ex
from lmablate.report.stats import learning_speed as speed_mod
from lmablate.report.stats.learning_speed import compare_speed, speed_table, tokens_to_learn
from lmablate.report.stats.problems import PROBLEM_COLUMNS, compare_problems
from lmablate.report.stats.reference_points import (REFERENCE_COLUMNS, reference_table,
                                                    uniform_losses)
from lmablate.report.stats.sensitivity import SENSITIVITY_COLUMNS, lr_sensitivity
from lmablate.report.stats import replication as rep
from lmablate.report.headline import headline_loss
from lmablate.report.stats.statistics import compare, summarise, tuning_check
from lmablate.report.stats.success import SUCCESS_COLUMNS, success_table
from lmablate.report.stats import arithmetic_tables as arith
from lmablate.report.stats.convergence import CONVERGENCE_COLUMNS, convergence_table
from lmablate.report.stats.detectable import DETECTABLE_COLUMNS, detectable_table

GRAD_COLUMNS = ["dataset", "variant", "group", "seeds", "frac_near_zero"]


def gradient_table(grad: pd.DataFrame) -> pd.DataFrame:
    """``grad_flow.csv``, a one-batch diagnostic: per dataset x variant x parameter group, the
    mean over seeds of the share of gradient entries with |g| < 1e-8 in the last batch."""
    if grad.empty or "frac_near_zero" not in grad:
        return pd.DataFrame(columns=GRAD_COLUMNS)
    out = (grad.groupby(["dataset", "variant", "group"], observed=True, sort=False)
           ["frac_near_zero"].agg(seeds="count", frac_near_zero="mean").reset_index())
    return out[GRAD_COLUMNS]


@dataclass(frozen=True)
class ReportTables:
    """The frames of one report, in the study order; columns as the ``*_COLUMNS`` named."""

    summary: pd.DataFrame  # statistics.SUMMARY_COLUMNS, one row per dataset x variant x metric
    comparisons: pd.DataFrame  # statistics.COMPARISON_COLUMNS, every variant against baseline
    problems: pd.DataFrame  # problems.PROBLEM_COLUMNS, arithmetic problem by problem
    detectable: pd.DataFrame  # stats.detectable.DETECTABLE_COLUMNS, the mde of each comparison
    references: pd.DataFrame  # REFERENCE_COLUMNS; empty without the tokenized data
    extrapolation: pd.DataFrame  # extrapolation.TABLE_COLUMNS, test loss per context multiple
    extrapolation_comparisons: pd.DataFrame  # each scheme against rope at each length
    positions: dict[str, pd.DataFrame]  # dataset -> extrapolation.CURVE_COLUMNS
    sensitivity: pd.DataFrame  # sensitivity.SENSITIVITY_COLUMNS
    length: pd.DataFrame  # arithmetic.LENGTH_COLUMNS, exact match by operand length
    length_comparisons: pd.DataFrame  # arithmetic.LENGTH_COMPARISON_COLUMNS
    convergence: pd.DataFrame  # stats.convergence.CONVERGENCE_COLUMNS
    gradients: pd.DataFrame  # GRAD_COLUMNS, a one-batch diagnostic
    success: pd.DataFrame  # success.SUCCESS_COLUMNS, the seeds that learned arithmetic
    speed: pd.DataFrame  # learning_speed.SPEED_COLUMNS, tokens to learn per seed
    speed_summary: pd.DataFrame  # learning_speed.TABLE_COLUMNS, Kaplan-Meier per variant
    speed_comparisons: pd.DataFrame  # learning_speed.COMPARISON_COLUMNS, paired by seed
    # study.replicates > 1, else empty
    replicates: pd.DataFrame = field(
        default_factory=lambda: pd.DataFrame(columns=rep.REPLICATE_COLUMNS))
    replication: pd.DataFrame = field(
        default_factory=lambda: pd.DataFrame(columns=rep.COMBINED_COLUMNS))
    tuning_spread: pd.DataFrame = field(
        default_factory=lambda: pd.DataFrame(columns=rep.SPREAD_COLUMNS))
    speed_replication: pd.DataFrame = field(
        default_factory=lambda: pd.DataFrame(columns=rep.SPEED_REPLICATION_COLUMNS))


def _in_study_order(table: pd.DataFrame, ablation: pd.DataFrame) -> pd.DataFrame:
    """``table`` sorted stably into ``ablation``'s dataset and variant order."""
    return table.sort_values(["dataset", "variant"], kind="stable", key=lambda c: c.map(
        {v: i for i, v in enumerate(present(ablation[c.name]))}))


def replicate_comparisons(runs: RunOutputs) -> pd.DataFrame:
    """One replicate's comparisons with the baseline, checked against its tuning."""
    return tuning_check(compare(runs.ablation, baseline=BASELINE), runs.tuned)


def replication_tables(runs: RunOutputs, comparisons: pd.DataFrame,
                       replicates: dict[int, RunOutputs]
                       ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Each replicate's verdicts, their combination and the tuning spread
    (:mod:`~lmablate.report.stats.replication`) over replicate 0 and ``replicates``."""
    if not replicates:
        return (pd.DataFrame(columns=rep.REPLICATE_COLUMNS),
                pd.DataFrame(columns=rep.COMBINED_COLUMNS),
                pd.DataFrame(columns=rep.SPREAD_COLUMNS))
    every = {0: runs, **replicates}
    found = {r: replicate_comparisons(x) for r, x in replicates.items()
             if not x.ablation.empty}
    compared = {0: comparisons, **found}
    tuned = {r: x.tuned for r, x in every.items()}
    headline = {str(d): headline_loss(runs.ablation, str(d))
                for d in present(runs.ablation["dataset"])}
    verdicts = rep.replicate_verdicts(compared, tuned, headline)
    within = pd.concat([c.assign(replicate=r) for r, c in compared.items()], ignore_index=True)
    within = within[within.apply(lambda x: headline.get(str(x["dataset"])) == x["metric"],
                                 axis=1)]
    combined = rep.combine_replicates(verdicts, within[["dataset", "variant", "replicate",
                                                         "sd_diff"]])
    spread = rep.tuning_spread(tuned, {r: x.ablation for r, x in every.items()
                                       if not x.ablation.empty}, headline)
    return verdicts, combined, spread


def compute_tables(cfg: StudyConfig, runs: RunOutputs, tokens_dir: Path | None,
                   replicates: dict[int, RunOutputs] | None = None) -> ReportTables:
    """Every table of the report from the study's runs (not empty) and its ``replicates``
    (r > 0 -> runs); ``tokens_dir`` gives the reference points (None: none).

    Raises:
        FileNotFoundError / TokenizerError: a dataset's tokens are missing under ``tokens_dir``.
    """
    ablation = runs.ablation
    summary = summarise(ablation)
    comparisons = replicate_comparisons(runs)
    problems = compare_problems(runs.predictions, baseline=BASELINE,
                                variants=present(ablation["variant"]))
    detectable = detectable_table(comparisons)
    references = (reference_table(cfg, tokens_dir, runs) if tokens_dir is not None
                  else pd.DataFrame(columns=REFERENCE_COLUMNS))
    extrapolation = ex.extrapolation_table(runs.extrapolation)
    extrapolation_comparisons = ex.extrapolation_comparisons(runs.extrapolation)
    positions = {ds: ex.position_curves(runs.position_loss, ds)
                 for ds in present(ablation["dataset"])}
    sensitivity = lr_sensitivity(runs.trials, uniform_losses(cfg, tokens_dir))
    length = arith.length_table(runs.by_operand_digits)
    length_comparisons = arith.length_comparisons(runs.by_operand_digits)
    speed = tokens_to_learn(runs.history)
    speed_comparisons = compare_speed(speed)
    return ReportTables(
        summary=summary, comparisons=comparisons, problems=problems, detectable=detectable,
        references=references, extrapolation=extrapolation,
        extrapolation_comparisons=extrapolation_comparisons, positions=positions,
        sensitivity=sensitivity, length=length, length_comparisons=length_comparisons,
        convergence=_in_study_order(convergence_table(runs.history), ablation),
        gradients=_in_study_order(gradient_table(runs.grad), ablation),
        success=success_table(ablation), speed=speed, speed_summary=speed_table(speed),
        speed_comparisons=speed_comparisons,
        **dict(zip(("replicates", "replication", "tuning_spread"),
                   replication_tables(runs, comparisons, replicates or {}))),
        speed_replication=rep.combine_speed(
            {0: speed_comparisons, **{r: compare_speed(tokens_to_learn(x.history))
                                      for r, x in (replicates or {}).items()}})
        if replicates else pd.DataFrame(columns=rep.SPEED_REPLICATION_COLUMNS))


def csv_tables(runs: RunOutputs, tables: ReportTables
               ) -> dict[str, tuple[str, pd.DataFrame, Sequence[str] | None]]:
    """name -> ``(file under reports/, frame, columns or None for its own)``, in write order."""
    return {
        "ablation": ("ablation.csv", runs.ablation, ABLATION_COLUMNS),
        "summary": ("summary.csv", tables.summary, None),
        "comparisons": ("comparisons.csv", tables.comparisons, None),
        "problem_comparisons": ("problem_comparisons.csv", tables.problems, PROBLEM_COLUMNS),
        "detectable_effects": ("detectable_effects.csv", tables.detectable, DETECTABLE_COLUMNS),
        "references": ("references.csv", tables.references, REFERENCE_COLUMNS),
        "tuned": ("tuned.csv", runs.tuned, TUNED_COLUMNS),
        "lr_sensitivity": ("lr_sensitivity.csv", tables.sensitivity, SENSITIVITY_COLUMNS),
        "replicates": ("replicates.csv", tables.replicates, rep.REPLICATE_COLUMNS),
        "replication": ("replication.csv", tables.replication, rep.COMBINED_COLUMNS),
        "tuning_spread": ("tuning_spread.csv", tables.tuning_spread, rep.SPREAD_COLUMNS),
        "speed_replication": ("learning_speed_replication.csv", tables.speed_replication,
                              rep.SPEED_REPLICATION_COLUMNS),
        "extrapolation": ("extrapolation.csv", tables.extrapolation, ex.TABLE_COLUMNS),
        "extrapolation_comparisons": ("extrapolation_comparisons.csv",
                                      tables.extrapolation_comparisons, None),
        "extrapolation_positions": (
            "extrapolation_positions.csv",
            pd.concat([c.assign(dataset=ds) for ds, c in tables.positions.items()],
                      ignore_index=True),
            ["dataset", *ex.CURVE_COLUMNS]),
        "convergence": ("convergence.csv", tables.convergence, CONVERGENCE_COLUMNS),
        "grad_flow": ("grad_flow.csv", tables.gradients, GRAD_COLUMNS),
        "length_generalisation": ("length_generalisation.csv", tables.length,
                                  arith.LENGTH_COLUMNS),
        "length_generalisation_comparisons": ("length_generalisation_comparisons.csv",
                                              tables.length_comparisons,
                                              arith.LENGTH_COMPARISON_COLUMNS),
        "success": ("success.csv", tables.success, SUCCESS_COLUMNS),
        "tokens_to_learn": ("tokens_to_learn.csv", tables.speed, speed_mod.SPEED_COLUMNS),
        "learning_speed": ("learning_speed.csv", tables.speed_summary,
                           speed_mod.TABLE_COLUMNS),
        "learning_speed_comparisons": ("learning_speed_comparisons.csv",
                                       tables.speed_comparisons, speed_mod.COMPARISON_COLUMNS),
    }
