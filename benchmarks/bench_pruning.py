r"""Optuna pruning: training steps spent in tuning with the pipeline's pruner vs none (NopPruner).

    python benchmarks/bench_pruning.py                       # params.yaml's setting, serial trials
    python benchmarks/bench_pruning.py --workers 0           # the pipeline's concurrent trials
    python benchmarks/bench_pruning.py --settings 4x50,4x10,4x10:p25,4x10:hyperband,8x10:p25

Runs ``lmablate.stages.tune.run`` (the pipeline's own tune stage) on the default profile
(params.yaml: model size, tune.steps, d_model_choices, lr range, n_startup_trials =
max(1, n_trials // 4), n_warmup_steps = train.warmup_steps) for baseline and rope on arithmetic
(generated) and shakespeare (the pipeline's token files, when present), with temp-file SQLite
Optuna storage and tracking off.

Each *setting* ``NxE[:pruner]`` is ``tune.n_trials=N`` with the validation loss reported to
Optuna every ``tune.report_interval=E`` steps and ``tune.pruner`` median (MedianPruner),
hyperband (HyperbandPruner) or ``pNN`` (``tune.pruner: percentile`` with ``tune.percentile: NN``,
Optuna's PercentilePruner). The first setting defaults to params.yaml's. Both arms of a setting
use the same TPE sampler seed, so (up to 10 trials, TPE's random start-up) they try the same
(lr, d_model) sequence and differ only in which trials are stopped early.

``--workers N`` sets ``runtime.workers: N`` for every study. ``--workers 1`` (default) runs
trials one after another, which makes runs deterministic; ``--workers 0`` is the pipeline's
default (one trial per core at once, Optuna's ``n_jobs`` threads), where trials that start
together cannot prune each other and results vary a little from run to run.

Steps spent = sum over the study's finished trials of the last step it reported (the step it was
pruned at, or tune.steps). Seed noise = std of the final val loss of the no-pruning best
(lr, d_model) retrained on the study's seeds (params.yaml study.seeds).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import common  # first: it disables tqdm before torch imports it

import optuna

from lmablate.config import StudyConfig
from lmablate.device import resolve_device
from lmablate.parallel import worker_count
from lmablate.stages import tune
from lmablate.tokens import TokenData
from lmablate.tracking import NullTracker
from lmablate.training import train_model
from lmablate.tuning import FINISHED, trial_train_config
from lmablate.variants import resolve_model_config

VARIANTS = ("baseline", "rope")


def setting_cfg(cfg: StudyConfig, setting: "Setting", pruner: str, sampler_seed: int,
                storage: str, workers: int) -> StudyConfig:
    """``cfg`` with the setting's tune values; ``pruner`` ``none`` gives the no-pruning arm."""
    return dataclasses.replace(
        cfg,
        tune=dataclasses.replace(cfg.tune, n_trials=setting.n_trials,
                                 report_interval=setting.report_interval,
                                 pruner=pruner if pruner == "none" else setting.config_pruner,
                                 percentile=setting.percentile or cfg.tune.percentile,
                                 sampler_seed=sampler_seed, storage=storage),
        runtime=dataclasses.replace(cfg.runtime, workers=workers, threads=0))


def run_study(cfg: StudyConfig, dataset: str, variant: str, tokens: Path, out: Path) -> dict:
    """One tune stage; returns best val loss, steps spent, pruned count, params, wall time."""
    out.mkdir(parents=True)
    t0 = time.perf_counter()
    result = tune.run(cfg, dataset, variant, tokens, out / "best.json", out / "trials.csv",
                      NullTracker())
    wall = time.perf_counter() - t0
    study = optuna.load_study(study_name=result["study_name"], storage=cfg.tune.storage_url)
    finished = [t for t in study.trials if t.state in FINISHED]
    return {"best": result["val_loss"], "lr": result["lr"], "d_model": result["d_model"],
            "steps": sum(max(t.intermediate_values) for t in finished if t.intermediate_values),
            "pruned": sum(t.state == optuna.trial.TrialState.PRUNED for t in finished),
            "trials": len(finished), "wall": wall,
            "stops": [max(t.intermediate_values) if t.intermediate_values else 0
                      for t in finished]}


def seed_noise(cfg: StudyConfig, tokens: Path, variant: str, lr: float, d_model: int) -> float:
    """Std over the study's seeds of the val loss of (lr, d_model) after tune.steps steps,
    trained as a trial is (:func:`lmablate.tuning.trial_train_config`)."""
    data = TokenData.load(tokens)
    device = resolve_device(cfg.runtime.device)
    mcfg = resolve_model_config(cfg, variant, data.vocab_size, d_model)
    losses = [train_model(mcfg, trial_train_config(cfg), data, seed=s, lr=lr,
                          steps=cfg.tune.steps, device=device).val_loss for s in cfg.seeds]
    return statistics.stdev(losses)


@dataclasses.dataclass(frozen=True)
class Setting:
    """One tuning setting of the pruning arm; ``NxE[:pruner]`` on the command line."""

    n_trials: int
    report_interval: int  # steps between the val-loss reports Optuna prunes on
    pruner: str = "median"  # median, hyperband or pNN (percentile NN)

    @classmethod
    def parse(cls, text: str) -> "Setting":
        text, _, pruner = text.partition(":")
        n, e = text.split("x")
        return cls(int(n), int(e), pruner or "median")

    @classmethod
    def of(cls, cfg: StudyConfig) -> "Setting":
        t = cfg.tune
        pruner = f"p{t.percentile:g}" if t.pruner == "percentile" else t.pruner
        return cls(t.n_trials, t.report_interval, pruner)

    def __str__(self) -> str:
        return f"{self.n_trials}x{self.report_interval}:{self.pruner}"

    @property
    def config_pruner(self) -> str:
        return "percentile" if self.pruner.startswith("p") else self.pruner

    @property
    def percentile(self) -> float | None:
        return float(self.pruner[1:]) if self.pruner.startswith("p") else None

    @property
    def n_startup(self) -> int:
        return max(1, self.n_trials // 4)  # lmablate.tuning.load_study

    def bound(self, steps: int, warmup: int) -> float:
        """The most a median/percentile pruner can save: every trial after the start-up ones
        pruned at its first report after the warm-up."""
        first = (warmup // self.report_interval + 1) * self.report_interval
        return ((self.n_trials - self.n_startup) / self.n_trials * (1 - min(first, steps) / steps))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--settings", default=None,
                    help="comma-separated NxE[:pruner] (n_trials x report interval, "
                         "median|hyperband|pNN); the first is shown per study (default: "
                         "params.yaml's)")
    ap.add_argument("--sampler-seeds", default="0,1,2")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--workers", type=int, default=1,
                    help="runtime.workers for every study: 1 = serial trials, 0 = the "
                         "pipeline's")
    args = ap.parse_args()
    os.environ.pop("LMABLATE_OPTUNA_STORAGE", None)  # the storage must be this run's temp file
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    device = common.auto_device()
    print(common.machine_header("Optuna pruning: the pipeline's pruner vs NopPruner", device))
    base = common.load_default_config()
    settings = ([Setting.parse(s) for s in args.settings.split(",")] if args.settings
                else [Setting.of(base)])
    seeds = [int(s) for s in args.sampler_seeds.split(",")]
    t = base.tune
    print(f"profile : params.yaml tune: n_trials={t.n_trials} steps={t.steps} "
          f"d_model_choices={list(t.d_model_choices)} lr=[{t.lr_low:g}, {t.lr_high:g}] "
          f"pruner={t.pruner} percentile={t.percentile:g} report_interval={t.report_interval}; "
          f"eval_iters={base.train.eval_iters} batch={base.train.batch_size}; model "
          f"{base.model.n_layers} layers, {base.model.n_heads} heads, context "
          f"{base.model.context_length}")
    w = worker_count(dataclasses.replace(base.runtime, workers=args.workers), t.n_trials, device)
    print(f"runs    : variants {args.variants}; TPE sampler seeds {seeds}; runtime.workers="
          f"{args.workers}: " + ("serial trials" if w == 1 else f"{w} trials at a time (threads)"))

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tokens = common.study_tokens(base, tmp)
        combos = [(d, v) for d in tokens for v in args.variants.split(",")]
        print(f"data    : {', '.join(tokens)} (arithmetic generated from params.yaml; "
              "shakespeare " + ("copied from data/tokens)" if "shakespeare" in tokens
                                else "absent: skipped)"))
        counter = iter(range(10**6))

        def study(st, pruner, seed, d, v):
            c = setting_cfg(base, st, pruner, seed, f"sqlite:///{tmp}/optuna-{next(counter)}.db",
                            args.workers)
            r = run_study(c, d, v, tokens[d], tmp / f"out-{next(counter)}")
            print(f"  .. {st} {pruner:<6} seed {seed} {d}/{v}: {r['steps']} steps, "
                  f"best {r['best']:.4f}, {r['wall']:.1f} s", file=sys.stderr)
            return r

        t_start = time.perf_counter()
        # the no-pruning arm depends only on n_trials (the report interval adds evals, not steps)
        nop_of = {st.n_trials: st for st in settings}
        nop = {(n, d, v, s): study(st, "none", s, d, v)
               for n, st in nop_of.items() for d, v in combos for s in seeds}
        med = {(st, d, v, s): study(st, st.pruner, s, d, v)
               for st in settings for d, v in combos for s in seeds}
        ref = {(d, v): nop[(settings[0].n_trials, d, v, seeds[0])] for d, v in combos}
        noise = {(d, v): seed_noise(base, tokens[d], v, ref[(d, v)]["lr"], ref[(d, v)]["d_model"])
                 for d, v in combos}
        elapsed = time.perf_counter() - t_start

    mean_noise = statistics.mean(noise.values())
    s0 = settings[0]
    print(f"\nper study, setting {s0}, sampler seed {seeds[0]}:")
    print(f"   {'dataset/variant':<22}{'steps none':>11}{'steps pruned':>13}{'saved':>7}"
          f"{'best none':>10}{'best pruned':>12}{'seed noise':>11}  stops (pruned arm)")
    for d, v in combos:
        a, b = nop[(s0.n_trials, d, v, seeds[0])], med[(s0, d, v, seeds[0])]
        print(f"   {d + '/' + v:<22}{a['steps']:>11}{b['steps']:>13}"
              f"{1 - b['steps'] / a['steps']:>7.0%}{a['best']:>10.4f}{b['best']:>12.4f}"
              f"{noise[(d, v)]:>11.4f}  {b['stops']}")

    print(f"\nsummary over {len(combos)} dataset x variant x {len(seeds)} sampler seeds "
          f"(seed noise: mean std over seeds {list(base.seeds)} = {mean_noise:.4f} nats):")
    print(f"   {'setting':<14}{'startup':>8}{'steps none':>11}{'steps pruned':>13}{'saved':>7}"
          f"{'bound':>7}{'pruned':>8}{'Δbest mean':>11}{'Δbest max':>10}{'worse>noise':>12}"
          f"{'wall ratio':>11}")
    keys = [(d, v, s) for d, v in combos for s in seeds]
    for st in settings:
        a = [nop[(st.n_trials, *key)] for key in keys]
        b = [med[(st, *key)] for key in keys]
        s_none, s_pr = sum(r["steps"] for r in a), sum(r["steps"] for r in b)
        deltas = [y["best"] - x["best"] for x, y in zip(a, b)]
        worse = sum(dl > noise[(d, v)] for dl, (d, v, _) in zip(deltas, keys))
        pruned, trials = sum(r["pruned"] for r in b), sum(r["trials"] for r in b)
        wall = sum(r["wall"] for r in b) / sum(r["wall"] for r in a)
        default = st == Setting.of(base)
        bound = (f"{st.bound(t.steps, base.train.warmup_steps):.0%}"
                 if st.pruner != "hyperband" else "-")
        print(f"   {str(st):<14}{st.n_startup if st.pruner != 'hyperband' else '-':>8}"
              f"{s_none:>11}{s_pr:>13}{1 - s_pr / s_none:>7.0%}{bound:>7}"
              f"{f'{pruned}/{trials}':>8}{statistics.mean(deltas):>+11.4f}{max(deltas):>+10.4f}"
              f"{f'{worse}/{len(keys)}':>12}{wall:>11.2f}{'  <- params.yaml' if default else ''}")
    print("   setting NxE:pruner = tune.n_trials N, val loss reported every E steps "
          "(tune.report_interval), pruner median, hyperband\n   or pNN = PercentilePruner(NN), "
          "n_startup_trials max(1, N // 4), no pruning up to step train.warmup_steps.\n"
          "   saved = 1 - steps pruned / steps none (target >= 40%); bound = the most a "
          "median/percentile pruner can save here;\n   Δbest = best val loss pruned - none "
          "(nats); wall ratio = tune wall time pruned / none, evals included.")

    print(f"\n(benchmark wall time {elapsed:.0f} s)")


if __name__ == "__main__":
    main()
