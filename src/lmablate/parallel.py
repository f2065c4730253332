"""Independent jobs of one stage (training seeds, Optuna workers) in parallel processes.

Small models leave most of a CPU core idle between PyTorch's small kernels, so on a CPU several
single-threaded processes do more work per second than one process with every thread. On a GPU
one process already keeps the device busy and jobs run one after another.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import Callable, Sequence, TypeVar

import torch

from .config import TrainConfig

PR_SET_PDEATHSIG = 1  # linux/prctl.h
J = TypeVar("J")
R = TypeVar("R")


def worker_count(cfg: TrainConfig, n_jobs: int, device: torch.device) -> int:
    """Processes to use for ``n_jobs`` jobs: ``train.workers`` (0 = one per CPU core), never more
    than the jobs, and 1 on an accelerator."""
    if device.type != "cpu":
        return 1
    wanted = cfg.workers or os.cpu_count() or 1
    return max(1, min(wanted, n_jobs))


def threads_per_worker(cfg: TrainConfig, workers: int) -> int:
    """``train.threads`` if set, else the CPU cores shared evenly between the workers."""
    return cfg.threads or max(1, (os.cpu_count() or 1) // workers)


def _init_worker(threads: int, parent: int) -> None:
    torch.set_num_threads(threads)
    if sys.platform == "linux":
        # Die with the parent: a stage killed with SIGKILL must not leave workers that keep
        # writing its checkpoints while the stage is run again.
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the line above took effect
        os._exit(1)


def map_jobs(fn: Callable[[J], R], jobs: Sequence[J], workers: int, threads: int) -> list[R]:
    """``[fn(job) for job in jobs]``, in ``workers`` spawned processes when ``workers > 1``.

    ``fn`` must be a module-level function and the jobs picklable. Results keep the jobs' order;
    the first job that raises re-raises its exception here (the other jobs are cancelled).
    """
    if workers <= 1:
        torch.set_num_threads(threads)
        return [fn(job) for job in jobs]
    ctx = multiprocessing.get_context("spawn")  # fork after torch/OpenMP start-up can hang
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                             initargs=(threads, os.getpid())) as pool:
        futures = [pool.submit(fn, job) for job in jobs]
        try:
            return [f.result() for f in futures]
        except BaseException:
            for f in futures:
                f.cancel()
            raise

