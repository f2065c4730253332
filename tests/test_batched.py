"""Seeds trained as one batched model (lmablate.train.batched) follow, seed by seed, the trajectory
each seed takes alone in train_model, to fp32 rounding: losses at every eval, final weights,
optimizer state; with clipping, divergence, interruption and resume states shared both ways."""

import dataclasses
import json

import mlflow
import pandas as pd
import pytest
import torch
from lmablate.data.token_data import TokenData
from lmablate.model.variants import resolve_model_config
from lmablate.stages import train
from lmablate.train import batched
from lmablate.train.batched import clip_grad_norm_per_seed_, train_seeds
from lmablate.train.training import DivergenceError, train_model

from conftest import budgets
from trajectory import LOSS_TOL, WEIGHT_TOL, assert_same_trajectory

STEPS = 12
SMALL = {"train": {"budget_flops": budgets(STEPS), "eval_interval": 4, "eval_iters": 2,
                   "warmup_fraction": 0.1}}
CPU = torch.device("cpu")
LR = 3e-3


@pytest.fixture(scope="module")
def project(tmp_path_factory, make_project):
    tmp = tmp_path_factory.mktemp("batched")
    project = make_project(tmp, SMALL)
    return project.cfg, TokenData.load(tmp / "tokens"), tmp


def model_config(cfg, data, variant):
    return resolve_model_config(cfg, variant, data.vocab_size, 16, data.line_length)


@pytest.mark.parametrize("variant", ["baseline", "llama", "alibi", "gqa", "post_norm",
                                     "sinusoidal", "coupled"])
def test_each_seed_of_a_batched_run_follows_its_run_alone(project, variant):
    cfg, data, _ = project
    mc = model_config(cfg, data, variant)
    seeds = [0, 1]
    together = train_seeds(mc, cfg.train, data, seeds=seeds, lr=LR, steps=STEPS,
                           device=CPU)
    for seed, result in zip(seeds, together):
        alone = train_model(mc, cfg.train, data, seed=seed, lr=LR, steps=STEPS,
                            device=CPU)
        assert_same_trajectory(alone, result)
    # the seeds really differ, so the comparison above is not between copies
    assert together[0].val_loss != together[1].val_loss


def test_tied_weights_stay_tied_and_follow_the_run_alone(project):
    cfg, data, _ = project
    mc = model_config(cfg, data, "baseline").replace(tie_weights=True)
    (result,) = train_seeds(mc, cfg.train, data, seeds=[3], lr=LR, steps=STEPS,
                            device=CPU)
    assert result.model.lm_head.weight is result.model.wte.weight
    assert_same_trajectory(train_model(mc, cfg.train, data, seed=3, lr=LR,
                                       steps=STEPS, device=CPU), result)


@pytest.mark.parametrize("variant", ["baseline", "llama"])
@pytest.mark.parametrize("tie", [False, True])
def test_weight_decay_falls_on_linear_weight_matrices_only_alone_and_batched(variant, tie):
    from lmablate.config.study import ModelConfig, TrainConfig
    from lmablate.model.gpt import GPT
    from lmablate.train.training import make_optimizer
    kw = {"llama": dict(norm="rmsnorm", position="rope", ffn="swiglu")}.get(variant, {})
    cfg = ModelConfig(vocab_size=11, d_model=16, n_layers=2, n_heads=2, context_length=8,
                      tie_weights=tie, **kw)
    model = GPT(cfg)
    expected = {n for n, p in model.named_parameters()
                if n.endswith(".weight") and p.dim() == 2 and not n.startswith(("wte", "position"))
                and not (tie and n == "lm_head.weight")}
    assert any(n.startswith("blocks.") for n in expected)
    assert ("lm_head.weight" in expected) == (not tie)
    tcfg = TrainConfig(weight_decay=0.1)
    opt = make_optimizer(model, tcfg, 1e-3, torch.device("cpu"))
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for g in opt.param_groups if g["weight_decay"] for p in g["params"]}
    assert decayed == expected  # no embedding, position table, bias or gain
    assert "wte.weight" not in decayed and not any("norm" in n for n in decayed)
    # the stacked optimizer groups the same parameters, in the same order
    params, _ = torch.func.stack_module_state([model, GPT(cfg)])
    stacked = batched.make_stacked_optimizer(params, tcfg, 1e-3, torch.device("cpu"),
                                             batched.decayed_parameter_names(model))
    by_id = {id(p): n for n, p in params.items()}
    assert ([[by_id[id(p)] for p in g["params"]] for g in stacked.param_groups]
            == [[names[id(p)] for p in g["params"]] for g in opt.param_groups])


def test_clipping_every_step_still_follows_the_run_alone(project):
    cfg, data, _ = project
    train_cfg = dataclasses.replace(cfg.train, grad_clip=0.05)  # below every gradient norm here
    mc = model_config(cfg, data, "baseline")
    seeds = [0, 1]
    together = train_seeds(mc, train_cfg, data, seeds=seeds, lr=LR, steps=STEPS,
                           device=CPU)
    unclipped = train_seeds(mc, cfg.train, data, seeds=seeds, lr=LR, steps=STEPS,
                            device=CPU)
    assert together[0].val_loss != unclipped[0].val_loss  # clipping did act
    for seed, result in zip(seeds, together):
        assert_same_trajectory(train_model(mc, train_cfg, data, seed=seed, lr=LR,
                                           steps=STEPS, device=CPU), result)


def test_per_seed_clipping_equals_clip_grad_norm_on_each_seed_alone():
    g = torch.Generator().manual_seed(0)
    shapes = [(3, 5, 4), (3, 4), (3, 7)]
    grads = [torch.randn(s, generator=g) for s in shapes]
    grads[0][1] *= 1e-3  # seed 1's norm is below max_norm: left unscaled
    expected = []
    for s in range(3):
        alone = [torch.nn.Parameter(x[s].clone()) for x in grads]
        for p, x in zip(alone, grads):
            p.grad = x[s].clone()
        torch.nn.utils.clip_grad_norm_(alone, 1.0)
        expected.append([p.grad for p in alone])
    before = [x[1].clone() for x in grads]
    norms = clip_grad_norm_per_seed_(grads, max_norm=1.0)
    assert norms.shape == (3,)
    for s in range(3):
        for x, e in zip(grads, expected[s]):
            torch.testing.assert_close(x[s], e, atol=1e-7, rtol=1e-6)
    if norms[1] < 1.0:
        assert all(torch.equal(x[1], b) for x, b in zip(grads, before))


class Crash(Exception):
    pass


class CrashAt:
    """A tracker that raises at ``step``'s metrics: an interruption at an eval step."""

    def __init__(self, step):
        self.step = step

    def log_metrics(self, metrics, step=None):
        if step == self.step:
            raise Crash


class Quiet:
    def log_metrics(self, metrics, step=None):
        pass


def test_a_diverging_seed_is_named_with_its_step(project):
    cfg, data, tmp = project
    mc = model_config(cfg, data, "baseline")
    paths = [tmp / "diverge" / f"seed_{s}.pt" for s in (0, 1)]
    with pytest.raises(Crash):  # seed 1 stops at step 8 with its state of step 4
        train_seeds(mc, cfg.train, data, seeds=[0, 1], lr=LR, steps=STEPS,
                    device=CPU, trackers=[Quiet(), CrashAt(8)], resume_paths=paths,
                    fingerprints=["f", "f"])
    state = torch.load(paths[1], weights_only=False)
    assert state["step"] == 4
    state["model"]["blocks.0.attn.q.weight"][0, 0] = float("nan")  # seed 1 only
    torch.save(state, paths[1])
    with pytest.raises(DivergenceError, match=r"seed 1: training loss is nan at step 5 "
                                              r"\(lr=0\.003\)") as info:
        train_seeds(mc, cfg.train, data, seeds=[0, 1], lr=LR, steps=STEPS,
                    device=CPU, resume_paths=paths, fingerprints=["f", "f"])
    assert info.value.seed == 1


def test_resume_after_interruption_equals_uninterrupted(project):
    cfg, data, tmp = project
    mc = model_config(cfg, data, "llama")
    seeds = [0, 1, 2]
    full = train_seeds(mc, cfg.train, data, seeds=seeds, lr=LR, steps=STEPS,
                       device=CPU)
    paths = [tmp / "interrupted" / f"seed_{s}.pt" for s in seeds]
    kw = dict(seeds=seeds, lr=LR, steps=STEPS, device=CPU, resume_paths=paths,
              fingerprints=["f"] * 3)
    # seed 0 saves step 8 before seed 1's tracker stops the run: seeds stand at steps 8, 4, 4
    with pytest.raises(Crash):
        train_seeds(mc, cfg.train, data, trackers=[Quiet(), CrashAt(8), Quiet()], **kw)
    assert [torch.load(p, weights_only=False)["step"] for p in paths] == [8, 4, 4]
    resumed = train_seeds(mc, cfg.train, data, **kw)
    for a, b in zip(full, resumed):
        assert_same_trajectory(a, b, loss_tol=1e-6, weight_tol=1e-6)
    # a state saved for another fingerprint is not resumed
    other = train_seeds(mc, cfg.train, data, **{**kw, "fingerprints": ["g"] * 3})
    assert other[0].history[0]["step"] == 4


def test_resume_states_are_shared_with_train_model_both_ways(project):
    cfg, data, tmp = project
    mc = model_config(cfg, data, "alibi")
    steps = STEPS
    alone = {s: train_model(mc, cfg.train, data, seed=s, lr=LR, steps=steps, device=CPU)
             for s in (0, 1)}

    def stop_at_8(step, _):
        if step == 8:
            raise Crash

    # train_model interrupted -> train_seeds resumes
    paths = [tmp / "shared" / f"seed_{s}.pt" for s in (0, 1)]
    for s, p in zip((0, 1), paths):
        with pytest.raises(Crash):
            train_model(mc, cfg.train, data, seed=s, lr=LR, steps=steps, device=CPU,
                        resume_path=p, fingerprint="f", on_eval=stop_at_8)
    theirs = torch.load(paths[0], weights_only=False)
    resumed = train_seeds(mc, cfg.train, data, seeds=[0, 1], lr=LR, steps=steps, device=CPU,
                          resume_paths=paths, fingerprints=["f", "f"])
    for s, r in zip((0, 1), resumed):
        assert r.history[0]["step"] == 4  # the first rows come from train_model's state
        assert_same_trajectory(alone[s], r)

    # train_seeds interrupted -> train_model resumes; the state has train_model's layout
    paths = [tmp / "shared-back" / f"seed_{s}.pt" for s in (0, 1)]
    with pytest.raises(Crash):
        train_seeds(mc, cfg.train, data, seeds=[0, 1], lr=LR, steps=steps, device=CPU,
                    trackers=[Quiet(), CrashAt(8)], resume_paths=paths, fingerprints=["f", "f"])
    ours = torch.load(paths[0], weights_only=False)
    assert ours.keys() == theirs.keys() and ours["step"] == theirs["step"] == 8
    assert ours["model"].keys() == theirs["model"].keys()
    assert ours["optimizer"]["param_groups"] == theirs["optimizer"]["param_groups"]
    assert ours["scheduler"] == theirs["scheduler"]
    for s, p in zip((0, 1), paths):
        r = train_model(mc, cfg.train, data, seed=s, lr=LR, steps=steps, device=CPU,
                        resume_path=p, fingerprint="f")
        assert_same_trajectory(alone[s], r)


def test_dropout_is_refused(project):
    cfg, data, _ = project
    mc = model_config(cfg, data, "baseline").replace(dropout=0.1)
    with pytest.raises(ValueError, match="dropout"):
        train_seeds(mc, cfg.train, data, seeds=[0], lr=LR, steps=2, device=CPU)


def test_the_stage_trains_batched_on_a_gpu_and_per_seed_threads_on_a_cpu():
    assert not batched.batched_on(torch.device("cpu"))
    assert batched.batched_on(torch.device("cuda")) and batched.batched_on(torch.device("mps"))
    # and replays its step as a CUDA graph on CUDA alone (tests/test_gpu.py checks the bits)
    assert batched.uses_cuda_graph(torch.device("cuda"))
    assert not batched.uses_cuda_graph(torch.device("mps"))
    assert not batched.uses_cuda_graph(torch.device("cpu"))


def mlflow_runs(uri: str) -> pd.DataFrame:
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["lmablate"])
    return runs.sort_values("tags.seed").reset_index(drop=True)


def test_batched_stage_records_each_seed_as_the_per_seed_path_does(project, monkeypatch):
    """The stage's batched path (forced here; on a CPU the stage uses threads) writes per seed
    what the threaded path writes: checkpoint, result.json, history rows and one MLflow run
    with the same tags, params and metrics; a finished seed is not trained again."""
    cfg, _, tmp = project
    monkeypatch.chdir(tmp)  # MLflow's default artifact root is ./mlruns
    (tmp / "best.json").write_text(json.dumps({"lr": LR, "d_model": 16}))
    cfg = dataclasses.replace(cfg, seeds=(0, 1, 2))
    out = {}
    for path, forced in (("threads", False), ("batched", True)):
        uri = f"sqlite:///{tmp / path}.db"
        # mlflow.set_tracking_uri exports MLFLOW_TRACKING_URI, which tracking.uri defers to
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        tracked = dataclasses.replace(cfg, tracking=dataclasses.replace(
            cfg.tracking, enabled=True, uri=uri))
        monkeypatch.setattr(train, "batched_on", lambda device, forced=forced: forced)
        d = tmp / path
        out[path] = train.run(tracked, "arithmetic", "baseline", tmp / "tokens",
                              tmp / "best.json", d / "ck", d / "history.csv", d / "grad.csv")
        out[path + "-runs"] = mlflow_runs(uri)
    ha, hb = (pd.read_csv(tmp / p / "history.csv") for p in ("threads", "batched"))
    pd.testing.assert_frame_equal(ha.drop(columns="elapsed_seconds"),
                                  hb.drop(columns="elapsed_seconds"), check_exact=False,
                                  atol=LOSS_TOL, rtol=0)
    for seed in cfg.seeds:
        ca, cb = (torch.load(tmp / p / "ck" / f"seed_{seed}" / "checkpoint.pt",
                             weights_only=True) for p in ("threads", "batched"))
        assert ca.keys() == cb.keys() and ca["meta"] == cb["meta"]
        for k in ca["model"]:
            torch.testing.assert_close(cb["model"][k], ca["model"][k], atol=WEIGHT_TOL, rtol=0)
        assert not (tmp / "batched" / "ck" / f"seed_{seed}" / "resume.pt").exists()
    ra, rb = out["threads-runs"], out["batched-runs"]
    assert len(ra) == len(rb) == 3
    assert list(rb["status"]) == ["FINISHED"] * 3
    same = [c for c in ra.columns if c.startswith(("tags.", "params."))
            and c not in ("tags.mlflow.runName",)]
    assert sorted(ra.columns) == sorted(rb.columns)
    pd.testing.assert_frame_equal(ra[same], rb[same])
    assert list(rb["tags.mlflow.runName"]) == [f"arithmetic-baseline-seed{s}" for s in (0, 1, 2)]
    assert sorted(c for c in rb.columns if c.startswith("metrics.")) == [
        "metrics.lr", "metrics.tokens_per_second", "metrics.train_loss",
        "metrics.train_seconds", "metrics.val_answer_loss", "metrics.val_exact_match",
        "metrics.val_loss"]  # an arithmetic run's answer probe too (lmablate.evaluate.answer_probe)
    assert ha["val_exact_match"].between(0, 1).all() and ha["val_answer_loss"].gt(0).all()
    from lmablate.tracking.mlflow_store import artifact_dir
    client = mlflow.MlflowClient()
    run_id = out["batched"]["seed_1"]["mlflow_run_id"]
    # every eval step once, and the timings at the last step, as train_seed logs them: no
    # summary point at step 0
    assert [m.step for m in client.get_metric_history(run_id, "val_loss")] == [4, 8, 12]
    assert [m.step for m in client.get_metric_history(run_id, "train_seconds")] == [12]
    # beside the store (a SQLite store's artifacts are proxied locations:
    # lmablate.tracking.mlflow_store)
    where = artifact_dir(client.tracking_uri, client.get_run(run_id).info.artifact_uri)
    assert (where / "checkpoint" / "checkpoint.pt").is_file()

    # a finished seed is kept, the others resume or retrain together
    ck = tmp / "batched" / "ck"
    stamps = {s: (ck / f"seed_{s}" / "checkpoint.pt").stat().st_mtime_ns for s in cfg.seeds}
    (ck / "seed_1" / "result.json").unlink()
    d = tmp / "batched"
    again = train.run(cfg, "arithmetic", "baseline", tmp / "tokens", tmp / "best.json",
                      d / "ck", d / "history.csv", d / "grad.csv")
    assert again["seed_0"] == out["batched"]["seed_0"]
    after = {s: (ck / f"seed_{s}" / "checkpoint.pt").stat().st_mtime_ns for s in cfg.seeds}
    assert after[0] == stamps[0] and after[2] == stamps[2] and after[1] > stamps[1]


def test_the_math_attention_backend_holds_until_the_last_of_overlapping_users_leaves():
    """sdpa_kernel's flags are process-wide: two batched runs in two threads overlap as
    enter A, enter B, leave A, leave B; B must still run under the math backend alone."""
    flags = (torch.backends.cuda.flash_sdp_enabled, torch.backends.cuda.mem_efficient_sdp_enabled,
             torch.backends.cuda.math_sdp_enabled)
    before = [f() for f in flags]
    first, second = batched._attention_backend(CPU), batched._attention_backend(CPU)
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert [f() for f in flags] == [False, False, True]
    second.__exit__(None, None, None)
    assert [f() for f in flags] == before
    assert before[0]  # PyTorch's default has flash on, so the check above could fail
