"""Per-stage fixed cost: a whole ``lmablate <stage>`` process on trivial work, this code vs a
reference checkout.

    git archive b3e8291 | (mkdir -p /tmp/startup-ref && tar -x -C /tmp/startup-ref)
    python benchmarks/bench_stage_startup.py --reference /tmp/startup-ref [--repeats 5]
                                             [--stages tune,train,evaluate]
    python benchmarks/bench_stage_startup.py --smoke   # this checkout against itself, seconds

DVC runs every stage as a new ``lmablate`` process, which imports torch, MLflow (and, in the
older code, ``torch._dynamo`` at the first optimizer step) and opens the MLflow store before it
does any work. This benchmark measures that cost the way DVC pays it: each arm (``reference``:
``--reference``'s ``src``; ``current``: this checkout's ``src``, through ``PYTHONPATH``) gets a
tiny project of its own (its own code version's params.yaml with every size cut down,
:func:`tiny_params`: 1 seed, a d_model 16 one-layer model, a few training steps and tuning
trials; tracking on with the default SQLite MLflow store ``sqlite:///mlflow.db``;
``runtime.workers: 1``: trials and seeds one after another), and its ``tune``, ``train`` and
``evaluate`` commands are timed from process start to exit as ``subprocess.run`` sees them.
Before each repetition the Optuna study is deleted and the checkpoints removed, so every run
does its (trivial) work again; the MLflow database grows as in a real study. One untimed
warm-up per arm creates the MLflow and Optuna databases (their one-time migrations are not a
per-stage cost). Arms and stages run interleaved (ref tune, cur tune, ref train, ...), so that
other load on the machine affects both alike.

Breakdown, per arm and stage, from extra runs: ``python -X importtime`` (imports of torch,
torch._dynamo, MLflow, pandas, MLflow's SQLite store, Optuna, GitPython; "all imports" is the
sum of the top-level import statements; importtime itself adds some overhead), and timers in a
separate process with torch and MLflow already imported: opening the MLflow store and starting one
run (``make_tracker`` + ``tracker.run``), and the first optimizer step of ``train_step`` vs the
second. At the end, the two arms' MLflow records (runs, status, tags, params, metrics, artifacts;
no ids, host or process tags, times or timing metrics) are compared. ``--smoke``: this checkout
as both arms, the tune stage once, without warm-up or import breakdown, the timers of one arm:
checks that the script runs. Nothing is asserted; only the ratios within one run
are comparable.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import yaml

import common
from common import ROOT, fmt_seconds, machine_header, merge
from lmablate.train.device import resolve_device

BIN = Path(sys.executable).parent
# Every arm's project: params.yaml of its code version, cut down so that a stage's work is
# trivial (1 seed, a d_model 16 one-layer model); tracking on with the default SQLite store,
# trials and seeds one at a time.
COMMON = {"study": {"seeds": [0], "variants": ["baseline"], "datasets": ["arithmetic"]},
          "tracking": {"enabled": True, "uri": "sqlite:///mlflow.db"},
          "tune": {"storage": "sqlite:///optuna.db"}, "runtime": {"workers": 1}}
# Code with step counts in its params (before lmablate.train.budget, e.g. b3e8291): 4 training
# steps, 2 Optuna trials of 2 steps, one intra-op thread.
TINY_STEPS = {
    "datasets": {"arithmetic": {"n_train": 2000, "n_test": 16}},
    "model": common.TINY_MODEL,
    "train": {"steps": 4, "eval_interval": 2, "eval_iters": 1, "warmup_steps": 0,
              "batch_size": 4},
    "tune": {"n_trials": 2, "steps": 2, "d_model_choices": [16]},
    "evaluate": {"max_batches": 1, "batch_size": 8, "max_problems": 8},
    "runtime": {"threads": 1},
}


def tiny_params(raw: dict) -> dict:
    """``raw`` (an arm's params.yaml) cut down for this benchmark: :func:`common.tiny_params`
    (FLOPs budgets, tuning rungs) for code that has ``train.budget_flops``, else
    :data:`TINY_STEPS`; then :data:`COMMON`."""
    if "budget_flops" in raw["train"]:
        return merge(common.tiny_params(raw), COMMON)
    return merge(merge(raw, TINY_STEPS), COMMON)


DATASET, VARIANT = "arithmetic", "baseline"
COMMANDS = {
    "tune": ["tune", DATASET, VARIANT, "--tokens", "tokens", "--best", "runs/best.json",
             "--trials", "runs/trials.csv"],
    "train": ["train", DATASET, VARIANT, "--tokens", "tokens", "--best", "runs/best.json",
              "--checkpoints", "runs/checkpoints", "--history", "runs/history.csv",
              "--grad-stats", "runs/grad_stats.csv"],
    "evaluate": ["evaluate", DATASET, VARIANT, "--tokens", "tokens", "--raw", "raw",
                 "--checkpoints", "runs/checkpoints", "--metrics", "runs/metrics.json",
                 "--examples", "runs/examples.json"],
}
# Import groups of the breakdown: the first (outermost) import of each, cumulative.
IMPORT_GROUPS = ("torch", "torch._dynamo", "mlflow", "pandas",
                 "mlflow.store.tracking.sqlalchemy_store", "optuna", "git")


class Arm:
    """One code version: its ``src`` and a tiny project folder of its own."""

    def __init__(self, name: str, src: Path, workdir: Path):
        self.name, self.src, self.project = name, src, workdir / name
        self.project.mkdir(parents=True)
        raw = yaml.safe_load((src.parent / "params.yaml").read_text())
        (self.project / "params.yaml").write_text(yaml.safe_dump(tiny_params(raw)))

    def env(self) -> dict[str, str]:
        env = {**os.environ, "PYTHONPATH": str(self.src),
               "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
        for name in ("MLFLOW_TRACKING_URI", "LMABLATE_OPTUNA_STORAGE", "TQDM_DISABLE"):
            env.pop(name, None)  # as DVC runs the stages: stores from params.yaml, bars on
        return env

    def python(self, args: list[str], check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, *args], cwd=self.project, env=self.env(),
                              capture_output=True, text=True)
        if check and done.returncode != 0:
            raise SystemExit(f"{self.name}: {' '.join(args)} failed:\n{done.stderr[-3000:]}")
        return done

    def lmablate(self, args: list[str], flags: tuple[str, ...] = ()) -> tuple[float, str]:
        """Run ``lmablate <args>`` (the console script's code path: ``lmablate.cli.main``) and
        return its wall time from process start to exit, and its stderr."""
        t0 = time.perf_counter()
        done = self.python([*flags, "-c", "import sys; from lmablate.cli import main; "
                            "sys.exit(main())", *args])
        return time.perf_counter() - t0, done.stderr

    def prepare(self, stage: str) -> None:
        """Undo what ``stage`` did last time, so that it does its work again."""
        if stage == "tune" and (self.project / "runs/best.json").exists():
            import optuna

            name = json.loads((self.project / "runs/best.json").read_text())["study_name"]
            optuna.delete_study(study_name=name, storage=f"sqlite:///{self.project}/optuna.db")
        if stage == "train":
            shutil.rmtree(self.project / "runs/checkpoints", ignore_errors=True)


def import_breakdown(stderr: str) -> dict[str, float]:
    """Seconds per :data:`IMPORT_GROUPS` entry and ``all imports`` from ``-X importtime``."""
    rows = []
    for line in stderr.splitlines():
        # search, not match: a progress bar's \r-line may precede the entry on its line
        m = re.search(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
        if m:
            rows.append((int(m[2]) / 1e6, len(m[3]) // 2, m[4]))
    out = {"all imports": sum(cum for cum, depth, _ in rows if depth == 0)}
    for group in IMPORT_GROUPS:
        out[group] = next((cum for cum, _, name in rows if name == group), 0.0)
    return out


TIMERS = textwrap.dedent("""
    import json, sys, time
    import torch, mlflow
    torch.set_num_threads(1)  # as runtime.threads: 1
    try:  # the package laid out by pipeline step
        from lmablate.tracking import trackers as tracking
        from lmablate.train import training
        from lmablate.config.params import load
        from lmablate.model.gpt import GPT
        from lmablate.data.token_data import TokenData, get_batch
        from lmablate.model.variants import resolve_model_config
    except ImportError:  # older code: every module at the top of the package
        from lmablate import tracking, training
        try:
            from lmablate.params import load
        except ImportError:  # older still: the loader was lmablate.config.load
            from lmablate.config import load
        from lmablate.model import GPT
        from lmablate.token_data import TokenData, get_batch
        from lmablate.variants import resolve_model_config
    cfg = load("params.yaml")
    out = {}
    t = time.perf_counter()
    tracker = tracking.make_tracker(cfg.tracking)
    with tracker.run("bench-store-open", {"stage": "bench"}):
        pass
    out["store open + one run"] = time.perf_counter() - t
    data = TokenData.load("tokens")
    mcfg = resolve_model_config(cfg, "baseline", data.vocab_size, cfg.model.d_model)
    torch.manual_seed(0)
    model = GPT(mcfg)
    dev = torch.device("cpu")
    g = torch.Generator().manual_seed(0)
    t = time.perf_counter()
    opt = training.make_optimizer(model, cfg.train, 1e-3, dev)
    sched = training.make_scheduler(opt, cfg.train, 10)
    out["make optimizer"] = time.perf_counter() - t
    for k in ("first", "second"):
        x, y = get_batch(data.train, cfg.train.batch_size, mcfg.context_length, g, dev)
        t = time.perf_counter()
        training.train_step(model, opt, sched, x, y, grad_clip=1.0, device=dev)
        out[k + " optimizer step"] = time.perf_counter() - t
    out["torch._dynamo imported"] = float("torch._dynamo" in sys.modules)
    print(json.dumps(out))
""")


# Differ between any two runs of the same work: times, and what names a run's identity.
VOLATILE_METRICS = ("train_seconds", "tokens_per_second")
VOLATILE_TAGS = ("lmablate.pid", "lmablate.pid_start", "lmablate.host")


def mlflow_records(project: Path) -> list[dict]:
    """The project's MLflow runs in start order, without ids and times: name, status, tags
    (a parent as its run name), params, metrics (key, step and, except timings, value) and
    artifact files."""
    import sqlite3

    with sqlite3.connect(project / "mlflow.db") as db:
        runs = db.execute("select run_uuid, name, status, artifact_uri from runs "
                          "order by start_time, run_uuid").fetchall()
        names = {r[0]: r[1] for r in runs}
        out = []
        for run_id, name, status, uri in runs:
            tags = {k: v for k, v in db.execute("select key, value from tags where run_uuid=?",
                                                (run_id,)) if k not in VOLATILE_TAGS}
            if "mlflow.parentRunId" in tags:
                tags["mlflow.parentRunId"] = names.get(tags["mlflow.parentRunId"], "?")
            params = dict(db.execute("select key, value from params where run_uuid=?", (run_id,)))
            metrics = sorted((k, s, None if k in VOLATILE_METRICS else v) for k, v, s in db.execute(
                "select key, value, step from metrics where run_uuid=?", (run_id,)))
            root = Path(uri.removeprefix("file://")) if uri else None
            artifacts = sorted(str(f.relative_to(root)) for f in root.rglob("*")
                               if f.is_file()) if root and root.is_dir() else []
            out.append({"name": name, "status": status, "tags": tags, "params": params,
                        "metrics": metrics, "artifacts": artifacts})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reference", type=Path,
                    help="a checkout of the old code (its src/ is used), e.g. git archive b3e8291 "
                         "(required unless --smoke)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--stages", default="tune,train,evaluate")
    ap.add_argument("--smoke", action="store_true",
                    help="this checkout against itself, the tune stage once, no warm-up and no "
                         "import breakdown: checks that the script runs")
    args = ap.parse_args()
    if args.smoke:
        args.reference, args.stages, args.repeats = ROOT, "tune", 1
    elif args.reference is None:
        ap.error("--reference is required (or --smoke)")
    ref_src = args.reference / "src" if (args.reference / "src").is_dir() else args.reference
    stages = args.stages.split(",")
    print(machine_header("stage start-up: one lmablate process per stage, reference vs current",
                         resolve_device("auto")))
    print(f"reference: {ref_src}\ncurrent  : {ROOT / 'src'}")
    print(f"project  : tiny (1 seed, d_model 16, 1 layer; train {common.TINY_TRAIN_STEPS} steps, "
          "tune rungs 2 x 0.5 then 1 x 1 of that budget; the reference with step counts: train 4 "
          "steps, tune 2 trials x 2 steps), runtime.workers 1, tracking on, MLflow store "
          f"sqlite:///mlflow.db, {args.repeats} repeats, interleaved; median [min..max]"
          + ("; smoke: this checkout against itself, no warm-up, no import breakdown"
             if args.smoke else ""))

    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        arms = [Arm("reference", ref_src, Path(tmp)), Arm("current", ROOT / "src", Path(tmp))]
        for arm in arms:
            where = arm.python(["-c", "import lmablate; print(lmablate.__file__)"]).stdout.strip()
            if not Path(where).resolve().is_relative_to(arm.src.resolve()):
                raise SystemExit(f"{arm.name}: lmablate imports from {where}, not {arm.src}")
            if args.smoke:  # the same data, made in this process (seconds saved)
                data = common.arithmetic_data(common.load_tiny_config(), arm.project / "data")
                shutil.move(data / "raw", arm.project / "raw")
                shutil.move(data / "tokens", arm.project / "tokens")
            else:
                arm.lmablate(["generate", DATASET, "--out", "raw"])
                arm.lmablate(["tokenize", DATASET, "--raw", "raw", "--out", "tokens"])
            for stage in [] if args.smoke else stages:  # warm-up: creates the databases
                arm.prepare(stage)
                arm.lmablate(COMMANDS[stage])
        interp = []
        for _ in range(0 if args.smoke else args.repeats):
            t0 = time.perf_counter()
            arms[0].python(["-c", "pass"])
            interp.append(time.perf_counter() - t0)

        times = {(a.name, s): [] for a in arms for s in stages}
        for _ in range(args.repeats):
            for stage in stages:
                for arm in arms:
                    arm.prepare(stage)
                    times[arm.name, stage].append(arm.lmablate(COMMANDS[stage])[0])

        imports, timers = {}, {}
        for stage in [] if args.smoke else stages:
            for arm in arms:
                arm.prepare(stage)
                imports[arm.name, stage] = import_breakdown(
                    arm.lmablate(COMMANDS[stage], ("-X", "importtime"))[1])
        records = {arm.name: mlflow_records(arm.project) for arm in arms}
        for arm in arms[1:] if args.smoke else arms:  # smoke: the current code's only
            done = arm.python(["-c", TIMERS], check=False)
            timers[arm.name] = (json.loads(done.stdout.strip().splitlines()[-1])
                                if done.returncode == 0 else
                                {"failed": done.stderr.strip().splitlines()[-1]})

    if interp:
        print(f"\ninterpreter start-up (python -c pass): {fmt_seconds(interp)}")
    print("\nwall time per stage process (start to exit)")
    for stage in stages:
        ref, cur = times["reference", stage], times["current", stage]
        print(f"   {stage:9s} reference {fmt_seconds(ref):22s} current {fmt_seconds(cur):22s} "
              f"-> ratio current/reference = {min(cur) / min(ref):.2f}x best, "
              f"{statistics.median(cur) / statistics.median(ref):.2f}x median; saved "
              f"{statistics.median(ref) - statistics.median(cur):.2f} s")

    if imports:
        print("\nimports (python -X importtime, one run each; cumulative s at the first import; "
              "nested groups are inside their parents)")
    for stage in [] if args.smoke else stages:
        for arm in arms:
            b = imports[arm.name, stage]
            parts = "  ".join(f"{k} {v:.2f}" for k, v in b.items() if k != "all imports")
            print(f"   {stage:9s} {arm.name:9s} all imports {b['all imports']:.2f} | {parts}")
    if timers:
        print("\ntimers (torch and mlflow already imported; one run each)")
    for arm in [a for a in arms if a.name in timers]:
        t = timers[arm.name]
        print(f"   {arm.name:9s} " + "  ".join(
            f"{k}: {v}" if isinstance(v, str) else f"{k}: {bool(v)}" if "imported" in k
            else f"{k} {v:.3f}" for k, v in t.items()))
    ref, cur = records["reference"], records["current"]
    same = ref == cur
    print(f"\nMLflow records of the stage runs above (runs, status, tags, params, metrics "
          f"except {', '.join(VOLATILE_METRICS)}, artifacts): {len(ref)} runs reference, "
          f"{len(cur)} current -> {'identical' if same else 'DIFFERENT'}")
    if not same:
        for i, (a, b) in enumerate(zip(ref, cur)):
            if a != b:
                print(f"   first difference, run {i}: reference {a}\n   current {b}")
                break
    print(f"\n(benchmark wall time {time.perf_counter() - t_start:.0f} s)")


if __name__ == "__main__":
    main()
