"""Concurrent jobs: seeds trained in threads give the weights and histories they give alone;
dropout moves jobs to processes; a tuning study and an evaluation give the same bytes at any
worker count; a job thread computes with one intra-op thread from its first op."""

import dataclasses
import threading
from pathlib import Path

import optuna
import pandas as pd
import pytest
import torch
from lmablate.config.study import ModelConfig, RuntimeConfig
from lmablate.core.tracker import NullTracker
from lmablate.execution import parallel
from lmablate.stages import evaluate, train, tune
from lmablate.train import budget
from lmablate.tune import bracket, rungs, search_space, trials, tuning

from conftest import budgets

PARALLEL = {
    "study": {"seeds": [0, 1, 2], "variants": ["baseline"]},
    "train": {"budget_flops": budgets(30), "eval_interval": 10, "eval_iters": 2,
              "warmup_fraction": 0.1},
    # the first rung: 2 batches of 2 at half the budget; then 2 lrs at the full budget, one
    # seed each, no extension
    "tune": {"rungs": [[4, 0.5], [2, 1.0]], "trials_per_batch": 2, "reports": 4,
             "bracket_seeds": 1, "bracket_points": 2, "d_model_choices": [16, 32], "lr_low": 1e-3,
             "lr_high": 1e-1},
}


@pytest.fixture(scope="module")
def project(tmp_path_factory, make_project):
    tmp = tmp_path_factory.mktemp("parallel")
    project = make_project(tmp, PARALLEL)
    (tmp / "best.json").write_text('{"lr": 0.003, "d_model": 16}')
    return project.cfg, tmp


def train_all(cfg, tmp: Path, out: str, variant: str = "baseline", **runtime_changes) -> dict:
    cfg = dataclasses.replace(cfg, runtime=dataclasses.replace(cfg.runtime, **runtime_changes))
    d = tmp / out
    return train.run(cfg, "arithmetic", variant, tmp / "tokens", tmp / "best.json",
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


def test_a_thread_job_computes_with_one_intra_op_thread_from_its_first_op():
    # A product with a long inner dimension: its last bits depend on how many threads MKL
    # splits it over. As a job's first op, no earlier op has set the job thread's count. (On
    # one core every count is 1 and this cannot fail.)
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(16, 1024, generator=g), torch.randn(1024, 64, generator=g)
    before = torch.get_num_threads()
    torch.set_num_threads(parallel.INTRA_OP_THREADS)
    try:
        alone = a @ b
    finally:
        torch.set_num_threads(before)
    for _ in range(3):  # fresh job threads every time
        for workers in (1, 2, 4):
            products = parallel.map_jobs(lambda _: a @ b, range(workers), workers)
            assert all(torch.equal(p, alone) for p in products), workers


def test_evaluation_gives_the_same_bytes_at_any_worker_count(project):
    cfg, tmp = project
    train_all(cfg, tmp, "rope", variant="rope", workers=3)
    d = tmp / "rope"

    def evaluate_at(workers: int, name: str) -> tuple[bytes, bytes]:
        at = dataclasses.replace(cfg, runtime=dataclasses.replace(cfg.runtime, workers=workers))
        evaluate.run(at, "arithmetic", "rope", tmp / "tokens", tmp / "raw", d / "ck",
                     d / f"{name}.json", d / f"{name}-examples.json", NullTracker())
        return (d / f"{name}.json").read_bytes(), (d / f"{name}-examples.json").read_bytes()

    alone = evaluate_at(1, "serial")
    for i in range(3):
        for workers in (2, 3):
            assert evaluate_at(workers, f"threads-{workers}-{i}") == alone, (workers, i)


def tune_all(cfg, tmp: Path, out: str, **runtime_changes) -> dict:
    """Tune from empty storage in ``tmp/out`` with ``runtime_changes``."""
    cfg = dataclasses.replace(
        cfg, runtime=dataclasses.replace(cfg.runtime, **runtime_changes),
        tune=dataclasses.replace(cfg.tune, storage=f"sqlite:///{tmp / out / 'optuna.db'}"))
    (tmp / out).mkdir()
    return tune.run(cfg, "arithmetic", "baseline", tmp / "tokens", tmp / out / "best.json",
                    tmp / out / "trials.csv", NullTracker())


def study_trials(tmp: Path, out: str, best: dict) -> list[tuple]:
    """Each trial of ``out``'s study in slot order: its slot, rung, training seed and params."""
    study = optuna.load_study(study_name=best["study_name"],
                              storage=f"sqlite:///{tmp / out / 'optuna.db'}")
    return sorted((t.user_attrs[rungs.SLOT], t.user_attrs[rungs.RUNG],
                   t.user_attrs[rungs.TRIAL_SEED], t.params["lr"], t.params["d_model"])
                  for t in study.get_trials())


def test_tuning_gives_the_same_bytes_twice_and_at_any_worker_count(project):
    """Deterministic rungs and bracket: the same trials (params and seeds), bracket
    and answer at 1 and 2 workers, in threads or processes. The full-budget bracket is the real
    one: its learning rates each on two tuning seeds, and one extension batch."""
    cfg, tmp = project
    cfg = dataclasses.replace(cfg, tune=dataclasses.replace(cfg.tune, bracket_seeds=2,
                                                            bracket_points=3))
    best = tune_all(cfg, tmp, "tune-1", workers=1)
    first = study_trials(tmp, "tune-1", best)
    for other in ("tune-1-again", "tune-2", "tune-processes"):
        again = tune_all(cfg, tmp, other, workers=1 if other == "tune-1-again" else 2,
                         parallel="processes" if other == "tune-processes" else "threads")
        assert study_trials(tmp, other, again) == first, other
        assert again["bracket"] == best["bracket"], other
        for name in ("best.json", "trials.csv"):
            assert (tmp / other / name).read_bytes() == (tmp / "tune-1" / name).read_bytes(), \
                (other, name)
    # the comparison is not vacuous: trials differ, both widths and both rungs were trained,
    # and the bracket trained at least 2 learning rates at the full budget, each on the 2
    # tuning seeds
    trials = pd.read_csv(tmp / "tune-1" / "trials.csv")
    assert trials["value"].nunique() == len(trials) == len(first)
    assert set(trials["params_d_model"]) == {16, 32}
    assert list(trials["rung"]) == [0] * 4 + [1] * (len(trials) - 4)
    assert set(trials.loc[trials["rung"] == 0, "seed"]) == {cfg.tune.seed}
    full = trials[trials["rung"] == 1]
    seeds = full.groupby("params_lr")["seed"].apply(sorted)
    assert len(seeds) >= 2 and all(s == [cfg.tune.seed, cfg.tune.seed + 1] for s in seeds)
    assert full["params_d_model"].nunique() == 1
    record = best["bracket"]
    assert record is not None and len(record["points"]) == len(seeds)
    assert [p["lr"] for p in record["points"]] == pytest.approx(sorted(seeds.index))
    assert all(len(p["losses"]) == 2 for p in record["points"])


def test_a_slower_duplicate_of_a_trial_cannot_change_its_recorded_steps(project):
    """Two processes may take the same queued trial (lmablate.tune.storage.claim). The slower one's
    "last_step" attribute, written after the faster one's last report, must not decide the
    trial's row in trials.csv (nor best.json's step and FLOP totals): that once made the bytes
    depend on timing."""
    cfg, tmp = project
    steps = budget.trial_steps(cfg, "arithmetic", cfg.model_config("baseline", 10, d_model=16))
    interval = tuning.trial_train_config(cfg, "arithmetic", steps).eval_interval
    reports = {k: 2.0 - 0.1 * k for k in range(1, cfg.tune.reports + 1)}
    dists = search_space.trial_distributions(cfg.tune)
    attrs = {rungs.RUNG: 0, rungs.FRACTION: cfg.tune.budget_fraction, "steps": steps}
    finished = optuna.trial.create_trial(
        params={"lr": 1e-3, "d_model": 16}, distributions=dists, value=1.0,
        intermediate_values=reports,
        user_attrs={rungs.SLOT: 0, "last_step": (len(reports) - 1) * interval, **attrs})
    diverged = optuna.trial.create_trial(
        params={"lr": 1e-2, "d_model": 16}, distributions=dists,
        state=optuna.trial.TrialState.FAIL, intermediate_values={1: 2.5, 2: 2.4},
        user_attrs={rungs.SLOT: 1, "last_step": interval, rungs.OUTCOME: rungs.DIVERGED,
                    **attrs})
    rows = trials.trials_frame(cfg, "arithmetic", "baseline", 10, {0: finished, 1: diverged})
    assert [r["last_step"] for r in rows] == [steps, 2 * interval]
    assert interval > 1 and len(reports) > 2  # the attribute's value would differ


def test_tuning_follows_the_protocol(project):
    """Slots rung by rung, the first rung in batches of trials_per_batch; each trial spends
    its rung's share of the budget, warms up over a share of its own steps and reports at
    equal fractions of it; the full-budget rung is a bracket of learning rates a factor apart,
    centred one factor below the first rung's best, at that trial's width scaled to the full
    budget; the answer was trained at the full budget."""
    cfg, tmp = project
    best = tune_all(cfg, tmp, "protocol", workers=2)
    study = optuna.load_study(study_name=best["study_name"],
                              storage=f"sqlite:///{tmp / 'protocol' / 'optuna.db'}")
    trials = study.get_trials()
    # the storage alone says what the study tunes and what its objective is
    # arithmetic: the answer probe's, its mean over the trial (tune.arithmetic_objective)
    assert study.metric_names == ["val_answer_loss_mean"]
    assert best["objective"] == "val_answer_loss_mean"
    assert study.user_attrs == {
        "dataset": "arithmetic", "variant": "baseline",
        "budget_flops": cfg.train.budget_flops["arithmetic"],
        "rungs": [list(r) for r in cfg.tune.rungs],
        "lr_range": [cfg.tune.lr_low, cfg.tune.lr_high],
        "d_model_choices": list(cfg.tune.d_model_choices),
        "sampler_seed": cfg.tune.sampler_seed}
    results = tuning.slot_results(study)
    scaled, below = bracket.bracket_widths(cfg, "arithmetic", results, 1)
    width, compared = bracket.bracket_width(cfg, "arithmetic", results, 1)
    assert width in (scaled, below) and {scaled, below} <= set(cfg.tune.d_model_choices)
    # slots 4 and 5: the middle lr at both widths (5 stays empty when they are one), slot 6
    # the other lr at the width kept
    full = [4, 5, 6] if scaled != below else [4, 6]
    assert [t.user_attrs[rungs.SLOT] for t in trials] == [0, 1, 2, 3, *full]
    assert [t.user_attrs[rungs.RUNG] for t in trials] == [0, 0, 0, 0] + [1] * len(full)
    assert best["n_trials"] == 4 + len(full) and best["full_budget"] and best["rung"] == 1
    for t in trials:
        steps, fraction = t.user_attrs["steps"], t.user_attrs[rungs.FRACTION]
        model = cfg.model_config("baseline", 10, d_model=t.params["d_model"])
        assert abs(budget.training_flops(model, cfg.train.batch_size, steps)
                   / (fraction * cfg.train.budget_flops["arithmetic"]) - 1) < 0.05
        assert t.state == optuna.trial.TrialState.COMPLETE
        # every steps // reports steps, and at the last step (one more when they do not divide)
        reports = sorted(t.intermediate_values)
        assert reports[:cfg.tune.reports] == list(range(1, cfg.tune.reports + 1))
        assert len(reports) - cfg.tune.reports in (0, steps % cfg.tune.reports != 0)
        assert cfg.train.warmup_steps(steps) < steps // 2
        # its value is the mean of its reports; the last evaluation's is kept beside it
        values = [t.intermediate_values[k] for k in reports]
        assert t.value == pytest.approx(sum(values) / len(values), rel=1e-12)
        assert "final_objective" in t.user_attrs
    first = sorted(trials[:4], key=lambda t: (t.value, t.number))
    factor = cfg.tune.bracket_factor
    centre = first[0].params["lr"] / factor
    low, high = centre / factor ** 0.5, centre * factor ** 0.5
    bracket_trials = trials[4:]
    assert [t.params["d_model"] for t in bracket_trials] == (
        [scaled, below, width] if scaled != below else [width, width])
    assert [t.params["lr"] for t in bracket_trials] == pytest.approx(
        [low] * (len(full) - 1) + [high])
    if scaled != below:  # the width kept had the lower loss at the middle lr
        assert compared[width] == min(compared.values())
    assert [t.user_attrs[rungs.TRIAL_SEED] for t in trials] == [cfg.tune.seed] * len(trials)
    # two points and no room for a third: the better one is the answer (too few for a curve)
    at_width = [t for t in bracket_trials if t.params["d_model"] == width]
    winner = min(at_width, key=lambda t: (t.value, t.params["lr"]))
    assert (best["val_loss"], best["lr"], best["d_model"]) == (
        winner.value, winner.params["lr"], width)
    assert best["slot"] is None and best["budget_fraction"] == 1.0
    record = best["bracket"]
    assert record["state"] == "not bracketed within tune.bracket_points"
    assert record["fit"]["used"] == "best point" and record["uncertainty"] is None
    which = "smallest" if width == min(cfg.tune.d_model_choices) else "largest"
    assert best["on_edge"] == [f"lr {record['state']}",
                               f"d_model the {which} choice (of tune.d_model_choices)"]




def test_the_brackets_first_batches_train_together_at_one_width_with_the_same_bytes(
        project, monkeypatch):
    """At one width the bracket's first batch trains a single learning rate and its second
    batch does not wait for it (tuning.runs_alongside): the three trials share the cores, and
    the trials, bracket and files are those of the batches trained one after the other."""
    cfg, tmp = project
    cfg = dataclasses.replace(cfg, tune=dataclasses.replace(
        cfg.tune, d_model_choices=(16,), rungs=((4, 0.5), (3, 1.0)), bracket_points=3))
    together = []
    alongside = trials.runs_alongside

    def spy(*args):
        found = alongside(*args)
        together.append(found is not None)
        return found

    monkeypatch.setattr(trials, "runs_alongside", spy)
    best = tune_all(cfg, tmp, "together", workers=2)
    assert together.count(True) == 1  # once: the bracket's first batch
    monkeypatch.setattr(trials, "runs_alongside", lambda *args: None)
    apart = tune_all(cfg, tmp, "apart", workers=2)
    assert study_trials(tmp, "together", best) == study_trials(tmp, "apart", apart)
    for name in ("best.json", "trials.csv"):
        assert (tmp / "together" / name).read_bytes() == (tmp / "apart" / name).read_bytes()
    assert len(best["bracket"]["points"]) == 3
