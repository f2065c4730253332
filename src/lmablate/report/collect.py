"""``runs/<dataset>/<variant>/`` (replicate r's: ``.../replicate_<r>/``) read into one
:class:`RunOutputs`, in the study order, set here once: every frame's ``dataset`` and ``variant``
are ordered categoricals (datasets in config order; ``baseline`` first, then the configured
variants), and every table, figure and section follows them without sorting again.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import pandas as pd

from lmablate.config.study import StudyConfig, budget_label
from lmablate.core import fileio
from lmablate.report.run_files import (
    ABLATION_COLUMNS, ANSWER_DIGITS_COLUMNS, EXTRAPOLATION_COLUMNS, OPERAND_DIGITS_COLUMNS,
    PER_OP_COLUMNS, POSITION_LOSS_COLUMNS, TUNED_COLUMNS, at_headline,
    read_csv_tagged, read_metrics, tuned_row, typed_columns, typed_numbers)

BASELINE = "baseline"  # the variant every other is compared with; first in every table


def _empty(columns: Sequence[str] | None = None) -> Any:
    """A dataclass field whose default is an empty frame of ``columns``."""
    return dataclasses.field(default_factory=lambda: pd.DataFrame(columns=columns))


@dataclass(frozen=True, eq=False)
class RunOutputs:
    """Everything the stages wrote under ``runs/``, one frame per kind of file, each with
    categorical ``dataset``/``variant`` columns; a file no run wrote gives an empty frame.
    ``eq=False``: frames have no truth value. Units: losses nats/char (``answer_loss`` nats per
    answer character), accuracies fractions, seconds, tokens, FLOPs; NaN where not applicable.

    Attributes:
        ablation: per dataset x variant x seed, :data:`ABLATION_COLUMNS`, sorted.
        history, trials, grad: ``history.csv``, ``trials.csv`` (Optuna's) and
            ``grad_stats.csv`` stacked, in file order (figures draw in row order).
        per_op, by_operand_digits, by_answer_digits: arithmetic results per operation, operand
            and answer length (``note`` says why a length has none).
        samples, predictions: ``{(dataset, variant): {"seed_<n>": [...]}}``, generated text or
            ``{"prompt", "target", "prediction"}`` dicts.
        tuned: ``best.json`` per dataset x variant, :data:`TUNED_COLUMNS`.
        extrapolation, position_loss: test loss at multiples of the context, and by position.
        scaling, scaling_trials, scaling_tuned: every budget's runs, trials and tuning (a
            scaling study); every other frame holds the headline (largest) budget only.
    """

    ablation: pd.DataFrame
    history: pd.DataFrame
    trials: pd.DataFrame
    grad: pd.DataFrame
    per_op: pd.DataFrame
    samples: dict[tuple[str, str], dict[str, list[str]]]
    predictions: dict[tuple[str, str], dict[str, list[dict[str, str]]]]
    tuned: pd.DataFrame = _empty(TUNED_COLUMNS)
    extrapolation: pd.DataFrame = _empty(EXTRAPOLATION_COLUMNS)
    position_loss: pd.DataFrame = _empty(POSITION_LOSS_COLUMNS)
    by_operand_digits: pd.DataFrame = _empty(OPERAND_DIGITS_COLUMNS)
    by_answer_digits: pd.DataFrame = _empty(ANSWER_DIGITS_COLUMNS)
    scaling: pd.DataFrame = _empty(ABLATION_COLUMNS)
    scaling_trials: pd.DataFrame = _empty()
    scaling_tuned: pd.DataFrame = _empty(["budget_flops", *TUNED_COLUMNS])


FRAMES = ("ablation", "history", "trials", "grad", "per_op", "tuned", "extrapolation",
          "position_loss", "by_operand_digits", "by_answer_digits", "scaling", "scaling_trials",
          "scaling_tuned")


def variant_order(variants: Iterable[str], configured: Sequence[str] = ()) -> list[str]:
    """``variants`` (duplicates dropped) with ``baseline`` first, then those in ``configured``
    in that order, then any others alphabetically."""
    present = set(variants)
    head = [v for v in dict.fromkeys([BASELINE, *configured]) if v in present]
    return head + sorted(present - set(head))


def present(values: pd.Series) -> list[str]:
    """The values that occur in ``values``, in its categorical order (in order of first
    appearance for a plain column). Unobserved categories are left out."""
    if isinstance(values.dtype, pd.CategoricalDtype):
        seen = set(values.dropna())
        return [str(c) for c in values.cat.categories if c in seen]
    return [str(v) for v in pd.unique(values.dropna())]


def rows_of(frame: pd.DataFrame, dataset: str, variant: str) -> pd.DataFrame:
    """The rows of ``frame`` of one dataset x variant."""
    return frame[(frame["dataset"] == dataset) & (frame["variant"] == variant)]


def _categorical(values: pd.Series, order: Sequence[str]) -> pd.Series:
    return pd.Series(pd.Categorical(values.astype(str), categories=list(order), ordered=True),
                     index=values.index, name=values.name)


def with_order(df: pd.DataFrame, datasets: Sequence[str] | None = None,
               variants: Sequence[str] | None = None) -> pd.DataFrame:
    """``df`` with ``dataset``/``variant`` as ordered categoricals of ``datasets``/``variants``
    (None: keep a categorical, order a plain column by first appearance). Rows are not moved.

    Raises:
        ValueError: a value of ``df`` is not among the given categories.
    """
    out = df.copy()
    for col, order in (("dataset", datasets), ("variant", variants)):
        if col not in out:
            continue
        if order is None:
            if isinstance(out[col].dtype, pd.CategoricalDtype):
                continue
            order = present(out[col])
        extra = sorted(set(out[col].astype(str)) - set(order))
        if extra:
            raise ValueError(f"{col} {', '.join(extra)} not among the categories {list(order)}")
        out[col] = _categorical(out[col], order)
    return out


def _stack(frames: list[pd.DataFrame]) -> pd.DataFrame:
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


# The frames sorted in the study order, and the columns they are sorted by
_SORT_KEYS = {"ablation": ["dataset", "variant", "seed"], "tuned": ["dataset", "variant"],
              "scaling": ["dataset", "variant", "budget_flops", "seed"],
              **dict.fromkeys(("by_operand_digits", "by_answer_digits"),
                              ["dataset", "variant", "seed", "digits"])}


def _ordered(runs: RunOutputs, datasets: Sequence[str], variants: Sequence[str]) -> RunOutputs:
    """``runs`` with the study order set on every frame; the ablation table sorted by it."""
    frames = {f: with_order(getattr(runs, f), datasets, variants) for f in FRAMES}
    for f, keys in _SORT_KEYS.items():
        frames[f] = frames[f].sort_values(keys, kind="stable", ignore_index=True)
    return dataclasses.replace(runs, **frames)


def replicate_folder(replicate: int) -> str:
    """The folder of replicate r > 0 inside ``<runs>/<dataset>/<variant>/``."""
    return f"replicate_{replicate}"


def _read_stage_csvs(run_dir: Path, dataset: str, variant: str, headline: float | None,
                     parts: dict[str, list]) -> None:
    """Append the run's stage CSVs (headline budget) to ``parts``, every budget's trials too."""
    for file, name in (("history.csv", "history"), ("trials.csv", "trials"),
                       ("grad_stats.csv", "grad")):
        df = read_csv_tagged(run_dir / file, dataset, variant)
        if name == "trials" and df is not None:
            parts["scaling_trials"].append(df)
        df = at_headline(df, headline)
        if df is not None:
            parts[name].append(df)


def _read_tuned(run_dir: Path, named: Path, dataset: str, variant: str) -> list[dict]:
    """Every tuned budget of the run's ``best.json`` as a :func:`tuned_row`; none without it.

    Raises:
        ValueError: the file was tuned for another folder's run (its Optuna study name).
    """
    path = run_dir / "best.json"
    if not path.is_file():
        return []
    best = fileio.read_json(path)
    entries = best.get("budgets", [best])
    for entry in entries:  # tuned for this folder's run
        name = str(entry.get("study_name") or f"{dataset}-{variant}-")
        if not name.startswith(f"{named.parent.name}-{named.name}-"):
            raise ValueError(f"{path}: tuned as Optuna study {name}, "
                             f"not for {named.parent.name} {named.name} (its "
                             "folder); run lmablate tune (or dvc repro) again")
    return [tuned_row(dataset, variant, b) for b in entries]


def _read_examples(run_dir: Path, headline: float | None) -> dict[str, list] | None:
    """The run's ``examples.json`` by ``seed_<n>`` (headline budget); None without it."""
    path = run_dir / "examples.json"
    if not path.is_file():
        return None
    # a scaling study's keyed "<budget label>/seed_<s>", of which the headline budget's are kept
    keep = ("",) if headline is None else ("", budget_label(headline))
    return {k.rpartition("/")[2]: v for k, v in fileio.read_json(path).items()
            if k.rpartition("/")[0] in keep}


# frames built from row dicts: their columns and typing
_ROW_FRAMES = {
    "ablation": (ABLATION_COLUMNS, typed_columns), "scaling": (ABLATION_COLUMNS, typed_columns),
    "per_op": (PER_OP_COLUMNS, typed_numbers),
    "extrapolation": (EXTRAPOLATION_COLUMNS, typed_numbers),
    "position_loss": (POSITION_LOSS_COLUMNS, typed_numbers),
    "by_operand_digits": (OPERAND_DIGITS_COLUMNS, typed_numbers),
    "by_answer_digits": (ANSWER_DIGITS_COLUMNS, typed_numbers),
    "tuned": (TUNED_COLUMNS, None), "scaling_tuned": (["budget_flops", *TUNED_COLUMNS], None)}
_STACKED_FRAMES = ("history", "trials", "grad", "scaling_trials")


def _run_outputs(parts: dict[str, list], samples: dict, predictions: dict) -> RunOutputs:
    """The :class:`RunOutputs` of ``parts``: datasets alphabetical, :func:`variant_order`."""
    frames = {name: _stack(parts[name]) for name in _STACKED_FRAMES}
    for name, (columns, typed) in _ROW_FRAMES.items():
        df = pd.DataFrame(parts[name], columns=columns)
        frames[name] = typed(df) if typed else df
    runs = RunOutputs(samples=samples, predictions=predictions, **frames)
    found = [runs.ablation, runs.history, runs.trials, runs.grad, runs.per_op, runs.tuned]
    datasets = sorted({str(d) for f in found if "dataset" in f for d in f["dataset"]})
    variants = variant_order(str(v) for f in found if "variant" in f for v in f["variant"])
    return _ordered(runs, datasets, variants)


def collect(runs_dir: Path, replicate: int = 0) -> RunOutputs:
    """Every ``<runs_dir>/<dataset>/<variant>/`` (replicate r > 0: its ``replicate_<r>/``)
    with a ``metrics.json``, with its optional ``history.csv``, ``trials.csv``,
    ``grad_stats.csv``, ``best.json`` and ``examples.json`` (missing: empty frames).

    Raises:
        ValueError: a ``metrics.json`` or ``examples.json`` is not valid JSON.
    """
    parts: dict[str, list] = defaultdict(list)  # frame name -> its rows or stacked frames
    samples: dict[tuple[str, str], dict] = {}
    predictions: dict[tuple[str, str], dict] = {}
    pattern = f"*/*/{replicate_folder(replicate)}/metrics.json" if replicate else "*/*/metrics.json"
    for metrics_path in sorted(Path(runs_dir).glob(pattern)):
        run_dir = metrics_path.parent
        # the <dataset>/<variant>/ folder that names the run
        named = run_dir if not replicate else run_dir.parent
        dataset, variant, seed_rows, more, headline = read_metrics(metrics_path, named)
        parts["ablation"] += seed_rows
        for name, rows in more.items():
            parts[name] += rows
        _read_stage_csvs(run_dir, dataset, variant, headline, parts)
        entries = _read_tuned(run_dir, named, dataset, variant)
        parts["scaling_tuned"] += entries
        parts["tuned"] += [e for e in entries if e["budget_flops"] in (None, headline)][-1:]
        examples = _read_examples(run_dir, headline)
        if examples is not None:
            first = next((v[0] for v in examples.values() if v), None)
            sink = predictions if isinstance(first, dict) else samples
            sink[(dataset, variant)] = examples
    return _run_outputs(parts, samples, predictions)


# results a section reads: where one seed of a dataset has one, every seed must
_NEEDED_RESULTS = ("val_loss", "test_loss", "answer_loss", "exact_match", "char_accuracy")


def run_folder(runs_dir: Path, dataset: str, variant: str, replicate: int = 0) -> Path:
    """``<runs_dir>/<dataset>/<variant>/`` of replicate 0, or its ``replicate_<r>/``."""
    folder = Path(runs_dir) / dataset / variant
    return folder / replicate_folder(replicate) if replicate else folder


def check_complete(runs: RunOutputs, runs_dir: Path, replicate: int = 0) -> None:
    """Refuse a run lacking what the others of its dataset have (a result of
    :data:`_NEEDED_RESULTS`, ``history.csv`` rows, ``val_exact_match``), so no section silently
    leaves a seed out.

    Raises:
        ValueError: one line naming the file, the seed and the field that is missing.
    """
    a = runs.ablation
    for ds in present(a["dataset"]):
        d = a[a["dataset"] == ds]
        for field in _NEEDED_RESULTS:
            lacking = d[d[field].isna()]
            if d[field].notna().any() and len(lacking):
                r = lacking.iloc[0]
                raise ValueError(
                    f"{run_folder(runs_dir, ds, str(r.variant), replicate) / 'metrics.json'}: "
                    f"seed {r.seed} has no {field}, which the other runs of {ds} have and "
                    "the report compares; run the evaluate stage of this dataset and variant "
                    "again")
        h = runs.history
        h = h[h["dataset"] == ds] if len(h) else h
        if h.empty:
            continue
        # the (variant, seed) pairs with history rows, and with an answer probe, once
        has_rows = set(zip(h["variant"].astype(str), h["seed"]))
        probed = h.dropna(subset=["val_exact_match"]) if "val_exact_match" in h else h.iloc[:0]
        has_probe = set(zip(probed["variant"].astype(str), probed["seed"]))
        for r in d.itertuples():
            key = (str(r.variant), r.seed)
            missing = ("rows" if key not in has_rows else "val_exact_match"
                       if has_probe and key not in has_probe else None)
            if missing:
                raise ValueError(
                    f"{run_folder(runs_dir, ds, str(r.variant), replicate) / 'history.csv'}: "
                    f"seed {r.seed} has no {missing}, which the other runs of {ds} have and "
                    "the report's curves and learning speed need; run the train stage of "
                    "this dataset and variant again")


def _restrict_to_study(cfg: StudyConfig, ablation: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Keep the runs the config asks for; describe missing and ignored (stale) runs."""
    notes = []
    keep = (ablation["dataset"].isin(list(cfg.datasets))
            & ablation["variant"].isin(list(cfg.study_variants))
            & ablation["seed"].isin(list(cfg.seeds)))
    ignored = ablation[~keep]
    if len(ignored):
        names = sorted({f"{r.dataset}/{r.variant}/seed {r.seed}" for r in ignored.itertuples()})
        notes.append(f"{len(ignored)} run(s) under the runs directory are not part of the "
                     f"configured study and were ignored: {', '.join(names[:10])}"
                     f"{' ...' if len(names) > 10 else ''}.")
    kept = ablation[keep]
    found = set(zip(kept["dataset"], kept["variant"], kept["seed"].astype(int)))
    missing = [f"{d}/{v}/seed {s}" for d in cfg.datasets for v in cfg.study_variants
               for s in cfg.seeds if (d, v, s) not in found]
    if missing:
        notes.append(f"{len(missing)} configured run(s) have no results: "
                     f"{', '.join(missing[:10])}{' ...' if len(missing) > 10 else ''}.")
    return kept, notes


def _filter(df: pd.DataFrame, cfg: StudyConfig, by_seed: bool = True) -> pd.DataFrame:
    """The rows of ``df`` of the configured datasets, variants and (``by_seed``) seeds."""
    if df.empty:
        return df
    keep = df["dataset"].isin(list(cfg.datasets)) & df["variant"].isin(list(cfg.study_variants))
    if by_seed and "seed" in df:
        keep &= df["seed"].isin(list(cfg.seeds))
    return df[keep]


def restrict_to_study(cfg: StudyConfig, runs: RunOutputs) -> tuple[RunOutputs, list[str]]:
    """``(runs, notes)``: the runs of the configured datasets x variants x seeds in the
    config's order, and sentences naming the ignored (stale) and the missing runs."""
    ablation, notes = _restrict_to_study(cfg, runs.ablation)

    def configured(by_run: dict[tuple[str, str], Any]) -> dict[tuple[str, str], Any]:
        return {(d, v): x for (d, v), x in by_run.items()
                if d in cfg.datasets and v in cfg.study_variants}

    # a trial's seed is a tuning seed, never one of study.seeds
    kept = dataclasses.replace(
        runs, ablation=ablation, samples=configured(runs.samples),
        predictions=configured(runs.predictions),
        **{f: _filter(getattr(runs, f), cfg, by_seed=f not in ("trials", "scaling_trials"))
           for f in FRAMES if f != "ablation"})
    variants = variant_order(cfg.study_variants, cfg.study_variants)
    return _ordered(kept, list(cfg.datasets), variants), notes
