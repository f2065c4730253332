"""Independent jobs of one stage (training seeds, evaluation seeds) run concurrently on a CPU.

Small models leave most of a CPU core idle between PyTorch's small kernels, so several jobs with
one intra-op thread each do more work per second than one job with every thread. By default the
jobs are threads of the stage's process: PyTorch releases the GIL inside its kernels (and the
CPU autograd engine runs backward on the calling thread), so threads use every core, and they
cost nothing to start, whereas a spawned process first imports torch and MLflow again (~3 s
here, per stage). Processes (``runtime.parallel: processes``) are for many-core machines where the
GIL would limit threads, and for models with dropout, whose masks come from PyTorch's
process-wide RNG: threads would draw from it in a nondeterministic order. On a GPU one job
already keeps the device busy and jobs run one after another.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
import signal
import threading
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor, wait
from typing import Callable, Iterable, Iterator, Sequence, TypeVar

import torch

from lmablate.config.study import ModelConfig, RuntimeConfig
from lmablate.core import interrupt
from lmablate.execution.lifetime import die_with_parent

J = TypeVar("J")
R = TypeVar("R")


def cpu_count() -> int:
    """CPU cores this process may run on (the affinity mask, not every core of the machine)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


# At most this many concurrent thread jobs per core (seeds, evaluations): each is a small model
# with one intra-op thread, so more threads than cores only share the cores.
JOBS_PER_CORE = 4


def worker_count(cfg: RuntimeConfig, n_jobs: int, device: torch.device, *,
                 all_at_once: bool = False) -> int:
    """Concurrent jobs for ``n_jobs`` jobs: ``runtime.workers`` if set (0 = auto), never more than
    the jobs, and 1 on an accelerator.

    Auto is one job per core. With ``all_at_once`` and thread workers, auto runs up to
    :data:`JOBS_PER_CORE` jobs per core at once, so that no core idles while the last job of
    an uneven round runs alone: 5 seeds on 2 cores take 2.5 rounds of work, not 4 together and
    then 1 alone (the OS shares the cores; measured on the default study's Shakespeare baseline,
    2 cores: 68.4 s all at once against 82.0 s four at a time, same results). Tuning uses it
    only where the bracket's first two batches train together (three trials,
    :func:`lmablate.tune.tuning.runs_alongside`); its other batches fill 2 cores evenly or
    hold one trial.
    """
    if device.type != "cpu":
        return 1
    cores = cpu_count()
    auto = JOBS_PER_CORE * cores if all_at_once and cfg.parallel == "threads" else cores
    return max(1, min(cfg.workers or auto, n_jobs))


# Torch intra-op threads of every job, whatever the worker count. PyTorch's CPU kernels split
# their reductions by thread, so the thread count changes the last bits of a result (measured: a
# tuning trial's val loss 1.888890028 with 1 thread, 1.888889551 with 2). One thread per job
# makes results the same at any runtime.workers; the cores are used by running jobs side by
# side instead.
INTRA_OP_THREADS = 1


def use_processes(cfg: RuntimeConfig, models: Iterable[ModelConfig]) -> bool:
    """Whether jobs must run in processes: ``runtime.parallel: processes``, or a model with
    dropout (its masks come from the process-wide RNG; see the module doc)."""
    return cfg.parallel == "processes" or any(m.dropout > 0 for m in models)


def _init_worker(threads: int, parent: int) -> None:
    # First: from here on SIGINT (Ctrl-C reaches the whole process group) asks the running job
    # to stop at its next step; till now it was ignored (see _sigint_ignored). The parent
    # decides when the stage ends, and a worker killed by it would break the pool.
    interrupt.install_handler()
    torch.set_num_threads(threads)
    # Die with the parent: a stage killed with SIGKILL must not leave workers that keep
    # writing its checkpoints while the stage is run again.
    die_with_parent(parent, signal.SIGKILL)


def _init_thread(threads: int) -> None:
    # A new thread starts with OpenMP's and MKL's defaults (every core), not with the count
    # torch.set_num_threads gave the thread that made it: those are per thread. Torch sets a
    # thread's own count only when an op first asks for it (at::parallel_for,
    # torch.get_num_threads), and small elementwise ops and matrix products do not; until then
    # MKL splits a product over every core, which changes the last bits of a long inner
    # dimension (measured, 2 cores: a (16, 1024) @ (1024, 64) product differs in its last
    # bits on a fresh thread from the same product with one thread). Set here, every op of a
    # job computes with the thread count the job would have at runtime.workers: 1.
    torch.set_num_threads(threads)


def _job(fn: Callable[[J], R], job: J) -> R:
    """``fn(job)``, unless the stage was asked to stop before the job started."""
    interrupt.check()
    return fn(job)


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """SIGINT ignored in this process while worker processes are spawned, so that they start
    ignoring it (a handler is not inherited across exec; SIG_IGN is) until their initializer
    installs theirs: a Ctrl-C during the seconds a worker imports torch would otherwise kill it
    with a traceback. A SIGINT sent in these few milliseconds of spawning is lost. Only from
    the main thread (where Python allows it)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _result(future: Future) -> R:
    """``future.result()``, raising :class:`~lmablate.core.interrupt.Interrupted` meanwhile if
    the stage is asked to stop (a SIGINT sent to this process alone must still reach the jobs)."""
    while not future.done():
        wait([future], timeout=0.25)
        interrupt.check()
    return future.result()


def _stop(pool: Executor, futures: list[Future], processes: bool) -> None:
    """Stop the jobs of ``pool`` after an interrupt: cancel those not started, ask the running
    ones to stop at their next step (in worker processes by SIGINT, repeated until they are
    done: a worker still starting up ignores it), wait for them, and only then shut the pool
    down, once. (An early ``shutdown(wait=False)`` let the pool's manager thread close its
    wake-up pipe while the pool was still woken, which printed a traceback at exit.)"""
    interrupt.request()
    procs = list((getattr(pool, "_processes", None) or {}).values()) if processes else []
    for f in futures:  # the queued ones; a job already handed to a worker stops by SIGINT
        f.cancel()
    # f.done(), not wait()'s own test: a future cancelled here is done but never "notified"
    while running := [f for f in futures if not f.done()]:
        for proc in procs:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                if proc.is_alive():
                    os.kill(proc.pid, signal.SIGINT)
        wait(running, timeout=0.5)
    pool.shutdown(wait=True)


def map_jobs(fn: Callable[[J], R], jobs: Sequence[J], workers: int, *,
             processes: bool = False) -> list[R]:
    """``[fn(job) for job in jobs]``, up to ``workers`` at a time, each job with
    :data:`INTRA_OP_THREADS` torch intra-op threads.

    Jobs run in threads of this process, or with ``processes`` in spawned worker processes
    (``fn`` must then be a module-level function and the jobs picklable). Results keep the jobs'
    order. The first job that raises re-raises its exception here; jobs not yet started are
    cancelled (thread jobs already running finish first, keeping what they write). The
    process's torch thread count is restored on return.

    Ctrl-C (SIGINT), or a ``KeyboardInterrupt`` in the calling thread, stops every job at its
    next step (:mod:`lmablate.core.interrupt`): jobs not started are cancelled, running ones
    raise :class:`~lmablate.core.interrupt.Interrupted` at their next check, and once they have
    stopped it is raised here.

    Raises:
        Interrupted: the stage was asked to stop.
    """
    before = torch.get_num_threads()
    call = functools.partial(_job, fn)
    try:
        with interrupt.deferred():
            if workers <= 1:
                torch.set_num_threads(INTRA_OP_THREADS)
                return [call(job) for job in jobs]
            pool: Executor
            with _sigint_ignored() if processes else contextlib.nullcontext():
                if processes:
                    # fork after torch/OpenMP start-up can hang
                    ctx = multiprocessing.get_context("spawn")
                    pool = ProcessPoolExecutor(workers, mp_context=ctx,
                                               initializer=_init_worker,
                                               initargs=(INTRA_OP_THREADS, os.getpid()))
                else:
                    torch.set_num_threads(INTRA_OP_THREADS)  # here, and what torch gives a thread
                    pool = ThreadPoolExecutor(workers, thread_name_prefix="lmablate-job",
                                              initializer=_init_thread,
                                              initargs=(INTRA_OP_THREADS,))
                futures = [pool.submit(call, job) for job in jobs]  # spawns the processes
            with pool:
                try:
                    return [_result(f) for f in futures]
                except KeyboardInterrupt:
                    _stop(pool, futures, processes)
                    raise
                except BaseException:
                    for f in futures:
                        f.cancel()
                    raise
    finally:
        torch.set_num_threads(before)
