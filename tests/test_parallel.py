"""Concurrent jobs: seeds trained in threads give the weights and histories they give alone;
dropout moves jobs to processes; Optuna's threaded trials keep the trial count exact."""

import dataclasses
import threading
from pathlib import Path

import optuna
import pandas as pd
import pytest
import torch
import yaml

from lmablate import config, parallel, train, tune
from lmablate.config import ModelConfig, TrainConfig
from lmablate.data import generate
from lmablate.tokenizer import tokenize
from lmablate.tracking import NullTracker

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("parallel")
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["study"].update(seeds=[0, 1, 2], variants=["baseline"], datasets=["arithmetic"])
    raw["datasets"]["arithmetic"].update(n_train=2000, n_test=16)
    raw["model"].update(context_length=16, n_layers=1, n_heads=2, d_model=16)
    raw["train"].update(steps=30, eval_interval=10, eval_iters=2, warmup_steps=2, batch_size=4,
                        threads=1)
    raw["tune"].update(n_trials=5, steps=20, report_interval=5, d_model_choices=[16],
                       storage=f"sqlite:///{tmp / 'optuna.db'}")
    raw["tracking"]["enabled"] = False
    cfg = config.parse(raw)
    generate(cfg.dataset("arithmetic"), tmp / "raw")
    tokenize(cfg.dataset("arithmetic"), tmp / "raw", tmp / "tokens")
    (tmp / "best.json").write_text('{"lr": 0.003, "d_model": 16}')
    return cfg, tmp


def train_all(cfg, tmp: Path, out: str, **train_changes) -> dict:
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **train_changes))
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


def test_dropout_runs_in_processes_and_stays_deterministic(project):
    cfg, tmp = project
    cfg = dataclasses.replace(cfg, model=cfg.model.replace(dropout=0.1),
                              seeds=(0, 1))
    assert parallel.use_processes(cfg.train, [cfg.model])
    serial = train_all(cfg, tmp, "drop-serial", workers=1)
    spawned = train_all(cfg, tmp, "drop-processes", workers=2)
    assert losses(serial) == losses(spawned)
    assert_same_runs(tmp, "drop-serial", "drop-processes", cfg.seeds)


def test_worker_count_rules():
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    cores = parallel.cpu_count()
    assert parallel.worker_count(TrainConfig(workers=0), 100, cpu) == cores
    assert parallel.worker_count(TrainConfig(workers=0), 100, cpu, all_at_once=True) == 2 * cores
    assert parallel.worker_count(TrainConfig(workers=0, parallel="processes"), 100, cpu,
                                 all_at_once=True) == cores
    assert parallel.worker_count(TrainConfig(workers=5), 3, cpu) == 3
    assert parallel.worker_count(TrainConfig(workers=5), 3, gpu) == 1
    assert parallel.threads_per_worker(TrainConfig(threads=0), cores) == 1
    assert parallel.threads_per_worker(TrainConfig(threads=3), 2) == 3


def test_use_processes_only_for_dropout_or_when_asked():
    plain, drop = ModelConfig(vocab_size=10), ModelConfig(vocab_size=10, dropout=0.1)
    assert not parallel.use_processes(TrainConfig(), [plain])
    assert parallel.use_processes(TrainConfig(), [plain, drop])
    assert parallel.use_processes(TrainConfig(parallel="processes"), [plain])


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
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, workers=2))
    out = tmp / "tune"
    best = tune.run(cfg, "arithmetic", "baseline", tmp / "tokens", out / "best.json",
                    out / "trials.csv", NullTracker())
    study = optuna.load_study(study_name=best["study_name"], storage=cfg.tune.storage_url)
    states = [t.state for t in study.trials]
    finished = [s for s in states if s in tune.FINISHED]
    assert len(finished) == cfg.tune.n_trials == best["n_trials"]
    assert optuna.trial.TrialState.RUNNING not in states
    # every finished trial reported every tune.report_interval steps up to where it stopped
    for t in study.trials:
        if t.state in tune.FINISHED:
            steps = sorted(t.intermediate_values)
            assert steps == list(range(5, steps[-1] + 1, 5))
