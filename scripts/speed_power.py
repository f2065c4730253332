"""The power of the report's learning-speed test, by simulation.

Each simulated study draws the tokens to learn of ``n`` baseline seeds and ``n`` variant seeds
from log-normal distributions (the baseline's median ``--median`` tokens, the variant's that
times the ratio, seed-to-seed SD ``--sd`` in log tokens), rounds each up to the next evaluation
(every ``--eval-tokens``), censors it at the budget (``--budget`` tokens: never learned), and
runs the report's log-rank test (:func:`lmablate.report.stats.learning_speed.log_rank`). The
power is the share of studies it rejects at Holm's strictest level over ``--variants``
comparisons (alpha / variants), as the report's smallest p-value must. Defaults: the default
study's arithmetic (1,024 tokens a step, an evaluation every 100 steps, 2.46 M tokens; the
baseline's median 1.13 M) and the brute-force grid's spread of about 0.2
(docs/study-design.md, "Replicates").

    python scripts/speed_power.py --ratios 1.2 1.35 1.6 --seeds 5 6 8
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

from lmablate.report.stats.learning_speed import log_rank


def draw(rng: np.random.Generator, n: int, median: float, sd: float, every: float,
         budget: float) -> pd.DataFrame:
    """``n`` seeds' tokens to learn (rounded up to an evaluation) and whether they learned."""
    tokens = np.exp(np.log(median) + sd * rng.standard_normal(n))
    learned = tokens <= budget
    at = np.ceil(tokens / every) * every
    return pd.DataFrame({"tokens": np.where(learned, np.minimum(at, budget), budget),
                         "learned": learned})


def power(ratio: float, n: int, args: argparse.Namespace, rng: np.random.Generator) -> float:
    """The share of ``args.studies`` simulated studies whose log-rank p is below
    ``args.alpha / args.variants``."""
    level = args.alpha / args.variants
    rejected = 0
    for _ in range(args.studies):
        base = draw(rng, n, args.median, args.sd, args.eval_tokens, args.budget)
        var = draw(rng, n, args.median * ratio, args.sd, args.eval_tokens, args.budget)
        p, _ = log_rank(base, var)
        rejected += p < level
    return rejected / args.studies


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ratios", type=float, nargs="+", default=[1.2, 1.35, 1.6],
                    help="variant / baseline median tokens to learn")
    ap.add_argument("--seeds", type=int, nargs="+", default=[5, 6, 8], help="seeds a variant")
    ap.add_argument("--sd", type=float, default=0.2, help="seed-to-seed SD of log tokens")
    ap.add_argument("--median", type=float, default=1.13e6, help="baseline's median, tokens")
    ap.add_argument("--eval-tokens", type=float, default=102_400, help="tokens between evaluations")
    ap.add_argument("--budget", type=float, default=2.46e6, help="a run's tokens")
    ap.add_argument("--variants", type=int, default=3, help="comparisons Holm corrects over")
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--studies", type=int, default=400, help="simulated studies per cell")
    ap.add_argument("--seed", type=int, default=0, help="the simulation's random seed")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    print("| ratio | " + " | ".join(f"{n} seeds" for n in args.seeds) + " |")
    print("|---" * (len(args.seeds) + 1) + "|")
    for ratio in args.ratios:
        cells = [f"{power(ratio, n, args, rng):.2f}" for n in args.seeds]
        print(f"| {ratio:g} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
