"""All cores: study wall time with the default parallel settings vs one process.

    python benchmarks/bench_parallel.py [--variants baseline,rope] [--dataset arithmetic]
                                        [--rounds 1]

A representative slice of the study, run twice in this process on the device lmablate picks:
``lmablate.tune.run`` then ``lmablate.train.run`` (every seed of params.yaml) for each variant
on one dataset, tracking off, a fresh temp-file SQLite Optuna storage per run. The two settings
(``dataclasses.replace`` on params.yaml's train section):

* parallel (params.yaml): ``train.workers: 0, threads: 0`` -> one process per core, the cores
  shared evenly (1 thread each here); Optuna trials and seeds run side by side;
* serial: ``train.workers: 1, threads: 0`` -> one process with every core's thread.

Arms alternate (serial, parallel, parallel, serial, ... over ``--rounds``) and the median per arm
is reported. Tuning with the MedianPruner prunes differently when trials run side by side, so the
training steps each arm spent are printed next to its time, and steps/s is compared as well.
On a GPU both settings use one process (``lmablate.parallel.worker_count``), so the ratio is ~1.
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

from lmablate import train, tune
from lmablate.parallel import map_jobs, threads_per_worker, worker_count
from lmablate.tracking import NullTracker


def _noop(job: int) -> int:
    return job


def run_slice(cfg, dataset: str, variants: list[str], tokens: Path, out: Path) -> dict:
    """tune + train of every variant; returns seconds per stage and training steps spent."""
    times, steps = {"tune": 0.0, "train": 0.0}, {"tune": 0, "train": 0}
    for v in variants:
        d = out / v
        t0 = time.perf_counter()
        best = tune.run(cfg, dataset, v, tokens, d / "best.json", d / "trials.csv", NullTracker())
        t1 = time.perf_counter()
        train.run(cfg, dataset, v, tokens, d / "best.json", d / "checkpoints", d / "history.csv",
                  d / "grad_stats.csv")
        t2 = time.perf_counter()
        times["tune"] += t1 - t0
        times["train"] += t2 - t1
        study = optuna.load_study(study_name=best["study_name"], storage=cfg.tune.storage_url)
        steps["tune"] += sum(max(t.intermediate_values) for t in study.trials
                             if t.state in tune.FINISHED and t.intermediate_values)
        steps["train"] += cfg.train.steps * len(cfg.seeds)
    return {"times": times, "steps": steps, "total": times["tune"] + times["train"],
            "total_steps": steps["tune"] + steps["train"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="arithmetic")
    ap.add_argument("--variants", default="baseline,rope")
    ap.add_argument("--rounds", type=int, default=1,
                    help="runs per arm; the order alternates (serial, parallel), "
                         "(parallel, serial), ...")
    args = ap.parse_args()
    os.environ.pop("LMABLATE_OPTUNA_STORAGE", None)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    device = common.auto_device()
    print(common.machine_header("all cores: parallel workers vs one process", device))
    base = common.load_default_config()
    variants = args.variants.split(",")
    arms = {
        "serial": dataclasses.replace(base.train, workers=1, threads=0),
        "parallel": dataclasses.replace(base.train, workers=0, threads=0),
    }
    for name, tc in arms.items():
        w = worker_count(tc, 3, device)
        print(f"{name:<8}: train.workers={tc.workers} threads={tc.threads} -> {w} process(es) x "
              f"{threads_per_worker(tc, w)} thread(s)")
    print(f"slice   : tune ({base.tune.n_trials} trials x {base.tune.steps} steps, pruner "
          f"{base.tune.pruner}) + train ({len(base.seeds)} seeds x {base.train.steps} steps) of "
          f"{', '.join(variants)} on {args.dataset}; default model size; tracking off")

    t0 = time.perf_counter()
    map_jobs(_noop, [0, 1], 2, 1)
    print(f"overhead: starting a 2-process spawn pool (torch imported in each) takes "
          f"{time.perf_counter() - t0:.1f} s; each tune/train stage call starts one")

    results: dict[str, list[dict]] = {name: [] for name in arms}
    order = [name for r in range(args.rounds)
             for name in (("serial", "parallel") if r % 2 == 0 else ("parallel", "serial"))]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.dataset == "arithmetic":
            tokens = common.arithmetic_data(base, tmp) / "tokens"
        else:
            tokens = common.pipeline_tokens(args.dataset, tmp)
            if tokens is None:
                raise SystemExit(f"data/tokens/{args.dataset} does not exist; run the pipeline "
                                 "or use --dataset arithmetic")
        for i, name in enumerate(order):
            cfg = dataclasses.replace(
                base, train=arms[name],
                tune=dataclasses.replace(base.tune, storage=f"sqlite:///{tmp}/optuna-{i}.db"))
            results[name].append(run_slice(cfg, args.dataset, variants, tokens, tmp / f"run-{i}"))
            r = results[name][-1]
            print(f"   run {i + 1} {name:<8}: tune {r['times']['tune']:6.1f} s "
                  f"({r['steps']['tune']} "
                  f"steps)  train {r['times']['train']:6.1f} s ({r['steps']['train']} steps)  "
                  f"total {r['total']:6.1f} s")

    med = {n: {k: statistics.median(r[k] for r in rs) for k in ("total", "total_steps")}
           for n, rs in results.items()}
    stage = {n: {s: statistics.median(r["times"][s] for r in rs) for s in ("tune", "train")}
             for n, rs in results.items()}
    sps = {n: med[n]["total_steps"] / med[n]["total"] for n in med}
    print(f"\n   wall time serial / parallel   : {med['serial']['total']:.1f} s / "
          f"{med['parallel']['total']:.1f} s = "
          f"{med['serial']['total'] / med['parallel']['total']:.2f}x")
    for s in ("tune", "train"):
        print(f"     {s:<5} stages                 : {stage['serial'][s]:.1f} s / "
              f"{stage['parallel'][s]:.1f} s = {stage['serial'][s] / stage['parallel'][s]:.2f}x")
    print(f"   training steps/s parallel / serial: {sps['parallel']:.1f} / {sps['serial']:.1f} = "
          f"{sps['parallel'] / sps['serial']:.2f}x")


if __name__ == "__main__":
    main()
