"""The seeds of one variant trained as one batched model vs the train stage's seeds-as-threads.

    python benchmarks/bench_batched_seeds.py [--seeds 5] [--steps 100] [--rounds 3]
                                             [--model default|seed-scale] [--foreach]
                                             [--compile-steps 0] [--compile-only] [--smoke]

The default study's model (params.yaml ``model``, baseline, d_model 64, batch 16 x 64) on the
arithmetic data, ``--seeds`` seeds of ``--steps`` steps each (evaluations at params.yaml's
interval included), run in this process on the device lmablate picks, tracking off. Arms, run
interleaved over ``--rounds`` rounds, tokens/s = seeds x steps x batch x context / wall time:

* threads: the train stage on a CPU: every seed ``train_model`` in a thread of
  ``lmablate.execution.parallel.map_jobs`` with the workers and intra-op threads the stage picks;
* batched@k: ``lmablate.train.batched.train_seeds`` with k intra-op threads (k = 1 and all cores);
* batched, k groups: the seeds split into one batched group per core, the groups in threads;
* batched-foreach@k (``--foreach``): the same with the for-each AdamW instead of the fused one.

On CUDA the batched arms are eager and CUDA-graph replay (the train stage's path) instead of
the intra-op thread counts. ``--smoke``: 2 seeds x 4 steps, one round: checks that it runs.

With ``--compile-steps N`` > 0, then ``torch.compile`` of the batched step (vmapped forward +
backward; the optimizer stays eager): compile time, steady-state tokens/s against the eager step,
and the largest loss difference to eager over ``--compile-steps`` steps from the same start.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
from pathlib import Path

import common  # first: it disables tqdm before torch imports it

import torch
from torch.func import functional_call, stack_module_state, vmap

from lmablate.data.token_data import TokenData, get_batch
from lmablate.execution.parallel import INTRA_OP_THREADS, map_jobs, worker_count
from lmablate.model.gpt import GPT
from lmablate.train import batched
from lmablate.train.training import decayed_parameter_names, make_scheduler, train_model


def foreach_adamw(params, cfg, lr, device, decayed):
    """make_stacked_optimizer's groups with the for-each AdamW instead of the fused one."""
    groups = [{"params": [p for n, p in params.items() if n in decayed],
               "weight_decay": cfg.weight_decay},
              {"params": [p for n, p in params.items() if n not in decayed],
               "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(cfg.beta1, cfg.beta2), foreach=True)


def compile_probe(model_cfg, train_cfg, data, seeds, steps, device, lr,
                  modes=("default",)) -> None:
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
        """n steps; returns the losses, the first step's seconds (compilation included) and
        the mean seconds of the others (timed as one block: no wait for the device per step)."""
        gens = [torch.Generator().manual_seed(s) for s in seeds]
        out = []

        def one_step():
            xs, ys = zip(*(get_batch(data.train, B, T, g, device) for g in gens))
            # mode "reduce-overhead" replays CUDA graphs whose outputs the next replay
            # overwrites: mark each step's start, and keep a copy of the losses
            torch.compiler.cudagraph_mark_step_begin()
            losses = fwd(params, torch.stack(xs), torch.stack(ys)).clone()
            opt.zero_grad(set_to_none=True)
            losses.sum().backward()
            batched.clip_grad_norm_per_seed_([p.grad for p in params.values()],
                                             train_cfg.grad_clip)
            opt.step()
            sched.step()
            out.append(losses.detach())

        first = common.time_call(one_step, device)
        rest = common.time_call(lambda: [one_step() for _ in range(n - 1)], device) / (n - 1)
        return [o.tolist() for o in out], first, rest

    tok = S * B * T
    base, params, opt, sched = setup()
    eager, _, e = run(make_fwd(base), params, opt, sched, steps)
    print(f"   eager   : {tok / e:,.0f} tokens/s (mean of steps 2..{steps})")
    for mode in modes:
        torch._dynamo.reset()
        base, params, opt, sched = setup()
        fwd = torch.compile(make_fwd(base), mode=mode)
        compiled, first, c = run(fwd, params, opt, sched, steps)
        diff = max(abs(a - b) for ra, rb in zip(eager, compiled) for a, b in zip(ra, rb))
        print(f"   mode {mode!r}: first step {first:.1f} s (compile + run); then "
              f"{tok / c:,.0f} tokens/s -> {e / c:.2f}x eager; max |loss eager - compiled| "
              f"over {steps} steps x {S} seeds: {diff:.2e}")
        saved = e - c
        if saved > 0:
            print(f"      break-even after {(first - c) / saved:,.0f} steps of {S} seeds "
                  f"(compile cost / time saved per step)")
        else:
            print("      compiled is not faster: never breaks even")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", choices=("default", "seed-scale"), default="default",
                    help="params.yaml's model at d_model 64, or conf/profile/seed-scale.yaml's "
                         "(d_model 96, 8 layers, context 128)")
    ap.add_argument("--foreach", action="store_true",
                    help="CPU: add arms with the for-each AdamW instead of the fused one")
    ap.add_argument("--compile-steps", type=int, default=0,
                    help="steps of the torch.compile probe (0, the default, skips it; on a CPU "
                         "compilation alone takes about a minute)")
    ap.add_argument("--compile-only", action="store_true", help="skip the whole-run arms")
    ap.add_argument("--compile-modes", default="default",
                    help="torch.compile modes to probe, comma-separated (e.g. "
                         "default,reduce-overhead: the latter adds CUDA graphs)")
    ap.add_argument("--smoke", action="store_true",
                    help="2 seeds x 4 steps, 1 round, no compile probe: checks that it runs")
    args = ap.parse_args()
    if args.smoke:
        args.seeds, args.steps, args.rounds, args.compile_steps = 2, 4, 1, 0
        args.compile_only = False
    device = common.auto_device()
    print(common.machine_header("seeds of one variant: one batched model vs threads", device))
    cfg = common.load_default_config()
    if args.model == "seed-scale":
        scale = common.profile_config("seed-scale")
        cfg = dataclasses.replace(cfg, model=scale.model, train=dataclasses.replace(
            cfg.train, eval_interval=scale.train.eval_interval,
            eval_iters=scale.train.eval_iters, batch_size=scale.train.batch_size))
    seeds = list(range(args.seeds))
    cores = torch.get_num_threads()
    workers = worker_count(cfg.runtime, len(seeds), device, all_at_once=True)
    threads = INTRA_OP_THREADS
    with tempfile.TemporaryDirectory() as tmp:
        data = TokenData.load(common.arithmetic_data(cfg, Path(tmp)) / "tokens")
        width = 64 if args.model == "default" else cfg.model.d_model
        model_cfg = dataclasses.replace(cfg.model_config("baseline", data.vocab_size),
                                        d_model=width)
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

        def batched_arm(k: int, foreach: bool = False, cuda_graph: bool | None = None):
            def go():
                before, make = torch.get_num_threads(), batched.make_stacked_optimizer
                torch.set_num_threads(k)
                if foreach:
                    batched.make_stacked_optimizer = foreach_adamw
                try:
                    batched.train_seeds(model_cfg, train_cfg, data, seeds=seeds, lr=lr,
                                        steps=steps, device=device, cuda_graph=cuda_graph)
                finally:
                    torch.set_num_threads(before)
                    batched.make_stacked_optimizer = make
            return go

        def grouped_arm():
            """The seeds split into one vmapped group per core, the groups as threads of one
            intra-op thread each (as map_jobs runs the threads arm's seeds)."""
            groups = [seeds[i::cores] for i in range(cores)]
            map_jobs(lambda g: batched.train_seeds(model_cfg, train_cfg, data, seeds=g, lr=lr,
                                                   steps=steps, device=device), groups, cores)

        arms = {"threads": threads_arm}
        if device.type == "cuda":  # one intra-op setting: the host only launches kernels
            arms["batched (eager)"] = batched_arm(cores, cuda_graph=False)
            arms["batched (CUDA graph)"] = batched_arm(cores, cuda_graph=True)
        else:
            for k in sorted({1, cores}):
                arms[f"batched@{k}"] = batched_arm(k)
                if args.foreach:
                    arms[f"batched-foreach@{k}"] = batched_arm(k, foreach=True)
            if cores > 1:
                arms[f"batched, {cores} groups"] = grouped_arm
        if args.compile_only:
            arms = {}
        # warm-up: one-time costs (torch._dynamo import by the first optimizer step, vmap setup,
        # CUDA context and kernels)
        train_model(model_cfg, train_cfg, data, seed=0, lr=lr, steps=2, device=device)
        for graph in ((False, True) if device.type == "cuda" else (None,)):
            batched.train_seeds(model_cfg, train_cfg, data, seeds=seeds[:2], lr=lr, steps=2,
                                device=device, cuda_graph=graph)
        if not arms:
            print(f"\ntorch.compile of the batched forward + backward ({cores} intra-op "
                  f"threads, {len(seeds)} seeds, {args.compile_steps} steps):")
            compile_probe(model_cfg, train_cfg, data, seeds, args.compile_steps, device, lr,
                          modes=tuple(args.compile_modes.split(",")))
            return
        busy = {name: common.GpuBusy(device) for name in arms}

        def watched(name):
            def go():
                with busy[name]:
                    arms[name]()
            return go

        times = common.interleaved({n: watched(n) for n in arms}, device, args.rounds, warmup=0)
        print(f"\nwhole runs, {args.rounds} rounds interleaved: tokens/s median [min..max]"
              + ("; GPU busy share (NVML, last round)" if device.type == "cuda" else ""))
        rate = {}
        for name, ts in times.items():
            rs = [tokens / t for t in ts]
            rate[name] = rs
            print(f"   {name:<20} {statistics.median(rs):>9,.0f} [{min(rs):,.0f}..{max(rs):,.0f}]"
                  f"   wall {common.fmt_seconds(ts)}"
                  + (f"   GPU busy {busy[name]}" if device.type == "cuda" else ""))
        print("\nratio batched / threads (per round, same round's threads arm):")
        for name in arms:
            if name != "threads":
                ratios = [b / t for b, t in zip(rate[name], rate["threads"])]
                print(f"   ratio {name} / threads = {statistics.median(ratios):.2f}x median "
                      f"[{min(ratios):.2f}..{max(ratios):.2f}]")
        if args.compile_steps:
            print(f"\ntorch.compile of the batched forward + backward ({cores} intra-op threads, "
                  f"{len(seeds)} seeds, {args.compile_steps} steps):")
            compile_probe(model_cfg, train_cfg, data, seeds, args.compile_steps, device, lr,
                          modes=tuple(args.compile_modes.split(",")))


if __name__ == "__main__":
    main()
