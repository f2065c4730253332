"""Training throughput of lmablate's baseline vs a seed-000-style reference, and its MFU.

    python benchmarks/bench_throughput.py [--steps 3] [--repeats 12] [--loop-steps 8] [--smoke]

``--smoke``: one step per repeat, one repeat, a small matmul peak: checks that the script runs
(seconds), its figures mean nothing.

Model: the seed-scale baseline (conf/profile/seed-scale.yaml: d_model 96, 8 layers, 8 heads,
context 128, batch 16; learned positions, pre-norm LayerNorm, ReLU FFN 4x), vocabulary of the
generated arithmetic data. Compared, in one process, on the device lmablate picks ("auto"):

1. model step: ``lmablate.model.gpt.GPT`` vs ``reference_model.MinGPT`` (fused qkv Linear, explicit
   masked softmax attention), identical batches, optimizer (lmablate's AdamW groups), grad clip
   and autocast; the two models are first checked to compute the same loss from the same weights.
   lmablate's side runs the pipeline's own step, ``lmablate.train.training.train_step``, with the
   learning-rate scheduler ``train_model`` uses (``make_scheduler`` over the steps the
   comparison runs); the reference runs the same
   step written out by hand, without a scheduler (which only adds to lmablate's time).
2. training loop: ``lmablate.train.training.train_model`` (its own tokens/s, which times the steps
   only) vs seed 000's loop (makemore sampler with a Python loop over the batch, plain AdamW).
3. batch sampler: ``lmablate.data.token_data.get_batch`` (one numpy gather) vs the makemore sampler.

Model FLOPs utilisation = ``lmablate.model.gpt.flops_per_token(cfg)`` x tokens/s / measured matmul
peak (best n x n fp32 matmul, n in 1024, 2048; on CUDA also bf16, the dtype autocast uses there).
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

import common  # first: it disables tqdm before torch imports it

import numpy as np
import torch

from lmablate.config import study as lconfig
from lmablate.data.token_data import TokenData, get_batch
from lmablate.model.gpt import GPT, flops_per_token
from lmablate.train.device import autocast
from lmablate.train.training import make_optimizer, make_scheduler, train_model, train_step
from reference_model import MinGPT, copy_from_lmablate, seed_get_batch


def seed_scale_config(vocab_size: int) -> tuple[lconfig.ModelConfig, lconfig.TrainConfig]:
    cfg = common.profile_config("seed-scale")
    mcfg = cfg.model_config("baseline", vocab_size)
    assert (mcfg.d_model, mcfg.n_layers, mcfg.n_heads, mcfg.context_length) == (96, 8, 8, 128)
    assert cfg.train.batch_size == 16
    return mcfg, cfg.train


def make_stepper(model, tcfg: lconfig.TrainConfig, batches, device, total_steps: int):
    """A function running one optimizer step per batch of ``batches`` with the pipeline's own
    step, :func:`lmablate.train.training.train_step`, and the optimizer and learning-rate scheduler
    that ``train_model`` builds (``make_optimizer``, ``make_scheduler`` over ``total_steps``,
    the steps of all the calls the comparison makes)."""
    opt = make_optimizer(model, tcfg, 1e-3, device)
    sched = make_scheduler(opt, tcfg, total_steps)

    def run():
        for x, y in batches:
            train_step(model, opt, sched, x, y, grad_clip=tcfg.grad_clip, device=device)

    return run


def make_reference_stepper(model, tcfg: lconfig.TrainConfig, batches, device):
    """The reference's side of the model step: the same optimizer (lmablate's AdamW groups),
    autocast and grad clip, written out as seed 000 writes its step (no scheduler)."""
    opt = make_optimizer(model, tcfg, 1e-3, device)

    def run():
        for x, y in batches:
            with autocast(device):
                _, loss = model(x, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), tcfg.grad_clip)
            opt.step()
            loss.item()

    return run


def make_fwd_bwd(model, batches, device):
    """Forward + backward only (no optimizer): the models' own share of a step."""

    def run():
        for x, y in batches:
            with autocast(device):
                _, loss = model(x, y)
            loss.backward()
        model.zero_grad(set_to_none=True)

    return run


def seed_loop(mcfg, data: torch.Tensor, batch_size: int, steps: int, device, seed: int) -> float:
    """Seed 000's training loop (makemore: plain AdamW, no clip, Python-loop sampler) on a fresh
    model; returns the seconds of its ``steps`` steps (model creation untimed, as in
    train_model's tokens_per_second)."""
    torch.manual_seed(seed)
    model = MinGPT(mcfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    common.sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        x, y = seed_get_batch(data, batch_size, mcfg.context_length, device)
        with autocast(device):
            _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()  # seed 000 logs the loss; lmablate needs it for the divergence check
    common.sync(device)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=None,
                    help="optimizer steps per timed repeat of the model-step comparison")
    ap.add_argument("--repeats", type=int, default=12)
    ap.add_argument("--loop-steps", type=int, default=None,
                    help="steps per training-loop run (comparison 2)")
    ap.add_argument("--loop-repeats", type=int, default=5)
    ap.add_argument("--smoke", action="store_true",
                    help="tiny sizes: checks that the script runs, in seconds")
    args = ap.parse_args()
    device = common.auto_device()
    if args.smoke:
        args.steps, args.repeats, args.loop_steps, args.loop_repeats = 1, 1, 2, 1
    steps = args.steps or (50 if device.type == "cuda" else 3)
    loop_steps = args.loop_steps or (100 if device.type == "cuda" else 8)
    peak_sizes = (256,) if args.smoke else (1024, 2048)
    print(common.machine_header("training throughput: lmablate GPT vs seed-000 reference", device))

    with tempfile.TemporaryDirectory() as tmp:
        base = common.load_default_config()
        tokens_dir = common.arithmetic_data(base, Path(tmp)) / "tokens"
        data = TokenData.load(tokens_dir)
        data = TokenData(np.array(data.train), np.array(data.val), np.array(data.test),
                         data.vocab_size)
    mcfg, tcfg = seed_scale_config(data.vocab_size)
    what = "seed-scale baseline"
    if args.smoke:  # the same architecture, tiny
        mcfg, what = mcfg.replace(**common.TINY_MODEL), "smoke-size baseline"
    B, T = tcfg.batch_size, mcfg.context_length
    fpt = flops_per_token(mcfg)
    print(f"model   : {what} d_model={mcfg.d_model} n_layers={mcfg.n_layers} "
          f"n_heads={mcfg.n_heads} context={T} batch={B} vocab={mcfg.vocab_size}; "
          f"flops_per_token={fpt / 1e6:.2f} MFLOP (Kaplan 6N + 6 L T C)")
    print(f"timing  : {steps} steps ({steps * B * T} tokens) per repeat, 1 warm-up + "
          f"{args.repeats} repeats, interleaved, median [min..max]")

    # ---- peak
    peak32, n32 = common.matmul_peak_flops(device, torch.float32, sizes=peak_sizes)
    peaks = {"fp32": peak32}
    line = f"peak    : fp32 matmul {peak32 / 1e9:.1f} GFLOP/s (best of {n32}x{n32})"
    if device.type == "cuda":
        peaks["bf16"], n16 = common.matmul_peak_flops(device, torch.bfloat16, sizes=(4096, 8192))
        line += f"; bf16 matmul {peaks['bf16'] / 1e12:.1f} TFLOP/s ({n16}x{n16})"
    print(line)
    compute = "bf16" if device.type == "cuda" else "fp32"  # what autocast() runs in
    peak = peaks[compute]

    # ---- 0. same function
    torch.manual_seed(0)
    gpt = GPT(mcfg).to(device)
    ref = copy_from_lmablate(MinGPT(mcfg).to(device), gpt)
    g = torch.Generator().manual_seed(0)
    x, y = get_batch(data.train, B, T, g, device)
    with torch.no_grad():
        diff = (gpt(x, y)[1] - ref(x, y)[1]).abs().item()
        ldiff = (gpt(x)[0] - ref(x)[0]).abs().max().item()
    n_gpt = sum(p.numel() for p in gpt.parameters())
    n_ref = sum(p.numel() for p in ref.parameters())
    print(f"check   : same weights -> |loss diff| {diff:.2e}, max |logit diff| {ldiff:.2e}; "
          f"parameters lmablate {n_gpt:,} reference {n_ref:,}")

    # ---- 1. model step, identical batches
    batches = [get_batch(data.train, B, T, g, device) for _ in range(steps)]
    torch.manual_seed(1)
    gpt = GPT(mcfg).to(device)
    ref = copy_from_lmablate(MinGPT(mcfg).to(device), gpt)
    total = steps * (args.repeats + 1)  # warm-up included
    times = common.interleaved({"lmablate": make_stepper(gpt, tcfg, batches, device, total),
                                "reference": make_reference_stepper(ref, tcfg, batches, device)},
                               device, args.repeats)
    tps = {k: steps * B * T / min(v) for k, v in times.items()}
    tps_med = {k: steps * B * T / common.median(v) for k, v in times.items()}
    print("\n1. model step (fwd + bwd + clip + AdamW), identical batches; lmablate: "
          "lmablate.train.training.train_step (+ its LR scheduler)")
    for k in ("reference", "lmablate"):
        print(f"   {k:<9} {common.fmt_seconds(times[k])} per {steps} steps -> best "
              f"{tps[k]:,.0f} tokens/s (median {tps_med[k]:,.0f})")
    print(f"   ratio lmablate / reference tokens/s = "
          f"{tps['lmablate'] / tps['reference']:.2f}x best, "
          f"{tps_med['lmablate'] / tps_med['reference']:.2f}x median (target >= 1.0x)")

    fb = common.interleaved({"lmablate": make_fwd_bwd(gpt, batches, device),
                             "reference": make_fwd_bwd(ref, batches, device)},
                            device, args.repeats)
    print(f"   forward + backward only: lmablate {common.fmt_seconds(fb['lmablate'])}, reference "
          f"{common.fmt_seconds(fb['reference'])} -> "
          f"{min(fb['reference']) / min(fb['lmablate']):.2f}x "
          f"best, {common.median(fb['reference']) / common.median(fb['lmablate']):.2f}x median")

    # ---- 2. whole training loops
    train_tokens = torch.from_numpy(data.train.astype(np.int64))
    loop_cfg = dataclasses.replace(tcfg, eval_interval=loop_steps, eval_iters=1,
                                   warmup_fraction=0.0)
    lm_tps, ref_tps = [], []
    seed_loop(mcfg, train_tokens, B, loop_steps, device, seed=0)  # warm-up
    train_model(mcfg, loop_cfg, data, seed=0, lr=1e-3, steps=loop_steps, device=device)
    for r in range(args.loop_repeats):
        res = train_model(mcfg, loop_cfg, data, seed=r, lr=1e-3, steps=loop_steps, device=device)
        lm_tps.append(res.tokens_per_second)
        ref_tps.append(loop_steps * B * T / seed_loop(mcfg, train_tokens, B, loop_steps, device,
                                                     seed=r))
    print(f"\n2. training loop, {loop_steps} steps on a fresh model, 1 warm-up + "
          f"{args.loop_repeats} repeats: lmablate.train.training.train_model "
          f"(its own tokens_per_second) "
          "vs seed 000's loop")
    for k, v in (("reference", ref_tps), ("lmablate", lm_tps)):
        print(f"   {k:<9} best {max(v):,.0f} tokens/s (median {common.median(v):,.0f})")
    print(f"   ratio lmablate / reference tokens/s = {max(lm_tps) / max(ref_tps):.2f}x best, "
          f"{common.median(lm_tps) / common.median(ref_tps):.2f}x median")

    # ---- MFU; the peak is measured again now, as other load on the machine only lowers it
    again = common.matmul_peak_flops(device, torch.float32 if compute == "fp32" else torch.bfloat16,
                                     sizes=peak_sizes if compute == "fp32" else (4096, 8192))[0]
    peak = max(peak, again)
    print(f"\nMFU = flops_per_token x best tokens/s / {compute} matmul peak "
          f"{peak / 1e9:,.1f} GFLOP/s (best of the start and end measurements)")
    for what, k, v in (("model step", "reference", tps["reference"]),
                       ("model step", "lmablate", tps["lmablate"]),
                       ("train loop", "reference", max(ref_tps)),
                       ("train loop", "lmablate", max(lm_tps))):
        print(f"   {what} {k:<9}: {fpt * v / 1e9:6.1f} GFLOP/s = MFU {fpt * v / peak:.1%}")

    # ---- 3. sampler
    print("\n3. batch sampler, per batch (lmablate: one gather; reference: loop over the batch)")
    n = 3 if args.smoke else 50
    for bs in (B, 1024):
        t_lm = common.repeat(lambda bs=bs: get_batch(data.train, bs, T, g, device), device, n, 2)
        t_ref = common.repeat(lambda bs=bs: seed_get_batch(train_tokens, bs, T, device),
                              device, n, 2)
        print(f"   batch {bs:>4}: lmablate {common.median(t_lm) * 1e6:8.1f} us, reference "
              f"{common.median(t_ref) * 1e6:8.1f} us -> "
              f"{common.median(t_ref) / common.median(t_lm):.1f}x")


if __name__ == "__main__":
    main()
