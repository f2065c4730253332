"""The seed-scale study's train stage on a GPU, against seed 000's published numbers.

    python benchmarks/seed_scale_gpu.py --tokens data/tokens/shakespeare --out /tmp/seed-scale \
        [--variants baseline,swiglu,rmsnorm,rope,llama] [--seeds 0,1,2] [--lr 3e-4]
    python benchmarks/seed_scale_gpu.py --smoke   # any device, seconds: checks that it runs

``conf/profile/seed-scale.yaml`` (seed 000's model: d_model 96, 8 layers, 8 heads, context 128,
batch 16; its training budget, 6.1e13 FLOPs = 5,000 steps of the baseline), Shakespeare only,
the configured learning rate ``train.lr`` (3e-4, seed 000's) and width instead of tuned ones,
MLflow off. Each variant runs through the train stage's own code (``lmablate.stages.train.run``),
which on CUDA trains the seeds as one batched model replayed as a CUDA graph. ``--tokens`` is
the pipeline's ``data/tokens/shakespeare`` made with that profile (``max_chars: null``, the
whole ~5.06M-character corpus).

Prints per variant: steps, parameters, each seed's final validation loss (nats/char), their
mean and standard deviation, the stage's wall time, training tokens/s (all seeds) and the share
of the stage's wall time the GPU was busy (NVML, see ``common.GpuBusy``); then seed 000's
numbers (TinyShakespeare, one seed: baseline val 1.758, SwiGLU 1.711). Writes
``results.json`` into ``--out``.

``--smoke`` replaces the profile by ``common.TINY`` (params.yaml cut down: 2 seeds, 8 steps of
a d_model 16 model) on freshly generated arithmetic data in a temporary directory (no
``--tokens`` or ``--out``), the baseline only: the same code path on any device, in seconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
import time
from pathlib import Path

import common  # first: it disables tqdm before torch imports it

from lmablate.data.token_data import TokenData
from lmablate.model.gpt import count_params
from lmablate.model.variants import resolve_model_config
from lmablate.stages import train

SEED_000 = {"baseline": 1.758, "swiglu": 1.711}  # val loss, TinyShakespeare, seed 000's post


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=Path, help="the dataset's token directory (required "
                    "unless --smoke)")
    ap.add_argument("--out", type=Path, help="output directory (required unless --smoke)")
    ap.add_argument("--variants", default="baseline,swiglu,rmsnorm,rope,llama")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--lr", type=float, default=None, help="default: the profile's train.lr")
    ap.add_argument("--budget-fraction", type=float, default=1.0,
                    help="train on this fraction of the profile's budget (a smoke test)")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny study on generated arithmetic data, baseline only")
    args = ap.parse_args()
    if not args.smoke and (args.tokens is None or args.out is None):
        ap.error("--tokens and --out are required (or --smoke)")
    with tempfile.TemporaryDirectory(prefix="seed-scale-smoke-") as tmp:
        if args.smoke:
            args.variants, args.seeds, args.out = "baseline", "0,1", Path(tmp) / "out"
            args.tokens = common.arithmetic_data(common.load_tiny_config(), Path(tmp)) / "tokens"
        run(args)


def run(args: argparse.Namespace) -> None:
    """Train every variant of ``args.variants`` through the train stage and print the table."""
    device = common.auto_device()
    dataset = "arithmetic" if args.smoke else "shakespeare"
    print(common.machine_header(f"seed-scale train stage, {dataset}"
                                + (" (smoke: tiny sizes)" if args.smoke else ""), device))
    cfg = (common.load_tiny_config() if args.smoke
           else common.profile_config("seed-scale"))
    cfg = dataclasses.replace(
        cfg, seeds=tuple(int(s) for s in args.seeds.split(",")),
        tracking=dataclasses.replace(cfg.tracking, enabled=False),
        # each dataset's largest budget (Shakespeare's is a scaling study's list): seed 000's
        train=dataclasses.replace(cfg.train, budget_flops={
            k: cfg.train.budgets(k)[-1] * args.budget_fraction for k in cfg.train.budget_flops}))
    lr = args.lr if args.lr is not None else cfg.train.lr
    data = TokenData.load(args.tokens)
    print(f"data    : {args.tokens} ({len(data.train):,} train / {len(data.val):,} val tokens, "
          f"vocab {data.vocab_size})")
    print(f"runs    : seeds {list(cfg.seeds)}, lr {lr:g}, d_model {cfg.model.d_model}, "
          f"budget {cfg.train.budget_flops[dataset]:.4g} FLOPs")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for variant in args.variants.split(","):
        d = args.out / variant
        d.mkdir(exist_ok=True)
        (d / "best.json").write_text(json.dumps({"lr": lr, "d_model": cfg.model.d_model}))
        mc = resolve_model_config(cfg, variant, data.vocab_size, cfg.model.d_model)
        with common.GpuBusy(device) as busy:
            t0 = time.perf_counter()
            runs = train.run(cfg, dataset, variant, args.tokens, d / "best.json",
                             d / "checkpoints", d / "history.csv", d / "grad_stats.csv")
            wall = time.perf_counter() - t0
        summaries = list(runs.values())
        losses = [s["val_loss"] for s in summaries]
        tokens = sum(s["tokens"] for s in summaries)
        row = {"variant": variant, "steps": summaries[0]["steps"],
               "n_params": count_params(mc)[0], "val_loss": losses,
               "mean": statistics.mean(losses),
               "sd": statistics.stdev(losses) if len(losses) > 1 else 0.0,
               "wall_seconds": wall, "train_seconds": summaries[0]["train_seconds"],
               "tokens_per_second": tokens / summaries[0]["train_seconds"],
               "gpu_busy": busy.share,
               "seed_000": SEED_000.get(variant) if dataset == "shakespeare" else None}
        rows.append(row)
        print(f"{variant:<9} {row['steps']:>5} steps  val {row['mean']:.4f} +- {row['sd']:.4f} "
              f"({', '.join(f'{v:.4f}' for v in losses)})  wall {wall:.1f} s  "
              f"train {row['train_seconds']:.1f} s  {row['tokens_per_second']:,.0f} tokens/s  "
              f"GPU busy {busy}", flush=True)
    (args.out / "results.json").write_text(json.dumps(rows, indent=1))
    print("\n| variant | steps | params | val loss, mean +- sd over seeds | seed 000 (1 seed) "
          "| stage wall | tokens/s | GPU busy |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        busy = "n/a" if r["gpu_busy"] is None else f"{100 * r['gpu_busy']:.0f}%"
        ref = "-" if r["seed_000"] is None else f"{r['seed_000']:.3f}"
        print(f"| {r['variant']} | {r['steps']:,} | {r['n_params']:,} | {r['mean']:.3f} +- "
              f"{r['sd']:.3f} | {ref} | {r['wall_seconds']:.0f} s | "
              f"{r['tokens_per_second']:,.0f} | {busy} |")


if __name__ == "__main__":
    main()
