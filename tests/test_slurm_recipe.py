"""scripts/slurm_cluster.py, the SLURM recipe of the handbook's Scale-out page: the job script it
would submit, read from dask-jobqueue itself, and its command line against a stand-in ``sbatch``.
Nothing here submits a job; each cluster's scheduler listens on 127.0.0.1 and is closed."""

from __future__ import annotations

import importlib
import os
import re
import sys
import time
from pathlib import Path

import pytest

from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "slurm_cluster.py"
LOOPBACK = {"host": "127.0.0.1", "port": 0, "dashboard_address": "127.0.0.1:0"}


@pytest.fixture(scope="module")
def recipe():
    try:
        importlib.import_module("dask_jobqueue")  # what the recipe is written against
    except ImportError as exc:
        pytest.fail(f"dask-jobqueue is not installed ({exc}); it comes with the test extra: "
                    "pip install -e '.[test]'", pytrace=False)
    return load_script(SCRIPT)


@pytest.fixture
def script(recipe):
    """The job script of a cluster on two made-up paths, and the cluster's scheduler address."""
    with recipe.make_cluster(venv="/opt/lmablate/.venv", workdir="/home/ada/lmablate", cpus=6,
                             memory="24GiB", walltime="02:30:00", partition="gpu",
                             account="ablations", **LOOPBACK) as cluster:
        import dask_jobqueue
        assert isinstance(cluster, dask_jobqueue.SLURMCluster)
        assert cluster.workers == {}  # constructing it submitted nothing
        yield cluster.job_script(), cluster.scheduler_address


def test_the_scheduler_listens_on_the_loopback_address_it_was_given(script):
    _, address = script
    assert re.fullmatch(r"tcp://127\.0\.0\.1:\d+", address), address


def test_each_job_books_one_gpu_the_cpus_memory_and_time(script):
    text, _ = script
    directives = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert directives == [
        "#SBATCH -J lmablate-gpu",
        "#SBATCH -p gpu",
        "#SBATCH -A ablations",
        "#SBATCH -n 1",
        "#SBATCH --cpus-per-task=6",
        "#SBATCH --mem=24G",
        "#SBATCH -t 02:30:00",
        "#SBATCH --gres=gpu:1",
    ]
    assert text.startswith("#!/usr/bin/env bash\n")


def test_the_prologue_enters_the_checkout_and_venv_and_leaves_the_cpu_capability_alone(script):
    text, _ = script
    lines = text.splitlines()
    start = lines.index("#SBATCH --gres=gpu:1") + 1
    assert lines[start:start + 3] == [
        "cd /home/ada/lmablate",
        "source /opt/lmablate/.venv/bin/activate",
        "export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK",
    ]
    assert "ATEN_CPU_CAPABILITY" not in text and "module load" not in text


def test_the_worker_is_one_process_with_one_thread_and_the_gpu_resource(script):
    text, address = script
    worker = text.rstrip("\n").splitlines()[-1]
    assert worker == (
        f"/opt/lmablate/.venv/bin/python -m distributed.cli.dask_worker {address} "
        "--name dummy-name --nthreads 1 --memory-limit 24.00GiB --nanny --death-timeout 60 "
        "--resources GPU=1")
    assert "--nworkers" not in worker  # one process: the job is not split


def test_a_gpu_type_asks_slurm_for_that_model(recipe):
    with recipe.make_cluster(gpu_type="a100", **LOOPBACK) as cluster:
        assert "#SBATCH --gres=gpu:a100:1" in cluster.job_script().splitlines()


def test_paths_with_spaces_are_quoted_in_the_prologue(recipe):
    with recipe.make_cluster(venv="/srv/my env", workdir="/srv/my repo", **LOOPBACK) as cluster:
        lines = cluster.job_script().splitlines()
    assert "cd '/srv/my repo'" in lines and "source '/srv/my env/bin/activate'" in lines


def _stand_ins(bin_dir: Path, log: Path) -> None:
    """``sbatch`` and ``scancel`` that only record what they were asked."""
    bin_dir.mkdir()
    for name, body in (("sbatch", f'cp "$1" "{log}/job.sh"\necho "Submitted batch job 4242"\n'),
                       ("scancel", f'echo "$@" >> "{log}/scancel"\n')):
        path = bin_dir / name
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(0o755)


def test_main_submits_the_jobs_prints_the_export_line_and_cancels_them_on_ctrl_c(
        recipe, tmp_path, monkeypatch, capsys):
    log = tmp_path / "log"
    log.mkdir()
    _stand_ins(tmp_path / "bin", log)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    real_sleep = time.sleep

    def ctrl_c_once_submitted(_seconds):
        deadline = time.monotonic() + 20
        while not (log / "job.sh").exists() and time.monotonic() < deadline:
            real_sleep(0.05)
        raise KeyboardInterrupt

    monkeypatch.setattr(recipe.time, "sleep", ctrl_c_once_submitted)
    recipe.main(["1", "--venv", sys.prefix, "--host", "127.0.0.1", "--port", "0",
                 "--dashboard-address", "127.0.0.1:0"])
    out = capsys.readouterr().out.splitlines()
    export = [line for line in out if line.startswith("export ")]
    assert len(export) == 1 and re.fullmatch(r"export LMABLATE_CLUSTER=tcp://127\.0\.0\.1:\d+",
                                             export[0]), out
    address = export[0].split("=", 1)[1]
    submitted = (log / "job.sh").read_text()
    assert f"-m distributed.cli.dask_worker {address} " in submitted
    assert "--resources GPU=1" in submitted
    assert (log / "scancel").read_text().split() == ["4242"]


def test_print_script_prints_the_job_script_and_submits_nothing(recipe, tmp_path, monkeypatch,
                                                                capsys):
    log = tmp_path / "log"
    log.mkdir()
    _stand_ins(tmp_path / "bin", log)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    recipe.main(["3", "--print-script", "--host", "127.0.0.1", "--port", "0",
                 "--dashboard-address", "127.0.0.1:0"])
    out = capsys.readouterr().out
    assert "#SBATCH --gres=gpu:1" in out and "--resources GPU=1" in out
    assert list(log.iterdir()) == []
