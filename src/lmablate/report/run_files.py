"""The stage files under ``runs/<dataset>/<variant>/`` read into rows: the columns of every frame
of :class:`lmablate.report.collect.RunOutputs`, one ``metrics.json``, CSV or ``best.json`` at a
time; impossible values are refused where they are read."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from lmablate.core import fileio
from lmablate.core.validation import short_repr

ABLATION_COLUMNS = [
    "dataset", "variant", "seed", "n_params", "n_params_non_embedding", "flops_per_token", "lr",
    "d_model", "steps", "tokens", "train_flops", "budget_flops", "val_loss", "test_loss",
    "answer_loss", "perplexity", "bits_per_char", "char_accuracy", "exact_match",
    "train_seconds", "tokens_per_second",
]
# nullable Int64 when integral, so the CSV shows 104321, not 104321.0
_INTEGER_COLUMNS = ("seed", "n_params", "n_params_non_embedding", "flops_per_token", "d_model",
                    "steps", "tokens", "train_flops", "budget_flops")
# not in metrics.json (they differ between runs): from checkpoints/seed_<s>/result.json
TIMING_COLUMNS = ("train_seconds", "tokens_per_second")
PER_OP_COLUMNS = ["dataset", "variant", "seed", "op", "char_accuracy", "exact_match",
                  "answer_loss", "n"]
# split: "test" up to the training digits, "length" past them; note: why a length has none
OPERAND_DIGITS_COLUMNS = ["dataset", "variant", "seed", "digits", "split", "exact_match",
                          "char_accuracy", "answer_loss", "n", "note"]
ANSWER_DIGITS_COLUMNS = ["dataset", "variant", "seed", "digits", "exact_match",
                         "char_accuracy", "answer_loss", "n"]
# test loss on windows of factor x context_length tokens (note: why none); loss per position
EXTRAPOLATION_COLUMNS = ["dataset", "variant", "seed", "factor", "length", "test_loss", "note"]
POSITION_LOSS_COLUMNS = ["dataset", "variant", "seed", "factor", "position", "loss"]
# best.json's full-budget bracket (tune/bracket.py); empty without one
BRACKET_COLUMNS = ["bracket_state", "n_points", "fit_used", "fit_a", "fit_b", "fit_c",
                   "seed_spread", "seed_spread_pooled", "regret", "tuning_uncertainty",
                   "lr_sensitivity_full", "widths_compared"]
# best.json per dataset x variant; val_loss: the chosen trial's value of its ``objective``
TUNED_COLUMNS = ["dataset", "variant", "lr", "d_model", "val_loss", "objective", "full_budget",
                 "on_edge", "extended", "lr_low", "lr_high", "d_model_choices", "n_trials",
                 "n_complete", "n_diverged", *BRACKET_COLUMNS]


# a loss is a cross-entropy (>= 0), a perplexity its exp (>= 1), an accuracy a fraction
LOSS_FIELDS = ("val_loss", "test_loss", "answer_loss", "bits_per_char")
FRACTION_FIELDS = ("char_accuracy", "exact_match")


def impossible(field: str, value: Any) -> str | None:
    """Why ``value`` cannot be a seed's ``field``, or None when it can (None can)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "not a number"
    if not np.isfinite(value):
        return "not finite"
    if field in LOSS_FIELDS and value < 0:
        return "a loss is a cross-entropy, at least 0"
    if field == "perplexity" and value < 1:
        return "a perplexity is exp(loss), at least 1"
    if field in FRACTION_FIELDS and not 0 <= value <= 1:
        return "a fraction lies in [0, 1]"
    return None


def check_run(path: Path, key: str, run: Mapping[str, Any]) -> None:
    """Refuse ``runs.<key>`` of the ``metrics.json`` at ``path`` if :func:`impossible`.

    Raises:
        ValueError: one line naming the file, the field and the value.
    """
    for field in (*LOSS_FIELDS, "perplexity", *FRACTION_FIELDS):
        why = impossible(field, run.get(field))
        if why:
            raise ValueError(f"{path}: runs.{key}.{field} = {short_repr(run[field])} "
                             f"is impossible ({why}); run the evaluate stage of this "
                             "dataset and variant again")


def _seed_of(key: str, run: Mapping[str, Any]) -> int:
    """The run's seed: its ``seed`` field, else the number in its ``seed_<n>`` key."""
    if run.get("seed") is not None:
        return int(run["seed"])
    return int(str(key).rsplit("_", 1)[-1])


def maybe_int(series: pd.Series) -> pd.Series:
    """``series`` as nullable ``Int64`` when every value is integral, else float."""
    values = pd.to_numeric(series, errors="coerce")
    finite = values.dropna()
    if len(finite) and np.all(np.isclose(finite, np.round(finite))):
        return values.round().astype("Int64")
    return values.astype(float)


def read_csv_tagged(path: Path, dataset: str, variant: str) -> pd.DataFrame | None:
    """The CSV at ``path`` with ``dataset`` and ``variant`` columns first; None if absent."""
    if not path.is_file():
        return None
    df = pd.read_csv(path)
    df.insert(0, "variant", variant)
    df.insert(0, "dataset", dataset)
    return df


def _extrapolation_rows(dataset: str, variant: str, seed: int, run: Mapping[str, Any]
                        ) -> tuple[list[dict], list[dict]]:
    """A seed's ``extrapolation`` as rows of both extrapolation frames."""
    rows, buckets = [], []
    for key, r in (run.get("extrapolation") or {}).items():
        factor = int(key.removeprefix("x"))
        base = {"dataset": dataset, "variant": variant, "seed": seed, "factor": factor}
        if not isinstance(r, dict):
            rows.append({**base, "length": None, "test_loss": None, "note": str(r)})
            continue
        rows.append({**base, "length": r["length"], "test_loss": r["test_loss"], "note": ""})
        buckets += [{**base, "position": i * r["bucket"], "loss": loss}
                    for i, loss in enumerate(r["position_loss"])]
    return rows, buckets


def typed_numbers(df: pd.DataFrame) -> pd.DataFrame:
    """A row frame with integer counts and float losses and accuracies."""
    for col in df.columns:
        if col in ("seed", "factor", "length", "position", "digits", "n"):
            df[col] = maybe_int(df[col])
        elif col in ("test_loss", "loss", "answer_loss", "exact_match", "char_accuracy"):
            df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
    return df


def _digit_rows(base: dict, entries: Mapping[str, Any] | None,
                columns: Sequence[str]) -> list[dict]:
    """A seed's ``by_*_digits`` (digits -> results, or why none) as rows of ``columns``."""
    rows = []
    for key, r in (entries or {}).items():
        row = {**base, "digits": int(key)}
        if isinstance(r, dict):
            row.update({c: r.get(c) for c in columns[4:] if c != "note"}, note="")
        else:
            row["note"] = str(r)
        rows.append({c: row.get(c) for c in columns})
    return rows


def _budget_of(run: Mapping[str, Any]) -> float | None:
    """A run's budget (training FLOPs), or None."""
    value = run.get("budget_flops")
    return None if value is None else float(value)


def check_made_for(path: Path, made: str, labels: tuple[str, str], run_dir: Path) -> None:
    """Refuse a file of ``run_dir`` (``<dataset>/<variant>/``) whose ``labels`` (dataset,
    variant) name another run (a file copied into another variant's folder).

    Raises:
        ValueError: the labels differ from the folders' names (the message names both).
    """
    folders = (run_dir.parent.name, run_dir.name)
    if labels != folders:
        raise ValueError(f"{path}: {made} for {' '.join(labels)}, not {' '.join(folders)} (its "
                         "folder); run the stage that writes it again for "
                         f"{' '.join(folders)}")


def read_metrics(metrics_path: Path, run_dir: Path | None = None
                  ) -> tuple[str, str, list[dict], dict[str, list[dict]], float | None]:
    """One ``metrics.json``: ``(dataset, variant, seed rows, {frame name: rows}, headline)``,
    the rows of the ``headline`` (largest) budget but ``"scaling"``'s, of every budget. Seed rows
    have :data:`ABLATION_COLUMNS`, timings from ``checkpoints/[<budget>/]seed_<s>/result.json``.

    Raises:
        ValueError: a seed listed twice, an impossible value, or another run's file."""
    run_dir = run_dir or metrics_path.parent
    doc = fileio.read_json(metrics_path)
    dataset = str(doc.get("dataset") or run_dir.parent.name)
    variant = str(doc.get("variant") or run_dir.name)
    check_made_for(metrics_path, "evaluated", (dataset, variant), run_dir)
    rows, per_op_rows, scaling = [], [], []
    more: dict[str, list[dict]] = {"per_op": per_op_rows, "extrapolation": [],
                                   "position_loss": [], "by_operand_digits": [],
                                   "by_answer_digits": [], "scaling": scaling}
    runs = doc.get("runs") or {}
    budgets = [b for b in map(_budget_of, runs.values()) if b is not None]
    headline = max(budgets, default=None)
    seen: dict[tuple[float | None, int], str] = {}  # (budget, seed) -> its key
    for key, run in runs.items():
        seed = _seed_of(key, run)
        check_run(metrics_path, key, run)
        twice = seen.setdefault((_budget_of(run), seed), key)
        if twice != key:
            raise ValueError(f"{metrics_path}: seed {seed} is listed twice (runs.{twice} and "
                             f"runs.{key}); pairing by seed needs each seed once: run the "
                             "evaluate stage of this dataset and variant again")
        row = {col: run.get(col) for col in ABLATION_COLUMNS[3:]}
        # a scaling study's runs are keyed "<budget label>/seed_<s>", as their checkpoints
        folder = str(key).rpartition("/")[0]
        result_path = (metrics_path.parent / "checkpoints" / folder / f"seed_{seed}"
                       / "result.json")
        if result_path.is_file():
            summary = fileio.read_json(result_path).get("summary", {})
            row.update({col: summary.get(col, row[col]) for col in TIMING_COLUMNS})
        scaling.append({"dataset": dataset, "variant": variant, "seed": seed, **row})
        if _budget_of(run) != headline:
            continue
        rows.append(scaling[-1])
        e_rows, p_rows = _extrapolation_rows(dataset, variant, seed, run)
        more["extrapolation"] += e_rows
        more["position_loss"] += p_rows
        base = {"dataset": dataset, "variant": variant, "seed": seed}
        more["by_operand_digits"] += _digit_rows(base, run.get("by_operand_digits"),
                                                 OPERAND_DIGITS_COLUMNS)
        more["by_answer_digits"] += _digit_rows(base, run.get("by_answer_digits"),
                                                ANSWER_DIGITS_COLUMNS)
        for op, values in (run.get("per_op") or {}).items():
            per_op_rows.append({**base, "op": op, **{c: (values or {}).get(c)
                                                     for c in PER_OP_COLUMNS[4:]}})
    return dataset, variant, rows, more, headline


def at_headline(df: pd.DataFrame | None, headline: float | None) -> pd.DataFrame | None:
    """The rows of a stage CSV at the ``headline`` budget (all where it has no budget)."""
    if df is None or headline is None or "budget_flops" not in df:
        return df
    return df[np.isclose(df["budget_flops"].astype(float), headline)].reset_index(drop=True)


def tuned_row(dataset: str, variant: str, best: Mapping[str, Any]) -> dict:
    """One tuned budget of ``best.json`` as a row of ``budget_flops`` + :data:`TUNED_COLUMNS`."""
    lr_range = best.get("lr_range") or [None, None]
    return {"budget_flops": best.get("budget_flops"), "dataset": dataset, "variant": variant,
            **{c: best.get(c) for c in TUNED_COLUMNS[2:]},
            "objective": best.get("objective", "val_loss"),
            "on_edge": "; ".join(best.get("on_edge") or []),
            "extended": "; ".join(best.get("extended") or []),
            "lr_low": lr_range[0], "lr_high": lr_range[1],
            "d_model_choices": " ".join(str(d) for d in best.get("d_model_choices") or []),
            **bracket_columns(best.get("bracket"))}


def bracket_columns(bracket: Mapping[str, Any] | None) -> dict:
    """:data:`BRACKET_COLUMNS` of best.json's ``bracket`` (all None without one)."""
    if not bracket:
        return dict.fromkeys(BRACKET_COLUMNS)
    a, b, c = bracket["fit"]["coefficients"] or (None, None, None)
    return {"bracket_state": bracket["state"], "n_points": len(bracket["points"]),
            "fit_used": bracket["fit"]["used"], "fit_a": a, "fit_b": b, "fit_c": c,
            "seed_spread": bracket["seed_spread"], "seed_spread_pooled": None,
            "regret": bracket["regret"],
            "tuning_uncertainty": bracket["uncertainty"],
            "lr_sensitivity_full": bracket["sensitivity"],
            "widths_compared": "; ".join(
                f"{d}: " + ("diverged" if x is None else f"{x:.4f}")
                for d, x in sorted((bracket.get("widths_compared") or {}).items(),
                                   key=lambda kv: int(kv[0]))) or None}


def typed_columns(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` (ablation columns) with integer columns :func:`maybe_int`, the others float."""
    for col in df.columns:
        if col in _INTEGER_COLUMNS:
            df[col] = maybe_int(df[col])
        elif col not in ("dataset", "variant"):
            df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
    return df
