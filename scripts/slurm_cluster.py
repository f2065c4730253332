"""lmablate's GPU workers as SLURM jobs: a Dask cluster for ``LMABLATE_CLUSTER``.

Run it on a login node, in the repository's checkout on the filesystem the compute nodes share,
with the project's virtualenv there (``pip install -e ".[cluster,postgres]"``)::

    python scripts/slurm_cluster.py 4 --partition gpu --account myproject

It starts a Dask scheduler in this process, submits 4 jobs with ``sbatch`` (each one Dask worker
with one GPU: ``--gres=gpu:1``, Dask resource ``GPU=1``), prints the scheduler's address and the
line to paste into the shell that runs ``dvc repro``::

    export LMABLATE_CLUSTER=tcp://10.0.0.5:8786

and keeps running until Ctrl-C, which cancels the jobs. ``--print-script`` prints the job script
and submits nothing. Every job runs this script's virtualenv and checkout. The job
script sets nothing that changes torch's CPU capability (no ``ATEN_CPU_CAPABILITY``), and
``--gpu-type`` asks SLURM for one GPU model, since a worker whose GPU's name differs from the
driver's is refused.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from dask_jobqueue import SLURMCluster

ROOT = Path(__file__).resolve().parents[1]


def make_cluster(
    *,
    venv: str | Path = sys.prefix,
    workdir: str | Path = ROOT,
    cpus: int = 8,
    memory: str = "32GiB",
    walltime: str = "08:00:00",
    partition: str | None = None,
    account: str | None = None,
    gpu_type: str | None = None,
    job_name: str = "lmablate-gpu",
    host: str | None = None,
    port: int = 8786,
    dashboard_address: str = ":8787",
    interface: str | None = None,
    log_directory: str | None = None,
) -> SLURMCluster:
    """A SLURM cluster whose every job is one lmablate GPU worker; no job is submitted yet.

    Each job books one GPU (``--gres=gpu:1``, or ``gpu:<gpu_type>:1``), ``cpus`` CPUs, ``memory``
    and ``walltime``, and runs one Dask worker process with one thread (one task at a time: the
    train stage sends a variant's batched seeds as one task to a worker with ``GPU=1``) and the
    Dask resource ``GPU=1``. The job script changes to ``workdir`` and activates ``venv``; the
    worker runs ``venv``'s Python.

    Args:
        venv: the project's virtualenv, at the same path on every node (default: this
            Python's).
        workdir: the repository's checkout the workers start in.
        cpus: CPUs per job (``--cpus-per-task``); torch's threads use them.
        memory: memory per job (``--mem``, and the worker's ``--memory-limit``).
        walltime: each job's time limit (``-t``).
        partition: SLURM partition (``-p``), or the site's default.
        account: SLURM account (``-A``), or the user's default.
        gpu_type: a GPU model in the site's gres names (``a100``), so that all workers have the
            same GPU.
        job_name: SLURM job name (``-J``).
        host: address the scheduler binds to and workers connect to; by default the address of
            ``interface``, or all interfaces with this machine's address advertised.
        port: the scheduler's port (0: any free one).
        dashboard_address: the scheduler's dashboard.
        interface: network interface (``ib0``) for the scheduler and workers.
        log_directory: directory for the jobs' output (``-o``, ``-e``); created if missing.
    """
    venv = Path(venv)
    scheduler_options = {"port": port, "dashboard_address": dashboard_address}
    if host is not None:
        scheduler_options["host"] = host
    return SLURMCluster(
        # one worker process with one thread per job; the job books `cpus` CPUs for torch
        cores=1,
        processes=1,
        job_cpu=cpus,
        memory=memory,
        walltime=walltime,
        queue=partition,
        account=account,
        job_name=job_name,
        interface=interface,
        log_directory=log_directory,
        python=str(venv / "bin" / "python"),
        job_extra_directives=[f"--gres=gpu:{gpu_type}:1" if gpu_type else "--gres=gpu:1"],
        worker_extra_args=["--resources", "GPU=1"],
        # Only the checkout, the virtualenv and the thread count: no ATEN_CPU_CAPABILITY, no
        # other toolchain, so a worker's torch is the driver's.
        job_script_prologue=[
            f"cd {shlex.quote(str(workdir))}",
            f"source {shlex.quote(str(venv / 'bin' / 'activate'))}",
            "export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK",
        ],
        scheduler_options=scheduler_options,
    )


def main(argv: list[str] | None = None) -> None:
    """Start the cluster, scale it to the given number of jobs and wait for Ctrl-C."""
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("jobs", type=int, help="SLURM jobs to submit, one GPU worker each")
    p.add_argument("--venv", default=sys.prefix, help="the project's virtualenv (default: this "
                   "Python's, %(default)s)")
    p.add_argument("--workdir", default=str(ROOT), help="the checkout (default: %(default)s)")
    p.add_argument("--cpus", type=int, default=8)
    p.add_argument("--memory", default="32GiB")
    p.add_argument("--walltime", default="08:00:00")
    p.add_argument("--partition")
    p.add_argument("--account")
    p.add_argument("--gpu-type")
    p.add_argument("--host")
    p.add_argument("--port", type=int, default=8786)
    p.add_argument("--dashboard-address", default=":8787")
    p.add_argument("--interface")
    p.add_argument("--log-directory")
    p.add_argument("--print-script", action="store_true", help="print the job script and exit")
    a = p.parse_args(argv)
    cluster = make_cluster(venv=a.venv, workdir=a.workdir, cpus=a.cpus, memory=a.memory,
                           walltime=a.walltime, partition=a.partition, account=a.account,
                           gpu_type=a.gpu_type, host=a.host, port=a.port,
                           dashboard_address=a.dashboard_address, interface=a.interface,
                           log_directory=a.log_directory)
    with cluster:
        if a.print_script:
            print(cluster.job_script())
            return
        cluster.scale(jobs=a.jobs)
        print(f"scheduler: {cluster.scheduler_address} ({a.jobs} jobs submitted)")
        print("in the shell that runs dvc repro:")
        print(f"export LMABLATE_CLUSTER={cluster.scheduler_address}", flush=True)
        try:
            while True:
                time.sleep(60)
        except KeyboardInterrupt:
            print("cancelling the jobs")


if __name__ == "__main__":
    main()
