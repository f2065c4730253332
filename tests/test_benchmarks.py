"""The benchmarks in ``benchmarks/`` run against the current code.

Each script runs at its ``--smoke`` size in a subprocess, as CI would
(``python benchmarks/<script>.py --smoke``), and must exit 0 and print what its results are
read from: the machine header and a ratio against its reference. A setting or function that
a benchmark uses and the code no longer has then fails here, not in the next measurement.
GPU-only arms are skipped by the scripts on a CPU; their argument parsing and CPU path still
run. Nothing here is timed.

The scripts run side by side, one per core (a module-scoped fixture), while the tests await
them one by one.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
HELPERS = {"common.py", "reference_model.py"}  # imported by the scripts, not run
# Every script and a line its smoke output must contain besides the header: the comparison
# against its reference ("ratio ... = 1.23x"), or for seed_scale_gpu.py (compared with seed
# 000's published numbers, not a reference in the same process) its results table.
RATIO = r"ratio .* = \d+\.\d+x"
EXPECTED = {
    "bench_throughput.py": RATIO,
    "bench_decode.py": RATIO,
    "bench_parallel.py": RATIO,
    "bench_batched_seeds.py": RATIO,
    "bench_stage_startup.py": RATIO,
    "seed_scale_gpu.py": r"^\| baseline \| [\d,]+ \| [\d,]+ \| \d+\.\d+ \+- \d+\.\d+ \|",
}
HEADER = (r"^== .+ ==$", r"^machine : .+ logical cores", r"^software: Python .+ torch ",
          r"^device  : \S+", r"^load    : \d+\.\d+ ")
LIMIT_S = 600  # a hung script fails the test instead of hanging CI; not a timing assertion


def smoke(script: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python benchmarks/<script> --smoke`` in ``cwd``, stdout and stderr together."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("LMABLATE_OPTUNA_STORAGE", "MLFLOW_TRACKING_URI")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    env["TQDM_DISABLE"] = "1"
    return subprocess.run([sys.executable, str(BENCH / script), "--smoke"], cwd=cwd, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=LIMIT_S)


@pytest.fixture(scope="module")
def smoke_runs(tmp_path_factory):
    """Every script's smoke run, started at once, one per core at a time, each in a scratch
    directory of its own: script name -> future of its ``CompletedProcess``."""
    out = tmp_path_factory.mktemp("bench-smoke")
    with ThreadPoolExecutor(max(1, min(len(EXPECTED), os.cpu_count() or 1))) as pool:
        runs = {}
        for script in EXPECTED:
            (out / script).mkdir()
            runs[script] = pool.submit(smoke, script, out / script)
        yield runs


def test_every_benchmark_script_has_a_smoke_run_here():
    scripts = {p.name for p in BENCH.glob("*.py")} - HELPERS
    assert scripts == set(EXPECTED)


@pytest.mark.parametrize("script", list(EXPECTED))
def test_benchmark_runs_at_smoke_size_and_prints_machine_header_and_ratio(smoke_runs, script):
    done = smoke_runs[script].result()
    rc, output = done.returncode, done.stdout
    assert rc == 0, f"{script} --smoke exited {rc}:\n{output[-4000:]}"
    for pattern in HEADER:
        assert re.search(pattern, output, re.M), f"{script}: no line {pattern!r}:\n{output}"
    assert re.search(EXPECTED[script], output, re.M), (
        f"{script}: no line {EXPECTED[script]!r}:\n{output}")


def test_gpu_checks_script_parses_and_runs_only_existing_scripts():
    text = (BENCH / "gpu_checks.sh").read_text(encoding="utf-8")
    assert subprocess.run(["bash", "-n", str(BENCH / "gpu_checks.sh")]).returncode == 0
    for name in re.findall(r"benchmarks/(\w+\.py)", text):
        assert name in EXPECTED, name
