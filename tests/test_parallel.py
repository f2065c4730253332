"""Concurrent jobs: seeds trained in threads give the weights and histories they give alone;
dropout moves jobs to processes; a tuning study gives the same bytes at any worker count."""

import dataclasses
import threading
from pathlib import Path

import optuna
import pandas as pd
import pytest
import torch
from lmablate import budget, parallel, tuning
from lmablate.config import ModelConfig, RuntimeConfig
from lmablate.stages import train, tune
from lmablate.tracking import NullTracker

from conftest import budgets

PARALLEL = {
    "study": {"seeds": [0, 1, 2], "variants": ["baseline"]},
    "train": {"budget_flops": budgets(30), "eval_interval": 10, "eval_iters": 2,
              "warmup_fraction": 0.1},
    # the first rung: 2 batches of 2 at half the budget; then the best 2 at the full budget
    "tune": {"rungs": [[4, 0.5], [2, 1.0]], "trials_per_batch": 2, "reports": 4,
             "d_model_choices": [16, 32], "lr_low": 1e-3,
             "lr_high": 1e-1},
}


@pytest.fixture(scope="module")
def project(tmp_path_factory, make_project):
    tmp = tmp_path_factory.mktemp("parallel")
    project = make_project(tmp, PARALLEL)
    (tmp / "best.json").write_text('{"lr": 0.003, "d_model": 16}')
    return project.cfg, tmp


def train_all(cfg, tmp: Path, out: str, **runtime_changes) -> dict:
    cfg = dataclasses.replace(cfg, runtime=dataclasses.replace(cfg.runtime, **runtime_changes))
    d = tmp / out
    return train.run(cfg, "arithmetic", "baseline", tmp / "tokens", tmp / "best.json",
                     d / "ck", d / "history.csv", d / "grad.csv")


def weights(tmp: Path, out: str, seed: int) -> dict:
    return torch.load(tmp / out / "ck" / f"seed_{seed}" / "checkpoint.pt",
                      weights_only=True)["model"]


def assert_same_runs(tmp: Path, a: str, b: str, seeds) -> None:
    ha, hb = (pd.read_csv(tmp / out / "history.csv").drop(columns="elapsed_seconds")
              for out in (a, b))
    pd.testing.assert_frame_equal(ha, hb, check_exact=True)
    assert len(ha) == len(seeds) * 3  # steps 10, 20, 30 per seed
    for seed in seeds:
        # the same state saves to the same bytes (torch.save names its archive after the file)
        ca, cb = (tmp / out / "ck" / f"seed_{seed}" / "checkpoint.pt" for out in (a, b))
        assert ca.read_bytes() == cb.read_bytes(), seed
        wa, wb = weights(tmp, a, seed), weights(tmp, b, seed)
        assert wa.keys() == wb.keys()
        for k in wa:
            assert torch.equal(wa[k], wb[k]), (seed, k)


def losses(result: dict) -> dict:
    return {k: v["val_loss"] for k, v in result.items()}


def test_seeds_in_threads_equal_seeds_one_at_a_time(project):
    cfg, tmp = project
    serial = train_all(cfg, tmp, "serial", workers=1)
    threads = train_all(cfg, tmp, "threads", workers=3, parallel="threads")
    assert losses(serial) == losses(threads)
    assert_same_runs(tmp, "serial", "threads", cfg.seeds)
    # different seeds really differ (the comparison above is not vacuous)
    assert len(set(losses(serial).values())) == 3


def test_changing_runtime_settings_does_not_retrain_a_finished_seed(project):
    cfg, tmp = project
    first = train_all(cfg, tmp, "kept", workers=1)
    ck = tmp / "kept" / "ck"
    stamps = {p: p.stat().st_mtime_ns for p in ck.glob("seed_*/*")}
    assert len(stamps) == 2 * len(cfg.seeds)  # checkpoint.pt and result.json per seed
    again = train_all(cfg, tmp, "kept", workers=3, parallel="processes")
    assert again == first
    assert {p: p.stat().st_mtime_ns for p in ck.glob("seed_*/*")} == stamps
    # ...whereas a setting that changes the result does retrain
    changed = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, eval_iters=1))
    retrained = train_all(changed, tmp, "kept", workers=1)
    assert all((ck / f"seed_{s}" / "checkpoint.pt").stat().st_mtime_ns
               > stamps[ck / f"seed_{s}" / "checkpoint.pt"] for s in cfg.seeds)
    assert retrained != first


def test_dropout_runs_in_processes_and_stays_deterministic(project):
    cfg, tmp = project
    cfg = dataclasses.replace(cfg, model=cfg.model.replace(dropout=0.1),
                              seeds=(0, 1))
    assert parallel.use_processes(cfg.runtime, [cfg.model])
    serial = train_all(cfg, tmp, "drop-serial", workers=1)
    spawned = train_all(cfg, tmp, "drop-processes", workers=2)
    assert losses(serial) == losses(spawned)
    assert_same_runs(tmp, "drop-serial", "drop-processes", cfg.seeds)


def test_worker_count_rules():
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    cores = parallel.cpu_count()
    assert parallel.worker_count(RuntimeConfig(workers=0), 100, cpu) == cores
    assert parallel.worker_count(RuntimeConfig(workers=0), 100, cpu,
                                 all_at_once=True) == parallel.JOBS_PER_CORE * cores
    assert parallel.worker_count(RuntimeConfig(workers=0), 5, cpu, all_at_once=True) == min(
        5, parallel.JOBS_PER_CORE * cores)
    assert parallel.worker_count(RuntimeConfig(workers=0, parallel="processes"), 100, cpu,
                                 all_at_once=True) == cores
    assert parallel.worker_count(RuntimeConfig(workers=5), 3, cpu) == 3
    assert parallel.worker_count(RuntimeConfig(workers=5), 3, gpu) == 1


def test_use_processes_only_for_dropout_or_when_asked():
    plain, drop = ModelConfig(vocab_size=10), ModelConfig(vocab_size=10, dropout=0.1)
    assert not parallel.use_processes(RuntimeConfig(), [plain])
    assert parallel.use_processes(RuntimeConfig(), [plain, drop])
    assert parallel.use_processes(RuntimeConfig(parallel="processes"), [plain])


def test_map_jobs_keeps_order_raises_and_restores_threads():
    before = torch.get_num_threads()
    seen = set()

    def job(x):
        seen.add(threading.current_thread().name)
        assert torch.get_num_threads() == 1
        return x * x

    assert parallel.map_jobs(job, range(6), 3) == [x * x for x in range(6)]
    assert any(name.startswith("lmablate-job") for name in seen)
    assert torch.get_num_threads() == before

    def fails(x):
        if x == 2:
            raise ValueError("job 2 failed")
        return x

    with pytest.raises(ValueError, match="job 2 failed"):
        parallel.map_jobs(fails, range(4), 2)
    assert torch.get_num_threads() == before


def tune_all(cfg, tmp: Path, out: str, **runtime_changes) -> dict:
    """Tune from empty storage in ``tmp/out`` with ``runtime_changes``."""
    cfg = dataclasses.replace(
        cfg, runtime=dataclasses.replace(cfg.runtime, **runtime_changes),
        tune=dataclasses.replace(cfg.tune, storage=f"sqlite:///{tmp / out / 'optuna.db'}"))
    (tmp / out).mkdir()
    return tune.run(cfg, "arithmetic", "baseline", tmp / "tokens", tmp / out / "best.json",
                    tmp / out / "trials.csv", NullTracker())


def test_tuning_gives_the_same_bytes_twice_and_at_any_worker_count(project):
    cfg, tmp = project
    tune_all(cfg, tmp, "tune-1", workers=1)
    for other in ("tune-1-again", "tune-2", "tune-processes"):
        tune_all(cfg, tmp, other, workers=1 if other == "tune-1-again" else 2,
                 parallel="processes" if other == "tune-processes" else "threads")
        for name in ("best.json", "trials.csv"):
            assert (tmp / other / name).read_bytes() == (tmp / "tune-1" / name).read_bytes(), \
                (other, name)
    # the comparison is not vacuous: trials differ, both widths were tried, some were pruned
    trials = pd.read_csv(tmp / "tune-1" / "trials.csv")
    assert trials["value"].nunique() == len(trials) == cfg.tune.n_trials
    assert set(trials["params_d_model"]) == {16, 32}
    assert (trials["state"] == "PRUNED").any()


def test_a_slower_duplicate_of_a_trial_cannot_change_its_recorded_steps(project):
    """Two processes may take the same queued trial (lmablate.tuning.claim). The slower one's
    "last_step" attribute, written after the faster one's last report, must not decide the
    trial's row in trials.csv (nor best.json's step and FLOP totals): that once made the bytes
    depend on timing."""
    cfg, tmp = project
    steps = budget.trial_steps(cfg, "arithmetic", cfg.model_config("baseline", 10, d_model=16))
    interval = tuning.trial_train_config(cfg, "arithmetic", steps).eval_interval
    reports = {k: 2.0 - 0.1 * k for k in range(1, cfg.tune.reports + 1)}
    space = tuning.search_space(cfg.tune)
    finished = optuna.trial.create_trial(
        params={"lr": 1e-3, "d_model": 16}, distributions=space, value=1.0,
        intermediate_values=reports,
        user_attrs={tuning.SLOT: 0, "steps": steps, "last_step": (len(reports) - 1) * interval})
    pruned = optuna.trial.create_trial(
        params={"lr": 1e-2, "d_model": 16}, distributions=space,
        state=optuna.trial.TrialState.PRUNED, intermediate_values={1: 2.5, 2: 2.4},
        user_attrs={tuning.SLOT: 1, "steps": steps, "last_step": interval})
    rows = tune.trials_frame(cfg, "arithmetic", "baseline", 10, {0: finished, 1: pruned})
    assert [r["last_step"] for r in rows] == [len(reports) * interval, 2 * interval]
    assert interval > 1 and len(reports) > 2  # the attribute's value would differ


def test_tuning_follows_the_protocol(project):
    """Batches of trials_per_batch, start-up trials never pruned, no pruning in warm-up, each
    trial spending its share of the budget and reporting at equal fractions of it."""
    cfg, tmp = project
    best = tune_all(cfg, tmp, "protocol", workers=2)
    study = optuna.load_study(study_name=best["study_name"],
                              storage=f"sqlite:///{tmp / 'protocol' / 'optuna.db'}")
    trials = study.get_trials()
    # the storage alone says what the study tunes and what its objective is
    assert study.metric_names == ["val_loss"]
    assert study.user_attrs == {
        "dataset": "arithmetic", "variant": "baseline",
        "budget_flops": cfg.train.budget_flops["arithmetic"],
        "trial_budget_fraction": cfg.tune.budget_fraction,
        "lr_range": [cfg.tune.lr_low, cfg.tune.lr_high],
        "d_model_choices": list(cfg.tune.d_model_choices),
        "sampler_seed": cfg.tune.sampler_seed}
    assert [t.user_attrs[tuning.SLOT] for t in trials] == list(range(cfg.tune.n_trials))
    assert best["n_trials"] == cfg.tune.n_trials
    assert best["n_complete"] >= cfg.tune.n_startup_trials
    for t in trials:
        slot, steps = t.user_attrs[tuning.SLOT], t.user_attrs["steps"]
        model = cfg.model_config("baseline", 10, d_model=t.params["d_model"])
        assert steps == {16: 30, 32: 8}[t.params["d_model"]]
        assert abs(budget.training_flops(model, cfg.train.batch_size, steps)
                   / cfg.train.budget_flops["arithmetic"] - 1) < 0.05
        reports = sorted(t.intermediate_values)
        if t.state == optuna.trial.TrialState.COMPLETE:
            assert reports == list(range(1, cfg.tune.reports + 1))
        else:
            assert t.state == optuna.trial.TrialState.PRUNED
            assert slot >= cfg.tune.n_startup_trials
            assert t.user_attrs["last_step"] > cfg.train.warmup_steps
    assert best["on_edge"] == tuning.on_edge(cfg.tune, {"lr": best["lr"],
                                                        "d_model": best["d_model"]})


def test_proposals_depend_only_on_earlier_batches_and_the_seed(project):
    cfg, _ = project
    first = tuning.propose(cfg.tune, {}, range(0, 2), sampler_seed=0)
    assert first == tuning.propose(cfg.tune, {}, range(0, 2), sampler_seed=0)
    assert first != tuning.propose(cfg.tune, {}, range(0, 2), sampler_seed=1)
    assert first[0] != first[1]
    space = tuning.search_space(cfg.tune)
    done = {s: optuna.trial.create_trial(params=p, distributions=space, value=float(s))
            for s, p in enumerate(first)}
    second = tuning.propose(cfg.tune, done, range(2, 4), sampler_seed=0)
    assert second == tuning.propose(cfg.tune, done, range(2, 4), sampler_seed=0)
    assert second != first
