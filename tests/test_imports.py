"""Stage start-up: what a fresh stage process imports, and that skipping torch._dynamo leaves the
optimizer's results bitwise the same.

Every DVC stage is a new process, so each module imported at start-up is paid once per stage
of a study (``dvc stage list``; see benchmarks/bench_stage_startup.py). These run in subprocesses:
the test process itself has long imported everything.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HEAVY = ("optuna", "pandas", "scipy", "seaborn", "matplotlib", "mlflow", "torch._dynamo")


def fresh_python(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a new interpreter of this environment; fail on a non-zero exit."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def imported_after(statement: str) -> set[str]:
    """The :data:`HEAVY` modules that are in ``sys.modules`` after ``statement``."""
    out = fresh_python(f"""
        import json, sys
        {statement}
        print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))
    """).stdout.strip().splitlines()[-1]
    return set(json.loads(out))


@pytest.mark.parametrize("stage, allowed", [
    ("train", set()), ("evaluate", set()), ("tune", {"optuna"}),
    ("generate", set()), ("tokenize", set()),
])
def test_stage_module_imports_only_what_it_uses(stage, allowed):
    # MLflow is imported when a tracker is made (tracking on), pandas by fileio.write_csv,
    # torch._dynamo never; the tune stage needs Optuna from the start.
    assert imported_after(f"import lmablate.cli, lmablate.stages.{stage}") <= allowed


TRAIN_STEPS = """
    import sys, torch
    from lmablate.config.study import ModelConfig, TrainConfig
    from lmablate.model.gpt import GPT
    from lmablate.train.training import make_optimizer, make_scheduler, train_step

    def run(steps=6):
        cfg = TrainConfig(warmup_fraction=0.1, weight_decay=0.1)
        torch.manual_seed(0)
        model = GPT(ModelConfig(vocab_size=11, context_length=8, n_layers=1, n_heads=2,
                                d_model=16))
        dev = torch.device("cpu")
        opt = make_optimizer(model, cfg, 3e-3, dev)
        sched = make_scheduler(opt, cfg, steps)
        g = torch.Generator().manual_seed(1)
        for _ in range(steps):
            x = torch.randint(0, 11, (4, 8), generator=g)
            train_step(model, opt, sched, x, x.roll(-1, 1), grad_clip=1.0, device=dev)
        opt.load_state_dict(opt.state_dict())  # resume's path, wrapped like step
        return ([p.detach().clone() for p in model.parameters()],
                [t.clone() for s in opt.state.values() for t in s.values()])
"""


def test_optimizer_steps_do_not_import_dynamo():
    out = fresh_python(TRAIN_STEPS + """
    run()
    print("torch._dynamo" in sys.modules)
    """).stdout.split()
    assert out[-1] == "False"


def test_optimizer_results_bitwise_equal_to_torchs_own_path():
    # First without torch._dynamo (the direct calls), then with it imported, when torch's
    # wrappers run again; and against a plain torch.optim.AdamW stepped the same way.
    out = fresh_python(TRAIN_STEPS + """
    fast_params, fast_state = run()
    assert "torch._dynamo" not in sys.modules
    import torch._dynamo
    torch_params, torch_state = run()
    same = (all(torch.equal(a, b) for a, b in zip(fast_params, torch_params))
            and all(torch.equal(a, b) for a, b in zip(fast_state, torch_state))
            and len(fast_state) == len(torch_state) > 0)
    import lmablate.train.training as training
    def plain(cls, *args, **kwargs):
        return cls(*args, **kwargs)
    training.without_dynamo = plain
    plain_params, _ = run()
    same_plain = all(torch.equal(a, b) for a, b in zip(fast_params, plain_params))
    print(same, same_plain)
    """).stdout.split()
    assert out[-2:] == ["True", "True"]


def test_stage_command_records_its_mlflow_run_and_exits(project, start_lmablate):
    # A command ends through lmablate.cli.exit_now (no interpreter teardown): its MLflow run
    # must still be ended and committed, its files written, and its status passed on.
    project.write_params(lambda raw: raw["tracking"].update(enabled=True))
    (project.path / "best.json").write_text(json.dumps({"lr": 1e-3, "d_model": 16}))
    proc = start_lmablate(["train", "arithmetic", "baseline", "--tokens", "tokens", "--best",
                           "best.json", "--checkpoints", "ck", "--history", "history.csv",
                           "--grad-stats", "grads.csv"], project.path)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert (project.path / "ck/seed_0/checkpoint.pt").is_file()
    assert (project.path / "history.csv").read_text().count("\n") == 3  # header + 2 evals
    with sqlite3.connect(project.path / "mlflow.db") as db:
        runs = db.execute("select run_uuid, status, artifact_uri from runs").fetchall()
        assert [status for _, status, _ in runs] == ["FINISHED"]
        run_id, _, uri = runs[0]
        tags = dict(db.execute("select key, value from tags where run_uuid=?", (run_id,)))
        params = dict(db.execute("select key, value from params where run_uuid=?", (run_id,)))
        metrics = {k for (k,) in db.execute("select key from metrics where run_uuid=?",
                                            (run_id,))}
    assert {k: tags[k] for k in ("dataset", "variant", "seed", "stage")} == {
        "dataset": "arithmetic", "variant": "baseline", "seed": "0", "stage": "train"}
    assert params["peak_lr"] == "0.001" and params["steps"] == "4" and "lr" not in params
    assert {"train_loss", "val_loss", "lr", "train_seconds", "tokens_per_second"} <= metrics
    with sqlite3.connect(project.path / "mlflow.db") as db:
        steps = {key: [s for (s,) in db.execute(
                     "select step from metrics where run_uuid=? and key=? order by step",
                     (run_id, key))] for key in metrics}
    # curves hold step-indexed values only: no summary point at step 0, none twice
    assert steps["val_loss"] == sorted(set(steps["val_loss"])) and 0 not in steps["val_loss"]
    assert steps["train_seconds"] == steps["tokens_per_second"] == [4]
    from lmablate.tracking.mlflow_store import artifact_dir
    where = artifact_dir(f"sqlite:///{project.path / 'mlflow.db'}", uri)
    assert where == project.path / "mlartifacts" / "lmablate" / run_id / "artifacts"
    assert (where / "checkpoint" / "checkpoint.pt").is_file()

    bad = start_lmablate(["train", "arithmetic", "mamba", "--tokens", "tokens", "--best",
                          "best.json", "--checkpoints", "ck2", "--history", "h2.csv",
                          "--grad-stats", "g2.csv"], project.path)
    _, err = bad.communicate(timeout=300)
    assert bad.returncode == 2 and err.startswith("lmablate: error: ")


def test_package_modules_import_each_other_by_absolute_name():
    """One import style: ``from lmablate.x import y``, never ``from .x import y``, so a module's
    imports read the same wherever it sits and grep finds every user of a module."""
    src = Path(__file__).resolve().parents[1] / "src" / "lmablate"
    relative = [f"{path.relative_to(src)}:{n}: {line.strip()}"
                for path in sorted(src.rglob("*.py"))
                for n, line in enumerate(path.read_text().splitlines(), 1)
                if line.lstrip().startswith("from .")]
    assert relative == []
