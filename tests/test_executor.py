"""run_jobs, the one way a stage runs its jobs: the same results inline, in threads, in processes
and as cluster tasks, in the jobs' order; a job's error raised with its message; a cluster's
tasks named as asked, their configs pinned and their files travelling."""

import dataclasses
import hashlib
import os
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from lmablate.config import params
from lmablate.config.study import RuntimeConfig, StudyConfig
from lmablate.execution import cluster
from lmablate.execution.executor import run_jobs

from conftest import tiny_params

CPU = torch.device("cpu")
TESTS = Path(__file__).resolve().parent


@dataclasses.dataclass(frozen=True)
class Job:
    """A job as the stages' are: a dataclass with the study config, reading and writing files."""

    cfg: StudyConfig | None
    x: int
    src: Path
    out: Path


def compute(job: Job) -> tuple[int, str, str, str]:
    """A small torch computation seeded by ``job.x`` whose bytes depend on the thread count
    (a product with a long inner dimension), with ``src/in.txt`` read and ``out/<x>.bin``
    written: ``(x, sha256 of the product, what was read, where it computed)``."""
    g = torch.Generator().manual_seed(job.x)
    product = torch.randn(16, 1024, generator=g) @ torch.randn(1024, 64, generator=g)
    data = product.numpy().tobytes()
    job.out.mkdir(parents=True, exist_ok=True)
    (job.out / f"{job.x}.bin").write_bytes(data)
    read = (job.src / "in.txt").read_text()
    device = "" if job.cfg is None else f"{job.cfg.runtime.device} {job.cfg.runtime.cluster}"
    return job.x, hashlib.sha256(data).hexdigest(), read, device


def fail_on_two(job: Job) -> int:
    if job.x == 2:
        raise ValueError(f"job {job.x} failed: no such input")
    return job.x


def jobs_in(folder: Path, n: int = 5) -> list[Job]:
    src = folder / "src"
    src.mkdir(parents=True, exist_ok=True)
    (src / "in.txt").write_text("input")
    return [Job(None, x, src, folder / "out") for x in range(n)]


def outputs(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((folder / "out").iterdir())}


def test_the_same_jobs_give_the_same_results_and_files_inline_in_threads_and_in_processes(
        tmp_path):
    results, files = {}, {}
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # inline leaves torch's threads as they are: the jobs' count here
    try:
        for where, kw in (("inline", {"inline": True}), ("threads", {"workers": 3}),
                          ("processes", {"workers": 2, "processes": True})):
            results[where] = run_jobs(compute, jobs_in(tmp_path / where), device=CPU, **kw)
            files[where] = outputs(tmp_path / where)
    finally:
        torch.set_num_threads(before)
    assert [r[0] for r in results["inline"]] == list(range(5))
    assert results["inline"] == results["threads"] == results["processes"]
    assert files["inline"] == files["threads"] == files["processes"]
    assert len(files["inline"]) == 5


def test_results_keep_the_jobs_order_whichever_job_ends_first():
    def slow_first(x: int) -> int:
        time.sleep(0.05 * (4 - x))
        return x

    assert run_jobs(slow_first, range(5), device=CPU, workers=5) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("where", [{"inline": True}, {"workers": 3},
                                   {"workers": 2, "processes": True}])
def test_an_exception_in_one_job_is_raised_with_its_message(tmp_path, where):
    with pytest.raises(ValueError, match="job 2 failed: no such input"):
        run_jobs(fail_on_two, jobs_in(tmp_path), device=CPU, **where)


def test_the_worker_count_comes_from_runtime_workers_and_is_one_on_an_accelerator():
    seen: list[str] = []

    def record(x: int) -> int:
        seen.append(threading.current_thread().name)
        return x

    assert run_jobs(record, range(4), device=CPU, runtime=RuntimeConfig(workers=1)) == [0, 1,
                                                                                        2, 3]
    assert set(seen) == {threading.current_thread().name}  # one worker: this thread
    seen.clear()
    run_jobs(record, range(4), device=torch.device("meta"), workers=4)
    assert set(seen) == {threading.current_thread().name}
    seen.clear()
    run_jobs(record, range(4), device=CPU, runtime=RuntimeConfig(workers=2))
    assert all(name.startswith("lmablate-job") for name in seen)


def test_jobs_on_this_machine_need_a_worker_count_or_the_runtime():
    with pytest.raises(TypeError, match="give workers or runtime"):
        run_jobs(abs, [1, -2], device=CPU)
    assert run_jobs(abs, [1, -2], runtime=RuntimeConfig(device="cpu", workers=2)) == [1, 2]


def test_draining_workers_start_only_as_many_as_run_at_once():
    calls: list[int] = []
    lock = threading.Lock()

    def drain(x: int) -> int:
        with lock:
            calls.append(x)
        return x

    assert run_jobs(drain, [7] * 6, device=CPU, runtime=RuntimeConfig(workers=2),
                    drain=True) == [7, 7]
    assert calls == [7, 7]


def test_inline_jobs_keep_the_torch_threads_and_pooled_ones_get_one():
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        assert run_jobs(lambda _: torch.get_num_threads(), range(2), device=CPU,
                        inline=True) == [3, 3]
        assert run_jobs(lambda _: torch.get_num_threads(), range(2), device=CPU,
                        workers=2) == [1, 1]
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


# ------------------------------------------------------------------------------------ cluster


@pytest.fixture(scope="module")
def loopback(tmp_path_factory):
    """A scheduler and a worker on 127.0.0.1 that can import this module (its jobs' functions
    are sent by reference, as the stages' are)."""
    from test_cluster import Loopback

    with pytest.MonkeyPatch.context() as mp:
        # the scheduler unpickles the tasks too
        mp.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), *sys.path]))
        lb = Loopback(tmp_path_factory.mktemp("dask"))
        try:
            lb.start_worker("w1")
        except BaseException:
            lb.close()
            raise
    try:
        yield lb
    finally:
        lb.close()


@pytest.fixture()
def unshared_cluster(loopback, tmp_path, monkeypatch):
    """A checked cluster for the tiny study in ``tmp_path``, its workers taken not to see this
    workspace (so files travel)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LMABLATE_CLUSTER", loopback.address)
    cfg = params.parse(tiny_params())
    found = cluster.connect(cfg)
    found.shared = False
    return cfg, found


def test_cluster_tasks_are_named_as_asked_pinned_and_their_files_travel(loopback,
                                                                        unshared_cluster,
                                                                        tmp_path):
    cfg, found = unshared_cluster
    jobs = [dataclasses.replace(j, cfg=cfg) for j in jobs_in(Path("work"), 3)]
    names = [f"compute-{j.x}" for j in jobs]
    done = run_jobs(compute, jobs, device=CPU, cluster=found, names=names,
                    inputs=lambda j: [j.src], outputs=lambda j: [j.out])
    local = run_jobs(compute, jobs_in(tmp_path / "local", 3), device=CPU, workers=2)
    # the same products and input, and the config as the worker must see it: no cluster
    assert [r[:3] for r in done] == [r[:3] for r in local]
    assert {r[3] for r in done} == {"cpu None"}
    # the outputs came back into this workspace
    assert outputs(tmp_path / "work") == outputs(tmp_path / "local")
    keys = {str(t["key"]) for t in loopback.client.get_task_stream()}
    for name in names:
        assert any(k.startswith(f"{name}-") for k in keys), (name, keys)


def test_a_cluster_task_s_exception_is_raised_with_its_message(unshared_cluster, tmp_path):
    cfg, found = unshared_cluster
    jobs = [dataclasses.replace(j, cfg=cfg) for j in jobs_in(Path("work"), 3)]
    with pytest.raises(ValueError, match="job 2 failed: no such input"):
        run_jobs(fail_on_two, jobs, device=CPU, cluster=found,
                 inputs=lambda j: [j.src])
