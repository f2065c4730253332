"""Arithmetic evaluation: batched KV-cached greedy decoding vs seed 000's one-at-a-time loop.

    python benchmarks/bench_decode.py [--problems 2000] [--loop-problems 200] [--train-steps 1000]
                                      [--repeats 5] [--smoke]

A default-size arithmetic baseline (params.yaml: d_model 64, 2 layers, 4 heads, context 64) is
trained for ``--train-steps`` steps on freshly generated arithmetic data (params.yaml's dataset,
with ``--problems`` test problems), so its predictions are not trivial. Then, on the device
lmablate picks:

* lmablate: ``lmablate.evaluate.metrics.arithmetic_predictions`` (all problems of a batch at once,
  KV cache, greedy), at ``evaluate.batch_size`` from params.yaml (the pipeline setting), 256, 512
  and one batch of everything, in one thread of jobs; then at ``evaluate.batch_size`` and 256
  with one job thread per core (``workers=``; the evaluate stage instead runs the seeds'
  models concurrently, which uses the cores the same way);
* reference: seed 000's loop made greedy: one problem at a time, a full forward (no cache) over
  the growing sequence, argmax of the last position, until ``$`` (capped at the answer length,
  which only shortens the reference; predictions are then padded with ``$`` as lmablate does).

The reference runs on the first ``--loop-problems`` problems and its per-problem time is
extrapolated to all of them; its predictions must equal lmablate's on that subset. All arms
(the reference and every batched setting) run in turn, one warm-up round and then
``--repeats`` rounds (``common.interleaved``), so that other load affects them alike.
``--smoke``: tiny sizes, checks that the script runs in seconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path

import common  # first: it disables tqdm before torch imports it

import torch

from lmablate.data.arithmetic import split_problem
from lmablate.data.token_data import TokenData
from lmablate.data.tokenizer import load_tokenizer
from lmablate.evaluate.metrics import arithmetic_predictions, arithmetic_scores
from lmablate.execution.parallel import cpu_count
from lmablate.train.device import autocast
from lmablate.train.training import train_model


@torch.no_grad()
def seed_loop_predictions(model, tok, problems: list[str], device: torch.device) -> list[str]:
    """Seed 000's evaluation loop (greedy): one problem at a time, no cache."""
    ctx = model.cfg.context_length
    end = tok.token_id("$")
    preds = []
    for line in problems:
        prompt, target = split_problem(line)
        idx = torch.tensor(tok.encode(prompt), dtype=torch.long, device=device).view(1, -1)
        n0 = idx.size(1)
        while idx.size(1) - n0 < len(target):  # seed 000 has no cap; see the module doc
            with autocast(device):
                logits, _ = model(idx[:, -ctx:])
            idx_next = logits[:, -1, :].float().argmax(dim=-1, keepdim=True)
            idx = torch.cat((idx, idx_next), dim=1)
            if idx_next.item() == end:
                break
        pred = tok.decode(idx[0, n0:].cpu().numpy())
        preds.append(pred + "$" * (len(target) - len(pred)))
    return preds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--problems", type=int, default=2000)
    ap.add_argument("--loop-problems", type=int, default=200)
    ap.add_argument("--train-steps", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--smoke", action="store_true",
                    help="64 problems, 8 for the reference, 10 training steps, 1 round")
    args = ap.parse_args()
    if args.smoke:
        args.problems, args.loop_problems, args.train_steps, args.repeats = 64, 8, 10, 1
    device = common.auto_device()
    print(common.machine_header("arithmetic decoding: batched + KV cache vs one at a time", device))

    cfg = common.load_default_config()
    with tempfile.TemporaryDirectory() as tmp:
        ds_dir = common.arithmetic_data(cfg, Path(tmp), n_test=args.problems)
        data = TokenData.load(ds_dir / "tokens")
        tok = load_tokenizer(ds_dir / "tokens")
        problems = (ds_dir / "raw" / "test.txt").read_text(encoding="utf-8").split()
        mcfg = cfg.model_config("baseline", data.vocab_size)
        tcfg = dataclasses.replace(cfg.train, eval_interval=args.train_steps)
        res = train_model(mcfg, tcfg, data, seed=0, lr=3e-3, steps=args.train_steps,
                          device=device)
    model = res.model.eval()
    print(f"model   : default baseline d_model={mcfg.d_model} n_layers={mcfg.n_layers} "
          f"n_heads={mcfg.n_heads} context={mcfg.context_length}, trained {args.train_steps} "
          f"steps (lr 3e-3): val loss {res.val_loss:.3f} nats/char")
    n_loop = min(args.loop_problems, len(problems))
    bs = cfg.evaluate.batch_size
    answer = len(split_problem(problems[0])[1])
    print(f"problems: {len(problems)} test problems (answer = {answer - 1} chars + '$'); reference "
          f"on the first {n_loop}; every arm in turn (interleaved), 1 warm-up + {args.repeats} "
          "rounds, median [min..max]; ratios of best times (least disturbed by other load) and "
          "of medians")

    # ---- every arm in one interleaved loop (A B C ... A B C ...), the reference first
    out: dict = {}
    cores = cpu_count() if device.type == "cpu" else 1
    bs = min(bs, len(problems))
    settings = [(b, 1) for b in sorted({b for b in (bs, 256, 512) if b < len(problems)}
                                       | {bs, len(problems)})]
    settings += [(b, cores) for b in sorted({bs, min(256, len(problems))}) if cores > 1]

    def reference():
        out["reference"] = seed_loop_predictions(model, tok, problems[:n_loop], device)

    arms = {"reference": reference}
    for b, w in settings:
        def batched(b=b, w=w):
            out[b, w] = arithmetic_predictions(model, tok, problems, b, device, workers=w)

        arms[b, w] = batched
    times = common.interleaved(arms, device, args.repeats, warmup=1)
    loop_times = times.pop("reference")
    batch_times = times
    preds = out[bs, 1]
    same_across_batching = all(o == preds for k, o in out.items() if k != "reference")
    loop_preds = out["reference"]
    identical = loop_preds == preds[:n_loop]
    n_diff = sum(a != b for a, b in zip(loop_preds, preds[:n_loop]))

    scores = arithmetic_scores(problems, preds)
    distinct = len(set(preds))
    print(f"quality : char accuracy {scores['char_accuracy']:.3f}, exact match "
          f"{scores['exact_match']:.4f}, {distinct} distinct predictions of {len(preds)}; "
          f"e.g. {split_problem(problems[0])[0]} -> {preds[0]} "
          f"(target {split_problem(problems[0])[1]})")
    print(f"identity: reference == lmablate on the first {n_loop}: {identical} "
          f"({n_diff} differ); lmablate's predictions equal at every batch size: "
          f"{same_across_batching}")

    loop_pps = n_loop / min(loop_times)
    print(f"\n   reference one-at-a-time, no cache : {common.fmt_seconds(loop_times)} for {n_loop} "
          f"-> best {loop_pps:,.1f} problems/s; extrapolated {len(problems) / loop_pps:.1f} s for "
          f"{len(problems)}")
    for (b, w), t in batch_times.items():
        pps, pps_med = len(problems) / min(t), len(problems) / common.median(t)
        ratio_med = pps_med / (n_loop / common.median(loop_times))
        how = (f"{w} threads x 1" if w > 1 else f"1 x {torch.get_num_threads()} threads")
        note = ("  <- evaluate.batch_size" if b == bs and w == 1 else
                "  <- all cores on one model" if w > 1 and b == bs else "")
        print(f"   lmablate batch {b:>4} + KV cache, {how:<13}: {common.fmt_seconds(t)} for "
              f"{len(problems)} -> best {pps:,.0f} problems/s -> ratio to reference = "
              f"{pps / loop_pps:.2f}x best ({ratio_med:.2f}x median){note}")
    p_len, a_len = (len(x) for x in split_problem(problems[0]))
    ref_tokens = sum(p_len + i for i in range(a_len))  # a full forward per generated token
    lm_tokens = p_len + a_len - 1  # prefill once, then one token per step
    print(f"   work: tokens through the model per problem, reference {ref_tokens} vs lmablate "
          f"{lm_tokens} = {ref_tokens / lm_tokens:.1f}x fewer FLOPs; the rest of the speed-up is "
          "per-call overhead amortised over the batch")
    print("   (no target: the figures are for comparison within this run)")


if __name__ == "__main__":
    main()
