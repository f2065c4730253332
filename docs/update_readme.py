"""Write a finished study's findings into README.md: the verdict table and the headline figure.

    python docs/update_readme.py [STUDY]      # STUDY: a project after `dvc repro` (default: .)

Reads ``STUDY/reports/summary.csv``, ``comparisons.csv``, ``lr_sensitivity.csv`` and ``tuned.csv``,
and the study's provenance (:func:`provenance`: its ``dvc.lock`` and the environment of its
``metrics.json`` files); writes
``docs/assets/headline.png`` (the forest plots ``reports/figures/forest_<dataset>.png`` side by
side) and replaces the README's text between ``<!-- findings:start -->`` and
``<!-- findings:end -->`` with :func:`render` of the study's rows. Nothing in that block is typed
by hand; ``tests/test_docs.py`` checks that the block is exactly what :func:`render` writes for
the rows :func:`parse` reads back from it, that its study is the one the committed ``dvc.lock``
records (:func:`study_fingerprint`), and that this ``dvc.lock`` is of the current code, params
and lock (:func:`changed_since_lock`): a change to a stage's code fails the tests until a fresh
study's ``dvc.lock`` is committed and this script is run on that study.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from lmablate.report.collect import BASELINE
from lmablate.report.headline import headline_loss

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- findings:start -->", "<!-- findings:end -->"
NOTE = ("<!-- written by docs/update_readme.py from the default study's reports/; "
        "do not edit by hand -->")
FIGURE = "docs/assets/headline.png"
FIGURE_ALT = ("Each variant minus the baseline in the headline loss, per dataset, with raw and "
              "Holm-adjusted 95% intervals")
LOSS_NAMES = {"test_loss": "test loss, nats/char", "answer_loss": "answer loss, nats/answer char"}
MARKS = {"better": "▲ better", "worse": "▼ worse"}  # any other verdict is shown as written
COLUMNS = ["dataset", "variant", "seeds", "headline loss", "mean ± 95% CI",
           "Δ vs baseline [Holm 95% CI]", "Holm p", "verdict", "exact match",
           "tuning uncertainty", "LR sensitivity (first rung)", "LR sensitivity (full budget)"]
DASH = "–"


@dataclass(frozen=True)
class Row:
    """One dataset x variant of the verdict table; ``None`` where a value does not apply."""
    dataset: str
    variant: str
    seeds: int
    metric: str  # the headline loss: test_loss or answer_loss
    mean: float
    half_width: float  # of the 95% Student-t interval over seeds
    diff: float | None = None  # variant - baseline, mean over paired seeds
    holm_low: float | None = None
    holm_high: float | None = None
    p_holm: float | None = None
    verdict: str | None = None  # as in comparisons.csv: better, worse, no significant difference
    exact_match: float | None = None
    lr_sensitivity: float | None = None  # over the first rung's shared lr sweep (nats)
    tuning_uncertainty: float | None = None  # 95% bound of the regret at the chosen lr (nats)
    lr_sensitivity_full: float | None = None  # the full-budget curve's rise at 2x the lr (nats)


# --- reading a study ----------------------------------------------------------------------------

def _read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _num(text: str | None) -> float | None:
    if text is None or text.strip() == "":
        return None
    value = float(text)
    return None if math.isnan(value) else value


def collect(study: Path) -> list[Row]:
    """The verdict table's rows from ``study/reports/``, in the report's dataset and variant
    order (that of ``summary.csv``)."""
    reports = study / "reports"
    summary = _read(reports / "summary.csv")
    summary_frame = pd.read_csv(reports / "summary.csv")
    comparisons = _read(reports / "comparisons.csv")
    sensitivity = {(r["dataset"], r["variant"]): _num(r["lr_sensitivity"])
                   for r in _read(reports / "lr_sensitivity.csv")}
    tuned = {(r["dataset"], r["variant"]): r for r in _read(reports / "tuned.csv")}
    metrics = {(r["dataset"], r["variant"], r["metric"]): r for r in summary}
    datasets = list(dict.fromkeys(r["dataset"] for r in summary))
    rows = []
    for dataset in datasets:
        # the report's own rule (answer loss where a dataset has one), on the summary it wrote
        headline = headline_loss(summary_frame, dataset)
        variants = list(dict.fromkeys(r["variant"] for r in summary if r["dataset"] == dataset))
        variants.sort(key=lambda v: v != BASELINE)
        for variant in variants:
            s = metrics[(dataset, variant, headline)]
            em = metrics.get((dataset, variant, "exact_match"))
            c = next((r for r in comparisons if (r["dataset"], r["variant"], r["metric"])
                      == (dataset, variant, headline)), None)
            low, high = _num(s["ci95_low"]), _num(s["ci95_high"])
            rows.append(Row(
                dataset=dataset, variant=variant, seeds=int(s["n"]), metric=headline,
                mean=float(s["mean"]),
                half_width=(high - low) / 2 if low is not None and high is not None else 0.0,
                diff=_num(c["mean_diff"]) if c else None,
                holm_low=_num(c["ci_holm_low"]) if c else None,
                holm_high=_num(c["ci_holm_high"]) if c else None,
                p_holm=_num(c["p_holm"]) if c else None,
                verdict=c["verdict"] if c else None,
                exact_match=_num(em["mean"]) if em else None,
                lr_sensitivity=sensitivity.get((dataset, variant)),
                tuning_uncertainty=_num(tuned.get((dataset, variant), {}).get(
                    "tuning_uncertainty")),
                lr_sensitivity_full=_num(tuned.get((dataset, variant), {}).get(
                    "lr_sensitivity_full"))))
    return rows


def headline_figure(study: Path, datasets: list[str], out: Path) -> None:
    """The datasets' forest plots side by side, as one PNG of at most 1,600 pixels' width."""
    from PIL import Image

    images = [Image.open(study / "reports" / "figures" / f"forest_{d}.png").convert("RGB")
              for d in datasets]
    height = max(i.height for i in images)
    canvas = Image.new("RGB", (sum(i.width for i in images), height), "white")
    x = 0
    for image in images:
        canvas.paste(image, (x, (height - image.height) // 2))
        x += image.width
    if canvas.width > 1600:
        canvas = canvas.resize((1600, round(canvas.height * 1600 / canvas.width)),
                               Image.LANCZOS)
    out.parent.mkdir(parents=True, exist_ok=True)
    # a 256-colour palette: the plots are flat colours, and the file stays small in git
    canvas.quantize(colors=256, method=Image.Quantize.MEDIANCUT,
                    dither=Image.Dither.NONE).save(out, optimize=True)


# --- provenance: which study, on what machine ---------------------------------------------------

# dvc.lock deps under these folders are outputs of other stages (data), not repository files
DATA_FOLDERS = ("data", "runs", "reports")


def _yaml(path: Path) -> dict:
    """A YAML file read as DVC reads it (YAML 1.2, ruamel): PyYAML's 1.1 takes the ``1e-05``
    DVC writes into dvc.lock for a string."""
    from ruamel.yaml import YAML
    return YAML(typ="safe", pure=True).load(path.read_text(encoding="utf-8"))


def _lock(root: Path) -> dict:
    return _yaml(root / "dvc.lock")


def changed_since_lock(root: Path) -> list[str]:
    """What DVC's own ``dvc status`` finds changed in ``root`` against its ``dvc.lock``: each dep
    of a stage that is a file of the repository (code, ``requirements.lock``), and each param
    (as ``params.yaml: <key>``); sorted, empty when the lock is current. Outputs, and deps that
    are other stages' outputs (under :data:`DATA_FOLDERS`), are not looked at: a clone has none."""
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        status = repo.status()
    changed = set()
    for entries in status.values():
        for entry in entries:
            if not isinstance(entry, dict):  # "always changed" and the like
                continue
            for path, state in entry.get("changed deps", {}).items():
                if isinstance(state, dict):  # a params file: each param -> its state
                    changed.update(f"{path}: {key}" for key in state)
                elif path.split("/")[0] not in DATA_FOLDERS:
                    changed.add(path)
    return sorted(changed)


def study_fingerprint(root: Path) -> str:
    """12 hex digits of the sha256 of the report stage's outputs as ``root``'s ``dvc.lock``
    records them (paths and md5s): the study whose reports the findings were written from."""
    outs = sorted((o["path"], o.get("md5", "")) for o in _lock(root)["stages"]["report"]["outs"])
    return hashlib.sha256(json.dumps(outs).encode()).hexdigest()[:12]


def provenance(study: Path) -> str:
    """The sentence under the findings: the study's fingerprint and what it computed with (the
    ``environment`` of its ``metrics.json`` files, which must agree) on which CPU (this
    machine's: run the script where the study ran)."""
    envs = {json.dumps(json.loads(p.read_text()).get("environment"), sort_keys=True)
            for p in sorted((study / "runs").glob("*/*/metrics.json"))}
    if len(envs) != 1 or json.loads(next(iter(envs))) is None:
        raise SystemExit(f"{study}: its runs record {len(envs)} environments; one is needed")
    env = json.loads(next(iter(envs)))
    sys.path.insert(0, str(ROOT / "src"))
    from lmablate.tracking.environment import cpu_model
    return (f"From the study whose `dvc.lock` is committed (its reports' fingerprint "
            f"`{study_fingerprint(study)}`), computed with `{env['numerics']}` on {cpu_model()} "
            f"({os.cpu_count()} cores), torch {env['torch']}, Python {env['python']}, "
            f"`requirements.lock` `{env['lock']}`.")


# --- the block ----------------------------------------------------------------------------------

def _f(x: float | None, signed: bool = False) -> str:
    if x is None:
        return DASH
    text = f"{x:+.3f}" if signed else f"{x:.3f}"
    return text.replace("-", "−")


def _p(p: float | None) -> str:
    if p is None:
        return DASH
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def _cells(row: Row) -> list[str]:
    compared = row.variant != BASELINE
    return [
        row.dataset, f"`{row.variant}`", str(row.seeds), LOSS_NAMES[row.metric],
        f"{_f(row.mean)} ± {_f(row.half_width)}",
        (f"{_f(row.diff, True)} [{_f(row.holm_low, True)}, {_f(row.holm_high, True)}]"
         if compared else DASH),
        _p(row.p_holm) if compared else DASH,
        MARKS.get(row.verdict, row.verdict) if compared and row.verdict else DASH,
        _f(row.exact_match), _f(row.tuning_uncertainty), _f(row.lr_sensitivity),
        _f(row.lr_sensitivity_full),
    ]


def _sentence(rows: list[Row]) -> str:
    parts = []
    for dataset in dict.fromkeys(r.dataset for r in rows):
        of = [r for r in rows if r.dataset == dataset and r.variant != BASELINE]
        said = [f"{word} than the baseline: {', '.join(r.variant for r in of if r.verdict == v)}"
                for word, v in (("better", "better"), ("worse", "worse"))
                if any(r.verdict == v for r in of)]
        parts.append(f"**{dataset}**: " + ("; ".join(said) if said else
                                            "no variant better or worse than the baseline"))
    return ". ".join(parts) + "."


def render(rows: list[Row], origin: str) -> str:
    """The README's findings block, markers included, with ``origin`` (:func:`provenance`)
    under it."""
    table = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---" for _ in COLUMNS) + "|"]
    table += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    return "\n".join([
        START, NOTE, "",
        f"![{FIGURE_ALT}]({FIGURE})", "",
        *table, "",
        "Verdicts (Holm-corrected over a dataset's variants, paired by seed): "
        + _sentence(rows), "",
        origin, "",
        END,
    ])


def origin_of(block: str) -> str:
    """The provenance sentence of a findings block (see :func:`provenance`)."""
    return next(line for line in block.splitlines() if line.startswith("From the study "))


def fingerprint_of(block: str) -> str:
    """The study fingerprint a findings block names."""
    return re.search(r"fingerprint `([0-9a-f]{12})`", origin_of(block))[1]


def _unf(cell: str) -> float | None:
    return None if cell == DASH else float(cell.replace("−", "-"))


def _unp(cell: str) -> float | None:
    return None if cell == DASH else (0.0 if cell == "<0.001" else float(cell))


def parse(block: str) -> list[Row]:
    """The rows of a findings block (the inverse of :func:`render` on its table)."""
    names = {v: k for k, v in LOSS_NAMES.items()}
    verdicts = {v: k for k, v in MARKS.items()}
    rows = []
    for line in block.splitlines():
        if not line.startswith("| ") or line.startswith("| dataset |"):
            continue
        c = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        mean, half = c[4].split(" ± ")
        diff = low = high = None
        if c[5] != DASH:
            m = re.fullmatch(r"(\S+) \[(\S+), (\S+)\]", c[5])
            diff, low, high = (_unf(g) for g in m.groups())
        rows.append(Row(dataset=c[0], variant=c[1].strip("`"), seeds=int(c[2]),
                        metric=names[c[3]], mean=_unf(mean), half_width=_unf(half),
                        diff=diff, holm_low=low, holm_high=high, p_holm=_unp(c[6]),
                        verdict=None if c[7] == DASH else verdicts.get(c[7], c[7]),
                        exact_match=_unf(c[8]), tuning_uncertainty=_unf(c[9]),
                        lr_sensitivity=_unf(c[10]), lr_sensitivity_full=_unf(c[11])))
    return rows


def block_of(readme: str) -> str:
    """The findings block of a README's text, markers included."""
    start, end = readme.index(START), readme.index(END) + len(END)
    return readme[start:end]


def replace_block(readme: str, block: str) -> str:
    return readme.replace(block_of(readme), block)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("study", nargs="?", type=Path, default=ROOT,
                    help="a project after dvc repro (default: this one)")
    ap.add_argument("--readme", type=Path, default=ROOT / "README.md")
    args = ap.parse_args(argv)
    rows = collect(args.study)
    origin = provenance(args.study)
    headline_figure(args.study, list(dict.fromkeys(r.dataset for r in rows)), ROOT / FIGURE)
    text = args.readme.read_text(encoding="utf-8")
    args.readme.write_text(replace_block(text, render(rows, origin)), encoding="utf-8")
    print(f"{args.readme}: findings of {args.study} ({len(rows)} rows); figure {FIGURE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
