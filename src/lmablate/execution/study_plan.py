"""Where a stage stands in the study, and about how long the study has left: the line each stage
of ``dvc repro`` prints as it starts.

The plan is the study's stages in the order ``dvc repro`` runs them (dvc.yaml's stages, each
over its datasets, then variants; tests/test_pipeline.py checks it against ``dvc repro
--dry``), each with the training FLOPs it plans. The time left comes from the times of this
study's stages so far, kept in ``.dvc/tmp/lmablate-times.json`` under ``DVC_ROOT`` (so the
stages of ``dvc exp run --temp`` or ``--queue`` keep them in the project): a stage that trained
before with the same FLOPs takes its last time again; one that did not takes its planned FLOPs at
the pace of the stages of its kind so far (seconds per planned FLOP: a tune stage's extended
bracket trains more than it plans), or for a kind not timed yet, at the FLOPs spent per second
of the stages so far (a tune stage's from its ``trials.csv``). The estimate counts every later
stage, so where DVC will skip some as up to date it is too long.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from lmablate.config.study import StudyConfig
from lmablate.core.fileio import atomic_path

TIMES_FILE = Path(".dvc") / "tmp" / "lmablate-times.json"
COMMANDS = ("generate", "tokenize", "tune", "train", "evaluate", "report")  # dvc.yaml's order


@dataclass(frozen=True)
class PlannedStage:
    """One stage of the study: its DVC name (``tune@shakespeare-rope``) and the training FLOPs
    it plans (0 for a stage that trains nothing)."""

    name: str
    flops: float


def stage_name(command: str, dataset: str | None = None, variant: str | None = None,
               replicate: int = 0) -> str:
    """The DVC name of ``command``'s stage on ``dataset`` (and ``variant``): ``generate@<d>``,
    ``tune@<d>-<v>``, ``report``; of replicate r > 0, ``tune-replicate@<d>-<v>-<r>``."""
    item = "-".join(str(x) for x in (dataset, variant, replicate or None) if x)
    command = f"{command}-replicate" if replicate else command
    return f"{command}@{item}" if item else command


def tune_flops(cfg: StudyConfig, dataset: str, headline: bool = False) -> float:
    """The training FLOPs a tune stage of ``dataset`` plans at least: at each budget, each rung's
    trials at their share of it (:func:`lmablate.tune.rungs.plan`), the bracket's first learning
    rates ((its trials + 1, the middle one at two widths) x ``tune.bracket_seeds``) at the whole
    budget; an extended bracket trains more. ``headline``: at the headline budget alone (a
    replicate r > 0 tunes no other)."""
    tune = cfg.tune
    shares = 0.0
    for rung, (n, fraction) in enumerate(tune.rungs):
        bracket = len(tune.rungs) > 1 and rung == len(tune.rungs) - 1
        shares += (n + 1) * tune.bracket_seeds * fraction if bracket else n * fraction
    return shares * (cfg.budgets(dataset)[-1] if headline else sum(cfg.budgets(dataset)))


def study_plan(cfg: StudyConfig) -> list[PlannedStage]:
    """The study's stages in the order ``dvc repro`` runs them, with their planned FLOPs (a
    final run spends its budget; evaluation and the rest are counted as 0)."""
    datasets, variants = list(cfg.datasets), list(cfg.study_variants)
    out = [PlannedStage("check", 0.0)]  # lmablate.stages.check: every stage depends on it
    out += [PlannedStage(stage_name(c, d), 0.0) for c in COMMANDS[:2] for d in datasets]
    out += [PlannedStage(stage_name("tune", d, v), tune_flops(cfg, d))
            for d in datasets for v in variants]
    out += [PlannedStage(stage_name("train", d, v), len(cfg.seeds) * sum(cfg.budgets(d)))
            for d in datasets for v in variants]
    out += [PlannedStage(stage_name("evaluate", d, v), 0.0) for d in datasets for v in variants]
    # dvc.yaml's order: by command, each matrix of dataset x variant x replicate in turn
    replicates = range(1, cfg.replicates)
    out += [PlannedStage(stage_name("tune", d, v, r), tune_flops(cfg, d, headline=True))
            for d in datasets for v in variants for r in replicates]
    out += [PlannedStage(stage_name("train", d, v, r), len(cfg.seeds) * cfg.budgets(d)[-1])
            for d in datasets for v in variants for r in replicates]
    out += [PlannedStage(stage_name("evaluate", d, v, r), 0.0)
            for d in datasets for v in variants for r in replicates]
    return out + [PlannedStage("report", 0.0)]


def times_path() -> Path:
    """The times file of this study: under ``DVC_ROOT`` where DVC sets it, else here."""
    return Path(os.environ.get("DVC_ROOT", ".")) / TIMES_FILE


# The times file holds one small entry per stage of a study; past this size it is not one.
MAX_TIMES_BYTES = 1_000_000
_TIME_KEYS = ("seconds", "flops", "spent")


def _is_time(entry: object) -> bool:
    """A stage's entry of the times file: ``seconds`` and ``flops`` (``spent`` optional), each
    a finite number >= 0, and nothing else."""
    return (isinstance(entry, dict) and {"seconds", "flops"} <= entry.keys()
            and entry.keys() <= set(_TIME_KEYS)
            and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                    and math.isfinite(v) and v >= 0 for v in entry.values()))


def read_times(path: Path, quiet: bool = False) -> dict[str, dict]:
    """Stage name -> ``{"seconds", "flops"[, "spent"]}`` of its last run. The estimate is a
    courtesy and never stops a stage: a missing file gives ``{}``; one that is unreadable,
    over :data:`MAX_TIMES_BYTES`, not JSON or not a mapping gives ``{}``, and entries that are
    not stage times are dropped, each with a note on standard error (unless ``quiet``); the
    next :func:`record_time` rewrites the file from what is kept."""
    def note(what: str) -> None:
        if not quiet:
            print(f"lmablate: note: {path} {what}; ignored, and rewritten when this stage ends "
                  "(it only estimates the time left)", file=sys.stderr)
    try:
        size = path.stat().st_size
        if size > MAX_TIMES_BYTES:
            note(f"holds {size:,} bytes, more than a study's stage times")
            return {}
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        note(f"cannot be read as JSON ({' '.join(str(exc).split())[:80]})")
        return {}
    if not isinstance(data, dict):
        note(f"holds a {type(data).__name__}, not stage times")
        return {}
    kept = {str(name): entry for name, entry in data.items() if _is_time(entry)}
    if len(kept) < len(data):
        note(f"has {len(data) - len(kept)} entries that are not stage times (seconds and "
             "FLOPs, finite and >= 0)")
    return kept


def spent_flops(trials_csv: Path) -> float | None:
    """The training FLOPs a tune stage spent: the sum of its ``trials.csv``'s ``flops`` column
    (an extended bracket spends more than :func:`tune_flops` plans); None if unreadable."""
    import csv

    try:
        with open(trials_csv, newline="") as f:
            return sum(float(row["flops"] or 0) for row in csv.DictReader(f))
    except (OSError, KeyError, ValueError):
        return None


def record_time(path: Path, stage: PlannedStage, seconds: float,
                spent: float | None = None, plan: list[PlannedStage] | None = None) -> None:
    """Keep ``stage``'s time in the times file, with the FLOPs it ``spent`` where they differ from
    those planned; the file keeps the stages of ``plan`` only (every stage kept without one).
    A file that cannot be written is passed over."""
    times = read_times(path, quiet=True)
    if plan is not None:
        names = {s.name for s in plan}
        times = {name: t for name, t in times.items() if name in names}
    times[stage.name] = {"seconds": round(seconds, 3), "flops": stage.flops}
    if spent is not None and spent != stage.flops:
        times[stage.name]["spent"] = spent
    try:
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps(times, indent=1, sort_keys=True))
    except OSError:
        pass


def seconds_left(plan: list[PlannedStage], start: int, times: dict[str, dict]) -> float | None:
    """Seconds the stages ``plan[start:]`` take, as the module docstring says: a stage's last
    time where it planned the same FLOPs; else its planned FLOPs at the seconds per planned FLOP
    of the stages of its command timed so far (a tune stage's extended brackets included), or,
    for a command not timed yet, at the FLOPs spent per second of every stage timed. None while
    no stage that trains has a time yet and some of them train."""
    def kind(name: str) -> str:  # a replicate's stages are timed with their command's
        return name.split("@")[0].removesuffix("-replicate")
    timed = {n: t for n, t in times.items() if t.get("flops", 0) > 0 and t.get("seconds", 0) > 0}
    rate = (sum(t.get("spent", t["flops"]) for t in timed.values())
            / sum(t["seconds"] for t in timed.values()) if timed else None)
    per_kind: dict[str, list[float]] = {}
    for name, t in timed.items():
        acc = per_kind.setdefault(kind(name), [0.0, 0.0])
        acc[0] += t["seconds"]
        acc[1] += t["flops"]
    total = 0.0
    for stage in plan[start:]:
        last = times.get(stage.name)
        if last and last.get("flops") == stage.flops:
            total += last.get("seconds", 0.0)
        elif stage.flops > 0:
            if kind(stage.name) in per_kind:
                seconds, flops = per_kind[kind(stage.name)]
                total += stage.flops * seconds / flops
            elif rate is not None:
                total += stage.flops / rate
            else:
                return None
    return total


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def start_line(cfg: StudyConfig, name: str, times: dict[str, dict],
               plan: list[PlannedStage] | None = None) -> str | None:
    """The line a stage prints as it starts: its place in the plan, the share of the study's
    FLOPs done before it and about how long the rest (it included) takes; None for a command
    that is no stage of the plan."""
    plan = plan or study_plan(cfg)
    names = [s.name for s in plan]
    if name not in names:
        return None
    k = names.index(name)
    total = sum(s.flops for s in plan)
    done = sum(s.flops for s in plan[:k])
    left = seconds_left(plan, k, times)
    when = ("time left known once a training stage has run" if left is None
            else f"about {_duration(left)} left with this one")
    share = f"{100 * done / total:.0f}% of its training FLOPs done, " if total else ""
    return f"lmablate: stage {k + 1} of {len(plan)} of the study ({name}); {share}{when}"


class StageClock:
    """Announces a stage of ``dvc repro`` (:func:`start_line`) and records its time when it ends.
    Use :func:`clock_for`, which gives one only to a stage DVC runs."""

    def __init__(self, cfg: StudyConfig, name: str):
        self.path = times_path()
        self.plan = study_plan(cfg)
        self.stage = next((s for s in self.plan if s.name == name), None)
        self.line = (start_line(cfg, name, read_times(self.path), self.plan) if self.stage
                     else None)
        self.start = time.monotonic()

    def done(self, spent: float | None = None) -> None:
        """Record the stage's time and the FLOPs it ``spent`` if known (a stage that failed
        records none)."""
        if self.stage is not None:
            record_time(self.path, self.stage, time.monotonic() - self.start, spent,
                        self.plan)


def clock_for(cfg: StudyConfig, command: str, dataset: str | None, variant: str | None,
              replicate: int = 0) -> StageClock | None:
    """A :class:`StageClock` for a stage that DVC runs (``DVC_ROOT`` set), else None: a command
    typed by hand is no stage of the plan and writes no times."""
    if not os.environ.get("DVC_ROOT"):
        return None
    return StageClock(cfg, stage_name(command, dataset, variant, replicate))
