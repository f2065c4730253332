"""The seeds of one variant trained as one batched model vs today's seeds-as-threads.

    python benchmarks/bench_batched_seeds.py [--seeds 5] [--steps 100] [--rounds 3]
                                             [--compile-steps 30]

The default study's model (params.yaml ``model``, baseline, d_model 64, batch 16 x 64) on the
arithmetic data, ``--seeds`` seeds of ``--steps`` steps each (evaluations at params.yaml's
interval included), run in this process on the device lmablate picks, tracking off. Arms, run
interleaved over ``--rounds`` rounds, tokens/s = seeds x steps x batch x context / wall time:

* threads: today's train stage on a CPU: every seed ``train_model`` in a thread of
  ``lmablate.parallel.map_jobs`` with the workers and intra-op threads the stage picks;
* batched@k: ``lmablate.batched.train_seeds`` with k intra-op threads (k = 1 and all cores);
* batched-foreach@k: the same with the for-each AdamW instead of the fused one.

Then ``torch.compile`` of the batched step (vmapped forward + backward; the optimizer stays
eager): compile time, steady-state tokens/s against the eager step, and the largest loss
difference to eager over ``--compile-steps`` steps from the same start.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path

import common  # first: it disables tqdm before torch imports it

import torch
from torch.func import functional_call, stack_module_state, vmap

from lmablate import batched
from lmablate.model import GPT
from lmablate.parallel import INTRA_OP_THREADS, map_jobs, worker_count
from lmablate.tokens import TokenData, get_batch
from lmablate.training import decayed_parameter_names, make_scheduler, train_model


def foreach_adamw(params, cfg, lr, device, decayed):
    """make_stacked_optimizer's groups with the for-each AdamW instead of the fused one."""
    groups = [{"params": [p for n, p in params.items() if n in decayed],
               "weight_decay": cfg.weight_decay},
              {"params": [p for n, p in params.items() if n not in decayed],
               "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(cfg.beta1, cfg.beta2), foreach=True)


def compile_probe(model_cfg, train_cfg, data, seeds, steps, device, lr) -> None:
    """Eager vs ``torch.compile``d batched forward + backward, same start, same batches."""
    T, B, S = model_cfg.context_length, train_cfg.batch_size, len(seeds)

    def setup():
        models = []
        for s in seeds:
            torch.manual_seed(s)
            models.append(GPT(model_cfg).to(device))
        params, _ = stack_module_state(models)
        opt = batched.make_stacked_optimizer(params, train_cfg, lr, device,
                                             decayed_parameter_names(models[0]))
        return models[0], params, opt, make_scheduler(opt, train_cfg, steps)

    def make_fwd(base):
        loss = vmap(lambda p, x, y: functional_call(base, p, (x, y))[1])

        def fwd(params, x, y):
            with batched._attention_backend(device):
                return loss(params, x, y)
        return fwd

    def run(fwd, params, opt, sched, n):
        gens = [torch.Generator().manual_seed(s) for s in seeds]
        out, times = [], []
        for _ in range(n):
            t0 = time.perf_counter()
            xs, ys = zip(*(get_batch(data.train, B, T, g, device) for g in gens))
            losses = fwd(params, torch.stack(xs), torch.stack(ys))
            opt.zero_grad(set_to_none=True)
            losses.sum().backward()
            batched.clip_grad_norm_per_seed_([p.grad for p in params.values()],
                                             train_cfg.grad_clip)
            opt.step()
            sched.step()
            out.append(losses.tolist())
            common.sync(device)
            times.append(time.perf_counter() - t0)
        return out, times

    base, params, opt, sched = setup()
    eager, t_eager = run(make_fwd(base), params, opt, sched, steps)
    base, params, opt, sched = setup()
    fwd = torch.compile(make_fwd(base))
    t0 = time.perf_counter()
    compiled, t_comp = run(fwd, params, opt, sched, steps)
    first = t_comp[0]
    total = time.perf_counter() - t0
    print(f"   compile: first step {first:.1f} s (compile + run), {steps} steps {total:.1f} s")
    tok = S * B * T
    e, c = statistics.median(t_eager[3:]), statistics.median(t_comp[3:])
    print(f"   steady state (median of steps 4..{steps}): eager {tok / e:,.0f} tokens/s, "
          f"compiled {tok / c:,.0f} tokens/s -> {e / c:.2f}x")
    diff = max(abs(a - b) for ra, rb in zip(eager, compiled) for a, b in zip(ra, rb))
    print(f"   max |loss eager - compiled| over {steps} steps x {S} seeds: {diff:.2e}")
    saved = e - c
    if saved > 0:
        print(f"   break-even after {(first - c) / saved:,.0f} steps of {S} seeds "
              f"(compile cost / time saved per step)")
    else:
        print("   compiled is not faster: never breaks even")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--compile-steps", type=int, default=30, help="0 skips the compile probe")
    args = ap.parse_args()
    device = common.auto_device()
    print(common.machine_header("seeds of one variant: one batched model vs threads", device))
    cfg = common.load_default_config()
    seeds = list(range(args.seeds))
    cores = torch.get_num_threads()
    workers = worker_count(cfg.runtime, len(seeds), device, all_at_once=True)
    threads = INTRA_OP_THREADS
    with tempfile.TemporaryDirectory() as tmp:
        data = TokenData.load(common.arithmetic_data(cfg, Path(tmp)) / "tokens")
        model_cfg = dataclasses.replace(cfg.model_config("baseline", data.vocab_size), d_model=64)
        train_cfg = cfg.train
        lr, steps = 3e-3, args.steps
        tokens = len(seeds) * steps * train_cfg.batch_size * model_cfg.context_length
        print(f"model   : baseline d_model={model_cfg.d_model} n_layers={model_cfg.n_layers} "
              f"n_heads={model_cfg.n_heads} context={model_cfg.context_length} batch="
              f"{train_cfg.batch_size}; {len(seeds)} seeds x {steps} steps (eval every "
              f"{train_cfg.eval_interval}, {train_cfg.eval_iters} batches) = {tokens:,} tokens")
        print(f"threads : train stage's choice: {workers} seed thread(s) at a time x {threads} "
              f"intra-op thread(s) (runtime.workers=0)")

        def threads_arm():
            map_jobs(lambda s: train_model(model_cfg, train_cfg, data, seed=s, lr=lr,
                                           steps=steps, device=device), seeds, workers)

        def batched_arm(k: int, foreach: bool = False):
            def go():
                before, make = torch.get_num_threads(), batched.make_stacked_optimizer
                torch.set_num_threads(k)
                if foreach:
                    batched.make_stacked_optimizer = foreach_adamw
                try:
                    batched.train_seeds(model_cfg, train_cfg, data, seeds=seeds, lr=lr,
                                        steps=steps, device=device)
                finally:
                    torch.set_num_threads(before)
                    batched.make_stacked_optimizer = make
            return go

        arms = {"threads": threads_arm}
        for k in sorted({1, cores}):
            arms[f"batched@{k}"] = batched_arm(k)
            arms[f"batched-foreach@{k}"] = batched_arm(k, foreach=True)
        # warm-up: one-time costs (torch._dynamo import by the first optimizer step, vmap setup)
        train_model(model_cfg, dataclasses.replace(train_cfg, steps=2), data, seed=0, lr=lr,
                    steps=2, device=device)
        batched.train_seeds(model_cfg, dataclasses.replace(train_cfg, steps=2), data,
                            seeds=seeds[:2], lr=lr, steps=2, device=device)
        times = common.interleaved(arms, device, args.rounds, warmup=0)
        print(f"\nwhole runs, {args.rounds} rounds interleaved: tokens/s median [min..max]")
        rate = {}
        for name, ts in times.items():
            rs = [tokens / t for t in ts]
            rate[name] = rs
            print(f"   {name:<20} {statistics.median(rs):>9,.0f} [{min(rs):,.0f}..{max(rs):,.0f}]"
                  f"   wall {common.fmt_seconds(ts)}")
        print("\nratio batched / threads (per round, same round's threads arm):")
        for name in arms:
            if name != "threads":
                ratios = [b / t for b, t in zip(rate[name], rate["threads"])]
                print(f"   {name:<20} median {statistics.median(ratios):.2f}x "
                      f"[{min(ratios):.2f}..{max(ratios):.2f}]")
        if args.compile_steps:
            print(f"\ntorch.compile of the batched forward + backward ({cores} intra-op threads, "
                  f"{len(seeds)} seeds, {args.compile_steps} steps):")
            compile_probe(model_cfg, train_cfg, data, seeds, args.compile_steps, device, lr)


if __name__ == "__main__":
    main()
