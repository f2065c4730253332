"""The one way a stage runs its jobs (training seeds or groups of seeds, evaluations, tuning
workers, decode batches): :func:`run_jobs`.

Where they run follows from where the stage computes (:func:`lmablate.execution.cluster.resolve`)
and the study's ``runtime`` settings, never from the jobs' results:

- on a Dask cluster (``runtime.cluster``): one task per job (:meth:`Cluster.map
  <lmablate.execution.cluster.Cluster.map>`), with the job's study config as the workers must
  see it (:meth:`Cluster.pin <lmablate.execution.cluster.Cluster.pin>`) and, where the workers
  do not see this workspace, the job's input files travelling with it and its output files
  coming back;
- ``inline``: one after another in the calling thread, torch's thread count left as it is (a
  batched group of seeds, which keeps an accelerator busy by itself);
- else on this machine, up to :func:`~lmablate.execution.parallel.worker_count` at a time, in
  threads or, with ``processes``, in spawned processes
  (:func:`~lmablate.execution.parallel.map_jobs`), each with one torch intra-op thread.

Whatever the place, results come back in the jobs' order, and a job's exception is raised
here as it was raised in the job.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Iterable, Sequence, TypeVar

import torch

from lmablate.config.study import RuntimeConfig, StudyConfig
from lmablate.execution.cluster import Cluster
from lmablate.execution.parallel import map_jobs, worker_count
from lmablate.train.device import resolve_device

J = TypeVar("J")
R = TypeVar("R")


def run_jobs(fn: Callable[[J], R], jobs: Sequence[J], *, device: torch.device | None = None,
             runtime: RuntimeConfig | None = None, cluster: Cluster | None = None,
             processes: bool = False, all_at_once: bool = False, drain: bool = False,
             inline: bool = False, workers: int | None = None,
             names: Sequence[str] | None = None,
             inputs: Callable[[J], Iterable[Path]] | None = None,
             outputs: Callable[[J], Iterable[Path]] | None = None) -> list[R]:
    """``[fn(job) for job in jobs]``, run where the stage computes (see the module doc).

    With ``cluster``: one task per job, named ``names`` (Dask keys; ``job-<i>`` if not given);
    a job that is a dataclass with a :class:`~lmablate.config.study.StudyConfig` field ``cfg``
    (or a list of such jobs) is sent with that config pinned; the files under ``inputs(job)``
    travel with the task and those under ``outputs(job)`` come back when the workers do not see
    this workspace. ``processes``, ``workers`` and ``inline`` do not apply there: the cluster's
    workers run the tasks.

    ``inline``: the jobs run one after another in this thread, torch's threads as they are.

    Otherwise the jobs run on this machine (on ``device``, or ``runtime.device`` resolved here
    if not given) on ``workers`` workers (at most one per job, one on an accelerator), or on
    :func:`~lmablate.execution.parallel.worker_count` of ``runtime``, ``device`` and
    ``all_at_once`` if ``workers`` is not given; in spawned processes with
    ``processes`` (``fn`` module-level, the jobs picklable), else in threads. ``drain``: the jobs
    are interchangeable workers that empty a shared queue (tuning workers), so only as many as
    run at once are started here; on a cluster each is a task.

    Raises:
        Interrupted: the stage was asked to stop (Ctrl-C); running jobs stop at their next step.
        ConfigError: a cluster worker is not of this machine's kind, or ``runtime.device`` is
            one this machine lacks.
        Exception: the first failing job's exception, with its message.
        TypeError: neither ``workers`` nor ``runtime`` given for jobs on this machine.
    """
    jobs = list(jobs)
    if cluster is not None:
        keys = list(names) if names is not None else [f"job-{i}" for i in range(len(jobs))]
        return cluster.map(fn, [_pinned(job, cluster) for job in jobs], keys,
                           inputs=inputs or (lambda job: ()), outputs=outputs or (lambda job: ()))
    if inline:
        return [fn(job) for job in jobs]
    if workers is None and runtime is None:
        raise TypeError("run_jobs: give workers or runtime for jobs on this machine")
    if device is None:
        device = resolve_device(runtime.device if runtime is not None else "cpu")
    if workers is not None:
        n = max(1, min(workers, len(jobs))) if device.type == "cpu" else 1
    else:
        n = worker_count(runtime, len(jobs), device, all_at_once=all_at_once)
    if drain:
        jobs = jobs[:n]
    return map_jobs(fn, jobs, n, processes=processes)


def _pinned(job, cluster: Cluster):
    """``job`` (or each job of a list) with its ``cfg`` as the cluster's workers must see it."""
    if isinstance(job, (list, tuple)):
        return type(job)(_pinned(j, cluster) for j in job)
    if (dataclasses.is_dataclass(job) and not isinstance(job, type)
            and isinstance(getattr(job, "cfg", None), StudyConfig)):
        return dataclasses.replace(job, cfg=cluster.pin(job.cfg))
    return job
