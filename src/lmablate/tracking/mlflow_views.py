"""The saved views of the MLflow UI that show a study: what
:class:`lmablate.tracking.mlflow_store.MlflowStore` writes on the experiment. Pure Python: nothing
here imports MLflow.

A saved view is an experiment tag ``mlflow.sharedViewState.<key>`` holding the runs page's state
as JSON, opened by the URL parameter ``viewStateShareKey=<key>`` (what the UI's Share button
saves): one view of the final runs (:func:`runs_view`), one per dataset
(:func:`dataset_view`) and one of each dataset's tuning trials (:func:`tuning_view`). What that state can and cannot do, as read in MLflow's UI source: the
handbook's MLflow UI, "How the views are built"."""

from __future__ import annotations

import json
from typing import Iterable, Mapping, Sequence
from urllib.parse import quote

VIEW_TAG_PREFIX = "mlflow.sharedViewState."
RUNS_VIEW_KEY = "final-runs"  # the study's table, grouped by dataset x variant
RUN_COLOR_TAG = "mlflow.runColor"  # a run's colour in every chart of the UI, "#rrggbb"

# the final runs of the study's variants, not those of the baseline tuned again
FINAL_FILTER = "tags.stage = 'final' AND tags.replicate = '0'"
CURVES = ("val_loss", "train_loss", "lr")  # logged at every evaluation step
# the summaries shown first, as bars, in this order (those a dataset has: answer_loss,
# exact_match and char_accuracy are arithmetic's)
HEADLINE = ("test_loss", "bits_per_char", "answer_loss", "exact_match", "char_accuracy",
            "test_loss_x4", "train_seconds")
PARAM_COLUMNS = ("d_model", "peak_lr", "steps")
RUN_NAME_COLUMN = "attributes.`Run Name`"
# "Created", always shown (no column id of its own: ag-grid names it after its field), narrowed
CREATED_COLUMN, CREATED_WIDTH = "runDateAndNestInfo", 116
# pixels: the group label "dataset: arithmetic, variant: baseline" in full, after the expander
# and the run count; a run's name "shakespeare-baseline-seed0"; a value's first digits
GROUPED_NAME_WIDTH, RUN_NAME_WIDTH, VALUE_WIDTH = 360, 230, 96
# the group label with its verdict label: "dataset: arithmetic, variant: rmsnorm, verdict: no
# significant difference: Δ +0.047 (+86.1%)"
GROUPED_VERDICT_WIDTH = 700
TAG_WIDTHS = {"dataset": 100, "variant": 80, "seed": 56}
# a final run's verdict in its dataset's headline loss (the report stage writes it); the runs
# view groups by it, so a group's label reads "dataset: arithmetic, variant: rope, verdict: ..."
VERDICT_TAG = "verdict"
BUDGET_TAG = "budget_flops"  # a final run's budget, training FLOPs (a scaling study has several)
BUDGET_WIDTH = 110
CHART_RUNS = 100  # runs a chart may draw: every final run of a dataset
# each tuning trial's objective value, the number the tuner compared (its run's last metric
# "objective": the final val_loss on text, the mean val answer loss over the run on arithmetic)
OBJECTIVE_METRIC = "objective"
TRIAL_PARAMS = ("peak_lr", "d_model", "budget_fraction")  # the axes before the objective
TRIAL_RUNS = 1000  # runs the trials' chart may draw: every trial of a dataset's variants
TUNING_VIEW_KEY = "tuning-trials"


def column(kind: str, key: str) -> str:
    """The UI's id of a column: ``<kind>.`<key>``` (kind ``tags``, ``params``, ``metrics``)."""
    return f"{kind}.`{key}`"


def view_tag(key: str) -> str:
    """The experiment tag that holds the saved view ``key``."""
    return VIEW_TAG_PREFIX + key


def dataset_view_key(dataset: str) -> str:
    """The key of the saved view of one dataset's final runs."""
    return f"{RUNS_VIEW_KEY}-{dataset}"


def view_url(experiment_id: str, key: str, charts: bool = False) -> str:
    """The part of the UI's URL after its address that opens saved view ``key``, in the
    model-training mode (``workflowType=machine_learning``: MLflow 3 opens its GenAI mode
    otherwise), on the chart tab with ``charts`` (``compareRunsMode=CHART``)."""
    url = (f"#/experiments/{experiment_id}/runs?viewStateShareKey={quote(key, safe='')}"
           "&workflowType=machine_learning")
    return url + "&compareRunsMode=CHART" if charts else url


def _line(uuid: str, metric: str, section: str) -> dict:
    # no custom title: MLflow 3.17 shows a card's displayName only behind a feature flag
    return {"uuid": uuid, "type": "LINE", "metricKey": metric, "selectedMetricKeys": [metric],
            "metricSectionId": section, "deleted": False, "isGenerated": False,
            "runsCountToCompare": CHART_RUNS, "lineSmoothness": 0, "scaleType": "linear",
            "xAxisScaleType": "linear", "xAxisKey": "step", "selectedXAxisMetricKey": "",
            "yAxisKey": "metric", "yAxisExpressions": [], "ignoreOutliers": False,
            "useGlobalXaxisKey": False, "useGlobalLineSmoothing": False,
            "range": {"xMin": None, "xMax": None, "yMin": None, "yMax": None}}


def _bar(uuid: str, metric: str, section: str) -> dict:
    return {"uuid": uuid, "type": "BAR", "metricKey": metric, "metricSectionId": section,
            "deleted": False, "isGenerated": False, "runsCountToCompare": CHART_RUNS}


def _charts(metrics: Iterable[str]) -> tuple[list[dict], list[dict]]:
    """Cards and sections: the curves by step (validation loss first, then training loss and
    learning rate: one row of three cards), then the headline summaries as bars; every other
    metric a bar in the closed section "Model metrics" (where the UI puts a chart it adds for a
    metric logged later)."""
    metrics = sorted(set(metrics) | {"val_loss"})
    headline = [m for m in HEADLINE if m in metrics]
    rest = [m for m in metrics if m not in CURVES and m not in headline]
    sections = [{"uuid": uuid, "name": name, "display": shown, "isReordered": True,
                 "deleted": False, "isGenerated": False}
                for uuid, name, shown in (("lmablate-curves", "Curves by step", True),
                                          ("lmablate-headline", "Test metrics", True),
                                          ("lmablate-more", "Model metrics", False))]
    cards = [_line(f"lmablate-{m}", m, "lmablate-curves") for m in CURVES]
    cards += [_bar(f"lmablate-{m}", m, "lmablate-headline") for m in headline]
    cards += [_bar(f"lmablate-{m}", m, "lmablate-more") for m in rest]
    return cards, sections


def _columns(first: Sequence[tuple[str, int]], metrics: Iterable[str]) -> dict:
    """selectedColumns, columnOrder and columnWidths: ``first`` (id, width; the run name
    first) on the left, then the headline metrics, then the params that say what was
    trained."""
    metrics = set(metrics)
    shown = ([column("metrics", m) for m in HEADLINE if m in metrics]
             + [column("params", p) for p in PARAM_COLUMNS])
    widths = dict(first[:1]) | {CREATED_COLUMN: CREATED_WIDTH} | dict(first[1:])
    widths |= {c: VALUE_WIDTH for c in shown}
    return {"selectedColumns": [c for c, _ in first[1:]] + shown,
            "columnOrder": list(widths), "columnWidths": widths}


def _base(search_filter: str) -> dict:
    # runListHidden: on the chart tab, the charts take the width of the page and their legends
    # name the runs in full (the arrow at the left opens the run list); the table tab is as is
    return {"searchFilter": search_filter, "orderByKey": "tags.`mlflow.runName`",
            "runListHidden": True,
            "orderByAsc": True, "runsHiddenMode": "SHOW_ALL", "hideEmptyCharts": True,
            "isAccordionReordered": True, "chartsSearchFilter": "",
            "globalLineChartConfig": {"xAxisKey": "step", "lineSmoothness": 0,
                                      "selectedXAxisMetricKey": ""}}


def group_id(dataset: str, variant: str) -> str:
    """The UI's id of the group of runs of ``dataset`` x ``variant`` (grouped by tags)."""
    return f"tag.dataset.{dataset},tag.variant.{variant}"


def runs_view(datasets: Sequence[str] = (), variants: Sequence[str] = (),
              metrics: Iterable[str] = (),
              budgets: Mapping[str, Sequence[str]] | None = None,
              verdicts: Mapping[str, str] | None = None) -> dict:
    """The study's table: the final runs grouped by dataset x variant, one row per group (the
    seeds' average), every group of ``datasets`` x ``variants`` closed; the group label, then
    dataset, variant and seed, then the headline metrics, then the params. Its charts draw one
    line or bar per group: validation loss first, then the summaries of ``metrics`` as bars.

    ``budgets``: in a scaling study, the ``budget_flops`` tag values of each dataset with
    several; the groups are then dataset x variant x budget (a mean over budgets would mix
    runs of different compute) and the budget is a column after the variant.

    ``verdicts`` (``"<dataset>/<variant>"`` -> verdict, the runs' tag :data:`VERDICT_TAG`):
    the groups are dataset x variant x verdict, whose label then carries the verdict (one
    verdict per dataset x variant: no mean is split)."""
    tags = dict(TAG_WIDTHS)
    keys = [{"mode": "tag", "groupByData": "dataset"}, {"mode": "tag", "groupByData": "variant"}]
    groups = {group_id(d, v): False for d in datasets for v in variants}
    if budgets:
        tags = {"dataset": TAG_WIDTHS["dataset"], "variant": TAG_WIDTHS["variant"],
                BUDGET_TAG: BUDGET_WIDTH, "seed": TAG_WIDTHS["seed"]}
        keys.append({"mode": "tag", "groupByData": BUDGET_TAG})
        groups = {f"{group_id(d, v)},tag.{BUDGET_TAG}.{b}": False for d in datasets
                  for v in variants for b in budgets.get(d, ())}
    elif verdicts:
        tags = {"seed": TAG_WIDTHS["seed"]}  # dataset and variant: in the group's label
        keys.append({"mode": "tag", "groupByData": VERDICT_TAG})
        groups = {f"{group_id(d, v)},tag.{VERDICT_TAG}.{verdicts[f'{d}/{v}']}": False
                  for d in datasets for v in variants if f"{d}/{v}" in verdicts}
    width = GROUPED_VERDICT_WIDTH if verdicts and not budgets else GROUPED_NAME_WIDTH
    first = [(RUN_NAME_COLUMN, width)] + [(column("tags", t), w) for t, w in tags.items()]
    cards, sections = _charts(metrics)
    return {**_base(FINAL_FILTER), **_columns(first, metrics),
            "groupBy": {"aggregateFunction": "average", "groupByKeys": keys},
            "groupsExpanded": groups,
            "useGroupedValuesInCharts": True,
            "compareRunCharts": cards, "compareRunSections": sections}


def _check_quotes(dataset: str) -> None:
    """Raises ValueError: ``dataset`` holds a quote, which a search filter cannot hold."""
    if "'" in dataset:
        raise ValueError(f"dataset name {dataset!r} holds a quote; MLflow's filter cannot")


def dataset_view(dataset: str, metrics: Iterable[str] = (), budgets: bool = False) -> dict:
    """One dataset's final runs, one row and one line per seed, sorted by name (so by variant,
    then budget in a scaling study, whose ``budgets`` are then a column): each run drawn in its
    ``mlflow.runColor``. Validation loss by step first, then the summaries of ``metrics`` as
    bars.

    Raises:
        ValueError: ``dataset`` holds a quote, which the search filter cannot hold.
    """
    _check_quotes(dataset)
    first = [(RUN_NAME_COLUMN, RUN_NAME_WIDTH), (column("tags", "variant"), TAG_WIDTHS["variant"]),
             *([(column("tags", BUDGET_TAG), BUDGET_WIDTH)] if budgets else []),
             (column("tags", "seed"), TAG_WIDTHS["seed"])]
    cards, sections = _charts(metrics)
    return {**_base(f"{FINAL_FILTER} AND tags.dataset = '{dataset}'"), **_columns(first, metrics),
            "groupBy": None, "useGroupedValuesInCharts": False,
            "compareRunCharts": cards, "compareRunSections": sections}


def tuning_view_key(dataset: str) -> str:
    """The key of the saved view of one dataset's tuning trials."""
    return f"{TUNING_VIEW_KEY}-{dataset}"


def tuning_view(dataset: str, metrics: Iterable[str] = ()) -> dict:
    """One dataset's tuning trials (replicate 0; every variant, rung and tuning seed), one
    row each, sorted by name, with their learning rate, width, share of the budget and
    objective value as columns; the chart tab draws them as parallel coordinates over
    :data:`TRIAL_PARAMS` and :data:`OBJECTIVE_METRIC`, so the learning rate and width that
    gave each objective value are read at a glance, the full-budget trials apart from the
    first rung's by their budget share. The trials' other ``metrics`` get a card each in the
    closed section "Trial metrics" (the UI adds a chart for a metric without one).

    Raises:
        ValueError: ``dataset`` holds a quote, which the search filter cannot hold.
    """
    _check_quotes(dataset)
    first = [(RUN_NAME_COLUMN, RUN_NAME_WIDTH), (column("tags", "variant"), TAG_WIDTHS["variant"]),
             (column("tags", "rung"), TAG_WIDTHS["seed"])]
    shown = [column("params", p) for p in TRIAL_PARAMS] + [column("metrics", OBJECTIVE_METRIC)]
    widths = dict(first[:1]) | {CREATED_COLUMN: CREATED_WIDTH} | dict(first[1:])
    widths |= {c: VALUE_WIDTH for c in shown}
    sections = [{"uuid": uuid, "name": name, "display": shown, "isReordered": True,
                 "deleted": False, "isGenerated": False}
                for uuid, name, shown in (("lmablate-trials", "Tuning trials", True),
                                          ("lmablate-trial-metrics", "Trial metrics", False))]
    cards = [{"uuid": "lmablate-parallel", "type": "PARALLEL",
              "metricSectionId": sections[0]["uuid"], "selectedParams": list(TRIAL_PARAMS),
              "selectedMetrics": [OBJECTIVE_METRIC], "showAllRuns": True,
              "runsCountToCompare": TRIAL_RUNS, "deleted": False, "isGenerated": False}]
    for m in sorted(set(metrics) | {OBJECTIVE_METRIC}):
        card = (_line if m in CURVES else _bar)(f"lmablate-trial-{m}", m, sections[1]["uuid"])
        cards.append({**card, "runsCountToCompare": TRIAL_RUNS})
    search = (f"tags.stage = 'tune' AND tags.dataset = '{dataset}' AND tags.replicate = '0' "
              "AND attributes.run_name LIKE 'trial-%'")
    return {**_base(search), "selectedColumns": [c for c, _ in first[1:]] + shown,
            "columnOrder": list(widths), "columnWidths": widths,
            "groupBy": None, "useGroupedValuesInCharts": False,
            "compareRunCharts": cards, "compareRunSections": sections}


def study_views(datasets: Sequence[str], variants: Sequence[str],
                metrics: Mapping[str, Iterable[str]],
                budgets: Mapping[str, Sequence[str]] | None = None,
                verdicts: Mapping[str, str] | None = None,
                trial_metrics: Mapping[str, Iterable[str]] | None = None) -> dict[str, str]:
    """Every saved view of a study, as experiment tag -> JSON: :func:`runs_view`, and one
    :func:`dataset_view` and one :func:`tuning_view` per dataset; ``metrics`` maps a dataset to the metric keys its final
    runs logged, ``budgets`` a scaling study's dataset to its ``budget_flops`` tag values
    (only datasets with several), ``verdicts`` each dataset x variant's verdict
    (:func:`runs_view`), ``trial_metrics`` a dataset to the metric keys its tuning trials
    logged (:func:`tuning_view`)."""
    budgets = {d: list(b) for d, b in (budgets or {}).items() if len(b) > 1}
    views = {RUNS_VIEW_KEY: runs_view(datasets, variants,
                                      {m for d in datasets for m in metrics.get(d, ())},
                                      budgets, verdicts)}
    views.update({dataset_view_key(d): dataset_view(d, metrics.get(d, ()), d in budgets)
                  for d in datasets})
    views.update({tuning_view_key(d): tuning_view(d, (trial_metrics or {}).get(d, ()))
                  for d in datasets})
    return {view_tag(k): json.dumps(v, sort_keys=True) for k, v in views.items()}
