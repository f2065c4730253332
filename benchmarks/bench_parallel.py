"""All cores: study wall time with the default parallel settings vs one job at a time.

    python benchmarks/bench_parallel.py [--variants baseline,rope] [--dataset arithmetic]
                                        [--budget-fraction 0.05] [--rounds 1]
                                        [--arms serial,threads,processes] [--smoke]

A slice of the study, run in this process on the device lmablate picks:
``lmablate.stages.tune.run``, ``lmablate.stages.train.run`` (every seed of params.yaml) and
``lmablate.stages.evaluate.run`` for each variant on one dataset, tracking off, a fresh temp-file
SQLite Optuna storage per run, every ``train.budget_flops`` scaled by ``--budget-fraction`` (so
that the slice takes minutes; the tuning's widths are derived from the scaled budget). The arms
(``dataclasses.replace`` on params.yaml's runtime section):

* serial: ``runtime.workers: 1`` -> one job at a time;
* threads (params.yaml): ``runtime.workers: 0, parallel: threads`` -> a tuning batch's trials,
  the seeds and the evaluations side by side in threads;
* processes: the same in spawned worker processes (``runtime.parallel: processes``), each of
  which imports torch again.

Every job computes with ``lmablate.execution.parallel.INTRA_OP_THREADS`` (1) intra-op thread in
every arm, so all arms compute the same numbers. Arms rotate (serial, threads, processes, then
threads, processes, serial, ...) over ``--rounds`` and the median per arm is reported; the training
steps each arm spent are printed next to its time (the same in every arm: tuning's successive
halving has no in-trial pruning). What the slice leaves out is the cost that does not change with
the setting: each DVC stage is a new process that imports torch (and Optuna or MLflow's sidecar).
On a GPU every arm runs one job at a time (``lmablate.execution.parallel.worker_count``), so the
ratio is ~1. ``--smoke``: params.yaml cut down to ``common.TINY`` (2 seeds, 8 steps), one variant,
the serial and threads arms: checks that the script runs, in seconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import tempfile
import time
from pathlib import Path

import common  # first: it disables tqdm before torch imports it

import optuna

from lmablate.core.tracker import NullTracker
from lmablate.data.token_data import TokenData
from lmablate.execution.parallel import INTRA_OP_THREADS, worker_count
from lmablate.stages import evaluate, train, tune
from lmablate.train.training import train_model

STAGES = ("tune", "train", "evaluate")


def run_slice(cfg, dataset: str, variants: list[str], tokens: Path, raw: Path | None,
              out: Path) -> dict:
    """tune + train + evaluate of every variant; returns seconds per stage (``times``), the
    training steps spent by tuning and training (``steps``), and their sums."""
    times, steps = dict.fromkeys(STAGES, 0.0), {"tune": 0, "train": 0}
    for v in variants:
        d = out / v
        t0 = time.perf_counter()
        best = tune.run(cfg, dataset, v, tokens, d / "best.json", d / "trials.csv", NullTracker())
        t1 = time.perf_counter()
        runs = train.run(cfg, dataset, v, tokens, d / "best.json", d / "checkpoints",
                         d / "history.csv", d / "grad_stats.csv")
        t2 = time.perf_counter()
        evaluate.run(cfg, dataset, v, tokens, raw or tokens, d / "checkpoints",
                     d / "metrics.json", d / "examples.json", NullTracker())
        t3 = time.perf_counter()
        times["tune"] += t1 - t0
        times["train"] += t2 - t1
        times["evaluate"] += t3 - t2
        steps["tune"] += best["steps"]
        steps["train"] += sum(r["steps"] for r in runs.values())
    return {"times": times, "steps": steps, "total": sum(times.values()),
            "total_steps": steps["tune"] + steps["train"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="arithmetic")
    ap.add_argument("--variants", default="baseline,rope")
    ap.add_argument("--rounds", type=int, default=1,
                    help="runs per arm; the order rotates between rounds")
    ap.add_argument("--budget-fraction", type=float, default=0.05,
                    help="share of params.yaml's train.budget_flops every run spends")
    ap.add_argument("--arms", default="serial,threads,processes")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny study, one variant, serial and threads: checks that it runs")
    args = ap.parse_args()
    os.environ.pop("LMABLATE_OPTUNA_STORAGE", None)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    device = common.auto_device()
    print(common.machine_header("all cores: concurrent jobs vs one at a time", device))
    if args.smoke:
        base, args.variants, args.dataset = common.load_tiny_config(), "baseline", "arithmetic"
        args.arms, args.budget_fraction, args.rounds = "serial,threads", 1.0, 1
    else:
        base = common.load_default_config()
    base = dataclasses.replace(base, train=dataclasses.replace(base.train, budget_flops={
        k: v * args.budget_fraction for k, v in base.train.budget_flops.items()}))
    variants = args.variants.split(",")
    every = {
        "serial": dataclasses.replace(base.runtime, workers=1),
        "threads": dataclasses.replace(base.runtime, workers=0, parallel="threads"),
        "processes": dataclasses.replace(base.runtime, workers=0, parallel="processes"),
    }
    arms = {name: every[name] for name in args.arms.split(",")}
    if "serial" not in arms:
        raise SystemExit("--arms must include serial, the reference")
    for name, rc in arms.items():
        w, ws = worker_count(rc, base.tune.trials_per_batch, device), worker_count(
            rc, len(base.seeds), device, all_at_once=True)
        kind = "process(es)" if name == "processes" else "thread(s)"
        print(f"{name:<9}: runtime.workers={rc.workers} parallel={rc.parallel} -> trials {w}, "
              f"seeds {ws} {kind} at a time x {INTRA_OP_THREADS} intra-op thread(s)")
    rungs = " then ".join(f"{n} x {f:g}" for n, f in base.tune.rungs)
    print(f"slice    : tune (rungs: {rungs} of the budget, {base.tune.trials_per_batch} trials "
          f"per batch) + train ({len(base.seeds)} seeds) + evaluate of {', '.join(variants)} on "
          f"{args.dataset}, budget {base.train.budget_flops[args.dataset]:.3g} FLOPs per run "
          f"({args.budget_fraction:g} of the profile's); tracking off")

    results: dict[str, list[dict]] = {name: [] for name in arms}
    names = list(arms)
    order = [names[(r + i) % len(names)] for r in range(args.rounds) for i in range(len(names))]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        raw = None
        if args.dataset == "arithmetic":
            tokens = common.arithmetic_data(base, tmp) / "tokens"
            raw = tokens.parent / "raw"
        else:
            tokens = common.pipeline_tokens(args.dataset, tmp)
            if tokens is None:
                raise SystemExit(f"data/tokens/{args.dataset} does not exist; run the pipeline "
                                 "or use --dataset arithmetic")
        # One-time costs (torch._dynamo is imported by the first optimizer step, ~1.2 s) are paid
        # here, not by whichever arm runs first.
        warm = TokenData.load(tokens)
        train_model(base.model_config("baseline", warm.vocab_size), base.train, warm,
                    seed=0, lr=1e-3, steps=2, device=device)
        for i, name in enumerate(order):
            cfg = dataclasses.replace(
                base, runtime=arms[name],
                tune=dataclasses.replace(base.tune, storage=f"sqlite:///{tmp}/optuna-{i}.db"))
            results[name].append(run_slice(cfg, args.dataset, variants, tokens, raw,
                                           tmp / f"run-{i}"))
            r = results[name][-1]
            print(f"   run {i + 1} {name:<9}: tune {r['times']['tune']:6.1f} s "
                  f"({r['steps']['tune']} steps)  train {r['times']['train']:6.1f} s "
                  f"({r['steps']['train']} steps)  evaluate {r['times']['evaluate']:5.1f} s  "
                  f"total {r['total']:6.1f} s")

    med = {n: {k: statistics.median(r[k] for r in rs) for k in ("total", "total_steps")}
           for n, rs in results.items()}
    stage = {n: {s: statistics.median(r["times"][s] for r in rs) for s in STAGES}
             for n, rs in results.items()}
    sps = {n: med[n]["total_steps"] / med[n]["total"] for n in med}
    for arm in [a for a in arms if a != "serial"]:
        print(f"\n   ratio wall time serial / {arm:<9} = {med['serial']['total']:.1f} s / "
              f"{med[arm]['total']:.1f} s = {med['serial']['total'] / med[arm]['total']:.2f}x")
        for s in STAGES:
            print(f"     {s:<8} stages              : {stage['serial'][s]:.1f} s / "
                  f"{stage[arm][s]:.1f} s = {stage['serial'][s] / stage[arm][s]:.2f}x")
        print(f"   training steps/s {arm} / serial: {sps[arm]:.1f} / {sps['serial']:.1f} = "
              f"{sps[arm] / sps['serial']:.2f}x")


if __name__ == "__main__":
    main()
