"""Concurrent jobs: seeds trained in threads give the weights and histories they give alone;
dropout moves jobs to processes; Optuna's threaded trials keep the trial count exact."""

import dataclasses
import threading
from pathlib import Path

import optuna
import pandas as pd
import pytest
import torch
from lmablate import parallel, tuning
from lmablate.config import ModelConfig, RuntimeConfig
from lmablate.stages import train, tune
from lmablate.tracking import NullTracker

PARALLEL = {
    "study": {"seeds": [0, 1, 2], "variants": ["baseline"]},
    "train": {"steps": 30, "eval_interval": 10, "eval_iters": 2, "warmup_steps": 2},
    "tune": {"n_trials": 5, "steps": 20, "report_interval": 5},
    "runtime": {"threads": 1},
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
    again = train_all(cfg, tmp, "kept", workers=3, threads=2, parallel="processes")
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
    assert parallel.worker_count(RuntimeConfig(workers=0), 100, cpu, all_at_once=True) == 2 * cores
    assert parallel.worker_count(RuntimeConfig(workers=0, parallel="processes"), 100, cpu,
                                 all_at_once=True) == cores
    assert parallel.worker_count(RuntimeConfig(workers=5), 3, cpu) == 3
    assert parallel.worker_count(RuntimeConfig(workers=5), 3, gpu) == 1
    assert parallel.threads_per_worker(RuntimeConfig(threads=0), cores) == 1
    assert parallel.threads_per_worker(RuntimeConfig(threads=3), 2) == 3


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

    assert parallel.map_jobs(job, range(6), 3, 1) == [x * x for x in range(6)]
    assert any(name.startswith("lmablate-job") for name in seen)
    assert torch.get_num_threads() == before

    def fails(x):
        if x == 2:
            raise ValueError("job 2 failed")
        return x

    with pytest.raises(ValueError, match="job 2 failed"):
        parallel.map_jobs(fails, range(4), 2, 1)
    assert torch.get_num_threads() == before


def test_threaded_trials_finish_exactly_n_trials(project):
    cfg, tmp = project
    cfg = dataclasses.replace(cfg, runtime=dataclasses.replace(cfg.runtime, workers=2))
    out = tmp / "tune"
    best = tune.run(cfg, "arithmetic", "baseline", tmp / "tokens", out / "best.json",
                    out / "trials.csv", NullTracker())
    study = optuna.load_study(study_name=best["study_name"], storage=cfg.tune.storage_url)
    states = [t.state for t in study.trials]
    finished = [s for s in states if s in tuning.FINISHED]
    assert len(finished) == cfg.tune.n_trials == best["n_trials"]
    assert optuna.trial.TrialState.RUNNING not in states
    # every finished trial reported every tune.report_interval steps up to where it stopped
    for t in study.trials:
        if t.state in tuning.FINISHED:
            steps = sorted(t.intermediate_values)
            assert steps == list(range(5, steps[-1] + 1, 5))
