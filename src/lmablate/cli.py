"""Command line: one subcommand per DVC stage, each a thin wrapper over one stage function.

Every path comes from the command line (mirroring ``dvc.yaml``); the config is loaded and
validated once, before any work. Expected failures (bad params, bad input files, a model that
fails its pre-flight check, divergence) print one line ``lmablate: error: ...`` and exit 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .config import ConfigError, StudyConfig, load


def _tracker(cfg: StudyConfig):
    from .tracking import make_tracker

    return make_tracker(cfg.tracking)


def cmd_generate(cfg: StudyConfig, a: argparse.Namespace) -> None:
    from .data import generate

    generate(cfg.dataset(a.dataset), a.out)


def cmd_tokenize(cfg: StudyConfig, a: argparse.Namespace) -> None:
    from .tokenizer import tokenize

    tokenize(cfg.dataset(a.dataset), a.raw, a.out)


def cmd_tune(cfg: StudyConfig, a: argparse.Namespace) -> None:
    from . import tune

    cfg.check_variant(a.variant)
    tune.run(cfg, a.dataset, a.variant, a.tokens, a.best, a.trials, _tracker(cfg))


def cmd_train(cfg: StudyConfig, a: argparse.Namespace) -> None:
    from . import train

    cfg.check_variant(a.variant)
    train.run(cfg, a.dataset, a.variant, a.tokens, a.best, a.checkpoints, a.history,
              a.grad_stats)


def cmd_evaluate(cfg: StudyConfig, a: argparse.Namespace) -> None:
    from . import evaluate

    cfg.check_variant(a.variant)
    evaluate.run(cfg, a.dataset, a.variant, a.tokens, a.raw, a.checkpoints, a.metrics,
                 a.examples, _tracker(cfg))


def cmd_report(cfg: StudyConfig, a: argparse.Namespace) -> None:
    from . import study_report

    study_report.run(cfg, a.runs, a.tokens, a.out, _tracker(cfg))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lmablate", description=__doc__.splitlines()[0])
    p.add_argument("--params", type=Path, default=Path("params.yaml"),
                   help="study parameters (default: params.yaml)")
    sub = p.add_subparsers(dest="command", required=True)

    def stage(name: str, fn, help: str, variant: bool = False, dataset: bool = True):
        s = sub.add_parser(name, help=help)
        if dataset:
            s.add_argument("dataset")
        if variant:
            s.add_argument("variant")
        s.set_defaults(fn=fn)
        return s

    s = stage("generate", cmd_generate, "write a dataset's raw text (corpus.txt, test.txt)")
    s.add_argument("--out", type=Path, required=True)
    s = stage("tokenize", cmd_tokenize, "character vocabulary and train/val/test token arrays")
    s.add_argument("--raw", type=Path, required=True)
    s.add_argument("--out", type=Path, required=True)
    s = stage("tune", cmd_tune, "Optuna search over lr and d_model", variant=True)
    s.add_argument("--tokens", type=Path, required=True)
    s.add_argument("--best", type=Path, required=True)
    s.add_argument("--trials", type=Path, required=True)
    s = stage("train", cmd_train, "train on every seed with the tuned values", variant=True)
    for opt in ("--tokens", "--best", "--checkpoints", "--history", "--grad-stats"):
        s.add_argument(opt, type=Path, required=True)
    s = stage("evaluate", cmd_evaluate, "test metrics of every seed", variant=True)
    for opt in ("--tokens", "--raw", "--checkpoints", "--metrics", "--examples"):
        s.add_argument(opt, type=Path, required=True)
    s = stage("report", cmd_report, "tables, statistics and figures of the study", dataset=False)
    for opt in ("--runs", "--tokens", "--out"):
        s.add_argument(opt, type=Path, required=True)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``lmablate`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        cfg = load(args.params)
        args.fn(cfg, args)
    except (ConfigError, ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"lmablate: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
