r"""Optuna pruning: training steps spent in tuning with MedianPruner vs no pruning (NopPruner).

    python benchmarks/bench_pruning.py [--settings 4x50,4x10] [--sampler-seeds 0,1,2]
    python benchmarks/bench_pruning.py --settings 4x10,4x10:p25,4x10:hyperband
    python benchmarks/bench_pruning.py --settings 8x10:p25,8x10:p33,8x10s1,12x10s1:p33 \
        --sampler-seeds 0
    python benchmarks/bench_pruning.py --parallel      # the pipeline's 2-process tuning as well

Runs ``lmablate.tune.run`` (the pipeline's own tune stage) on the default profile (params.yaml:
model size, tune.steps, d_model_choices, lr range, MedianPruner(n_startup_trials = n_trials // 4,
n_warmup_steps=1)) for baseline and rope on arithmetic (generated) and shakespeare (the
pipeline's token files, when present), with temp-file SQLite Optuna storage and tracking off.

Each *setting* ``NxE[sK][:pruner]`` is ``tune.n_trials=N`` with validation loss reported to
Optuna every ``train.eval_interval=E`` steps (``4x50`` is params.yaml). ``sK`` sets the pruner's
``n_startup_trials=K`` (the pipeline uses max(1, N // 4)); ``:hyperband`` is the config's
``tune.pruner: hyperband``; ``:pNN`` is ``optuna.pruners.PercentilePruner(NN)``. ``sK`` and
``pNN`` swap ``lmablate.tune.make_pruner`` in this process only: explorations of possible
defaults, not changes to src/. Both arms of a setting use the same TPE sampler seed, so (up to 10
trials, TPE's random start-up) they try the same (lr, d_model) sequence and differ only in which
trials are stopped early. Trials run one after another (``train.workers: 1``), which makes runs
deterministic; ``--parallel`` also runs the first setting with the pipeline's
``train.workers: 0`` (one process per core), where trials that start together cannot prune each
other.

Steps spent = sum over the study's finished trials of the last step it reported (the step it was
pruned at, or tune.steps). Seed noise = std of the final val loss of the no-pruning best
(lr, d_model) retrained on the study's seeds (params.yaml study.seeds).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import common  # first: it disables tqdm before torch imports it

import optuna

from lmablate import tune
from lmablate.config import StudyConfig
from lmablate.tracking import NullTracker
from lmablate.train import TokenData, resolve_device, resolve_model_config, train_model

VARIANTS = ("baseline", "rope")


def setting_cfg(cfg: StudyConfig, n_trials: int, eval_interval: int, pruner: str,
                sampler_seed: int, storage: str, workers: int = 1) -> StudyConfig:
    return dataclasses.replace(
        cfg,
        tune=dataclasses.replace(cfg.tune, n_trials=n_trials, pruner=pruner,
                                 sampler_seed=sampler_seed, storage=storage),
        train=dataclasses.replace(cfg.train, eval_interval=eval_interval, workers=workers,
                                  threads=0))


def run_study(cfg: StudyConfig, dataset: str, variant: str, tokens: Path, out: Path) -> dict:
    """One tune stage; returns best val loss, steps spent, pruned count, params, wall time."""
    out.mkdir(parents=True)
    t0 = time.perf_counter()
    result = tune.run(cfg, dataset, variant, tokens, out / "best.json", out / "trials.csv",
                      NullTracker())
    wall = time.perf_counter() - t0
    study = optuna.load_study(study_name=result["study_name"], storage=cfg.tune.storage_url)
    finished = [t for t in study.trials if t.state in tune.FINISHED]
    return {"best": result["val_loss"], "lr": result["lr"], "d_model": result["d_model"],
            "steps": sum(max(t.intermediate_values) for t in finished if t.intermediate_values),
            "pruned": sum(t.state == optuna.trial.TrialState.PRUNED for t in finished),
            "trials": len(finished), "wall": wall,
            "stops": [max(t.intermediate_values) if t.intermediate_values else 0
                      for t in finished]}


def seed_noise(cfg: StudyConfig, tokens: Path, variant: str, lr: float, d_model: int) -> float:
    """Std over the study's seeds of the val loss of (lr, d_model) after tune.steps steps."""
    data = TokenData.load(tokens)
    device = resolve_device(cfg.train.device)
    mcfg = resolve_model_config(cfg, variant, data.vocab_size, d_model)
    losses = [train_model(mcfg, cfg.train, data, seed=s, lr=lr, steps=cfg.tune.steps,
                          device=device).val_loss for s in cfg.seeds]
    return statistics.stdev(losses)


@dataclasses.dataclass(frozen=True)
class Setting:
    """One tuning setting of the pruning arm; ``NxE[sK][:pruner]`` on the command line."""

    n_trials: int
    eval_interval: int  # steps between the val-loss reports Optuna prunes on
    startup: int | None = None  # MedianPruner/PercentilePruner n_startup_trials; None: pipeline's
    pruner: str = "median"  # median, hyperband (config values) or pNN (PercentilePruner(NN))

    @classmethod
    def parse(cls, text: str) -> "Setting":
        text, _, pruner = text.partition(":")
        n, rest = text.split("x")
        e, _, k = rest.partition("s")
        return cls(int(n), int(e), int(k) if k else None, pruner or "median")

    def __str__(self) -> str:
        k = f"s{self.startup}" if self.startup is not None else ""
        p = f":{self.pruner}" if self.pruner != "median" else ""
        return f"{self.n_trials}x{self.eval_interval}{k}{p}"

    @property
    def n_startup(self) -> int:
        return self.startup if self.startup is not None else max(1, self.n_trials // 4)

    def bound(self, steps: int) -> float:
        """The most a median/percentile pruner can save: every trial after the start-up ones
        pruned at its first report."""
        return ((self.n_trials - self.n_startup) / self.n_trials
                * (1 - min(self.eval_interval, steps) / steps))

    @contextlib.contextmanager
    def pruner_factory(self):
        """Explore a pruner the config cannot express (n_startup_trials, PercentilePruner)
        without editing src/: swaps ``lmablate.tune.make_pruner`` in this process only."""
        if self.startup is None and not self.pruner.startswith("p"):
            yield
            return
        original = tune.make_pruner
        k = self.n_startup

        def make(name: str, n_startup_trials: int) -> optuna.pruners.BasePruner:
            if name == "none":
                return original(name, n_startup_trials)
            if self.pruner.startswith("p"):
                return optuna.pruners.PercentilePruner(float(self.pruner[1:]), n_startup_trials=k,
                                                       n_warmup_steps=1)
            return original(name, k)

        tune.make_pruner = make
        try:
            yield
        finally:
            tune.make_pruner = original

    @property
    def config_pruner(self) -> str:
        return "hyperband" if self.pruner == "hyperband" else "median"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--settings", default="4x50,4x10",
                    help="comma-separated NxE[sK][:pruner] (n_trials x report interval, "
                         "n_startup_trials, median|hyperband|pNN); the first is shown per study")
    ap.add_argument("--sampler-seeds", default="0,1,2")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--parallel", action="store_true",
                    help="also run the first setting with train.workers: 0 (sampler seed 0)")
    args = ap.parse_args()
    os.environ.pop("LMABLATE_OPTUNA_STORAGE", None)  # the storage must be this run's temp file
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    device = common.auto_device()
    print(common.machine_header("Optuna pruning: MedianPruner vs NopPruner", device))
    settings = [Setting.parse(s) for s in args.settings.split(",")]
    seeds = [int(s) for s in args.sampler_seeds.split(",")]
    base = common.load_default_config()
    t = base.tune
    print(f"profile : params.yaml tune: n_trials={t.n_trials} steps={t.steps} "
          f"d_model_choices={list(t.d_model_choices)} lr=[{t.lr_low:g}, {t.lr_high:g}] "
          f"pruner={t.pruner}; train.eval_interval={base.train.eval_interval} "
          f"eval_iters={base.train.eval_iters} batch={base.train.batch_size}; model "
          f"{base.model.n_layers} layers, {base.model.n_heads} heads, context "
          f"{base.model.context_length}")
    print(f"runs    : variants {args.variants}; TPE sampler seeds {seeds}; serial trials")

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tokens = common.study_tokens(base, tmp)
        combos = [(d, v) for d in tokens for v in args.variants.split(",")]
        print(f"data    : {', '.join(tokens)} (arithmetic generated from params.yaml; "
              "shakespeare " + ("copied from data/tokens)" if "shakespeare" in tokens
                                else "absent: skipped)"))
        counter = iter(range(10**6))

        def study(n, e, pruner, seed, d, v, workers=1, setting=None):
            c = setting_cfg(base, n, e, pruner, seed, f"sqlite:///{tmp}/optuna-{next(counter)}.db",
                            workers)
            with setting.pruner_factory() if setting else contextlib.nullcontext():
                r = run_study(c, d, v, tokens[d], tmp / f"out-{next(counter)}")
            print(f"  .. {setting or f'{n}x{e}'} {pruner:<6} seed {seed} {d}/{v} "
                  f"workers={workers}: {r['steps']} steps, best {r['best']:.4f}, "
                  f"{r['wall']:.1f} s", file=sys.stderr)
            return r

        t_start = time.perf_counter()
        # the no-pruning arm does not depend on the report interval: one run per n_trials
        nop = {(n, d, v, s): study(n, base.train.eval_interval, "none", s, d, v)
               for n in sorted({st.n_trials for st in settings}) for d, v in combos for s in seeds}
        med = {(st, d, v, s): study(st.n_trials, st.eval_interval, st.config_pruner, s, d, v,
                                    setting=st)
               for st in settings for d, v in combos for s in seeds}
        ref = {(d, v): nop[(settings[0].n_trials, d, v, seeds[0])] for d, v in combos}
        noise = {(d, v): seed_noise(base, tokens[d], v, ref[(d, v)]["lr"], ref[(d, v)]["d_model"])
                 for d, v in combos}
        par = {}
        if args.parallel:
            st = settings[0]
            for d, v in combos:
                par[(d, v)] = {p: study(st.n_trials, st.eval_interval, p, seeds[0], d, v, workers=0)
                               for p in ("none", st.config_pruner)}
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
        default = st == Setting(t.n_trials, base.train.eval_interval, None, t.pruner)
        bound = f"{st.bound(t.steps):.0%}" if st.pruner != "hyperband" else "-"
        print(f"   {str(st):<14}{st.n_startup if st.pruner != 'hyperband' else '-':>8}"
              f"{s_none:>11}{s_pr:>13}{1 - s_pr / s_none:>7.0%}{bound:>7}"
              f"{f'{pruned}/{trials}':>8}{statistics.mean(deltas):>+11.4f}{max(deltas):>+10.4f}"
              f"{f'{worse}/{len(keys)}':>12}{wall:>11.2f}{'  <- params.yaml' if default else ''}")
    print("   setting NxE[sK][:pruner] = tune.n_trials N, val loss reported every E steps, "
          "n_startup_trials K (default N // 4),\n   pruner median (default), hyperband or pNN = "
          "PercentilePruner(NN). saved = 1 - steps pruned / steps none (target >= 40%); bound = "
          "the most\n   a median/percentile pruner can save here; Δbest = best val loss pruned - "
          "none (nats); wall ratio = tune wall time pruned / none, evals included.")

    if par:
        swapped = s0.startup is not None or s0.pruner.startswith("p")
        print(f"\nparallel: setting {s0} with train.workers: 0 "
              f"({os.cpu_count()} processes on this machine), sampler seed {seeds[0]}"
              + (f" (pruner {s0.config_pruner} with the pipeline's start-up: the sK/pNN swap "
                 "does not reach worker processes)" if swapped else "") + ":")
        pr = s0.config_pruner
        tot = {p: sum(r[p]["steps"] for r in par.values()) for p in ("none", pr)}
        for (d, v), r in par.items():
            print(f"   {d + '/' + v:<22} steps none {r['none']['steps']:>5}  {pr} "
                  f"{r[pr]['steps']:>5}  stops {r[pr]['stops']}  best none "
                  f"{r['none']['best']:.4f} {pr} {r[pr]['best']:.4f}")
        print(f"   total: none {tot['none']}, {pr} {tot[pr]} -> saved "
              f"{1 - tot[pr] / tot['none']:.0%}")
    print(f"\n(benchmark wall time {elapsed:.0f} s)")


if __name__ == "__main__":
    main()
