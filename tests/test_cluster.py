"""runtime.cluster: the stages' seeds, evaluations and trials on a Dask cluster give the bytes of
the embedded run; a worker of another kind is refused; a worker killed mid-task is survived."""

import dataclasses
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from distributed import Client

from lmablate.config import params
from lmablate.config.study import ConfigError
from lmablate.core.validation import error_line
from lmablate.execution import cluster
from lmablate.execution.cluster import MachineKind, mismatch
from lmablate.stages import train

from conftest import budgets, load_script, tiny_params
from test_scale_out import mlflow_server, postgres

SERVERS = (mlflow_server, postgres)  # test_scale_out's fixtures, used here by name

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SEEDS = [0, 1, 2]
# run-to-run fields: wall-clock timings and MLflow's random run ids
TIMINGS = ("train_seconds", "tokens_per_second", "mlflow_run_id", "elapsed_seconds")


class Loopback:
    """A Dask scheduler and workers on 127.0.0.1, each process in a session of its own (a kill
    takes the worker's nanny with it, as when a machine goes away)."""

    def __init__(self, folder: Path):
        self.folder, self.workers = folder, {}
        file = folder / "scheduler.json"
        self.scheduler = self._start("scheduler", [
            str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0",
            "--no-dashboard", "--scheduler-file", str(file)])
        for _ in range(300):
            if file.exists() and file.stat().st_size:
                break
            time.sleep(0.1)
        self.address = json.loads(file.read_text())["address"]
        self.client = Client(self.address, timeout=60)
        self.client.get_task_stream()  # the scheduler records every task from here on

    def _start(self, name: str, cmd: list[str], env: dict | None = None) -> subprocess.Popen:
        log = open(self.folder / f"{name}.log", "w")
        # from another folder than the study's: a worker must not rely on the driver's cwd
        return subprocess.Popen(cmd, cwd=self.folder, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})}, start_new_session=True)

    def start_worker(self, name: str, env: dict | None = None) -> None:
        before = len(self.client.scheduler_info(n_workers=-1)["workers"])
        self.workers[name] = self._start(name, [
            str(BIN / "dask"), "worker", self.address, "--nthreads", "1", "--nworkers", "1",
            "--host", "127.0.0.1", "--name", name, "--no-dashboard"], env)
        self.client.wait_for_workers(before + 1, timeout=60)

    def address_of(self, name: str) -> str:
        return next(a for a, w in self.client.scheduler_info(n_workers=-1)["workers"].items()
                    if w["name"] == name)

    def kill(self, name: str) -> None:
        proc = self.workers.pop(name)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def close(self) -> None:
        cluster.close_clients()  # the stages' clients of this process, before the scheduler
        self.client.close()
        for proc in [*self.workers.values(), self.scheduler]:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture(scope="module")
def loopback(tmp_path_factory):
    lb = Loopback(tmp_path_factory.mktemp("dask"))
    try:
        lb.start_worker("w1")
        lb.start_worker("w2")
        yield lb
    finally:
        lb.close()


def make_study(work: Path, overrides: dict | None = None) -> Path:
    """A tiny project in ``work`` (one dataset, two variants, three seeds, MLflow on)."""
    work.mkdir(parents=True)
    for name in ("dvc.yaml", "pyproject.toml", "requirements.lock"):
        (work / name).write_bytes((ROOT / name).read_bytes())
    raw = tiny_params({"study": {"seeds": SEEDS}, "tracking": {"enabled": True},
                       **(overrides or {})})
    (work / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    shutil.copytree(ROOT / "src", work / "src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "components", work / "components",  # a dep of the check stage
                    ignore=shutil.ignore_patterns("__pycache__"))
    for cmd in (["git", "init", "-q"], [str(BIN / "dvc"), "init", "-q"]):
        subprocess.run(cmd, cwd=work, check=True)
    shutil.copytree(ROOT / ".dvc" / "plots", work / ".dvc" / "plots")  # the plot templates
    return work


def run(cmd: list[str], cwd: Path, cluster_address: str | None = None, stores: dict | None = None,
        **kw) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("LMABLATE_CLUSTER", "MLFLOW_TRACKING_URI", "LMABLATE_OPTUNA_STORAGE")}
    env["PATH"] = f"{BIN}{os.pathsep}{env['PATH']}"
    env.update(stores or {})
    if cluster_address:
        env["LMABLATE_CLUSTER"] = cluster_address
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, **kw)


def without_timings(obj):
    if isinstance(obj, dict):
        return {k: without_timings(v) for k, v in obj.items() if k not in TIMINGS}
    if isinstance(obj, list):
        return [without_timings(v) for v in obj]
    return obj


def same_results(a: Path, b: Path) -> list[str]:
    """Every result file of study ``a`` compared with ``b``'s: byte for byte, but for the
    timings and MLflow run ids in ``result.json``, ``history.csv`` and the report's tables of
    them. Returns the files compared."""
    compared = []
    for path in sorted(p for p in a.rglob("*") if p.is_file()):
        rel = path.relative_to(a)
        if rel.parts[0] not in ("runs", "reports"):
            continue
        other = b / rel
        compared.append(str(rel))
        if rel.name == "result.json":
            assert without_timings(json.loads(path.read_text())) == without_timings(
                json.loads(other.read_text())), rel
        elif rel.name in ("history.csv", "summary.csv", "ablation.csv", "report.md") or (
                rel.parts[:2] == ("reports", "figures")):
            continue  # timings (wall-clock seconds, tokens per second) and figures of them
        else:
            assert path.read_bytes() == other.read_bytes(), rel
    return compared


# ---------------------------------------------------------------------------------- unit tests


def test_a_scheduler_address_is_checked_by_the_params_rule(monkeypatch):
    raw = tiny_params({"runtime": {"cluster": "localhost:8786"}})
    with pytest.raises(ConfigError, match=r"runtime\.cluster='localhost:8786' is not allowed; "
                                          r"a Dask scheduler address <protocol>://<host>:<port>"):
        params.parse(raw)
    cfg = params.parse(tiny_params({"runtime": {"cluster": "tcp://10.0.0.5:8786"}}))
    assert cfg.runtime.cluster_address == "tcp://10.0.0.5:8786"
    monkeypatch.setenv("LMABLATE_CLUSTER", "")
    assert cfg.runtime.cluster_address is None  # the environment says: no cluster
    monkeypatch.setenv("LMABLATE_CLUSTER", "8786")
    with pytest.raises(ConfigError, match=r"LMABLATE_CLUSTER \(env\)='8786' is not allowed"):
        cfg.runtime.cluster_address


def test_a_worker_of_another_kind_is_refused_in_one_line_naming_both():
    ours = MachineKind("2.13.0+cpu", "c0de", "cpu AVX512 numerics 6f1286420fc4", None, "driver")
    assert mismatch("tcp://w:1", dataclasses.replace(ours, host="elsewhere"), ours, "cpu") is None
    line = mismatch("tcp://w:1", dataclasses.replace(ours, cpu="cpu AVX512 numerics 0123456789ab"),
                    ours, "cpu")
    assert line == ("runtime.cluster: worker tcp://w:1 computes with CPU AVX512 numerics "
                    "0123456789ab, this machine with AVX512 numerics 6f1286420fc4; its results "
                    "would differ, so it is refused (start every worker with the same "
                    "ATEN_CPU_CAPABILITY, or none, as this machine, from an install of "
                    "requirements.lock)")
    assert "torch 2.12.0, this machine with 2.13.0+cpu" in mismatch(
        "tcp://w:1", dataclasses.replace(ours, torch="2.12.0"), ours, "cpu")
    assert "lmablate code 1234, this machine with c0de" in mismatch(
        "tcp://w:1", dataclasses.replace(ours, code="1234"), ours, "cpu")
    gpu = dataclasses.replace(ours, gpu="cuda NVIDIA H200")
    assert "GPU NVIDIA H100, this machine with NVIDIA H200" in mismatch(
        "tcp://w:1", dataclasses.replace(gpu, gpu="cuda NVIDIA H100"), gpu, "cuda")
    assert "GPU NVIDIA H200 numerics 1, this machine with NVIDIA H200 numerics 2" in mismatch(
        "tcp://w:1", dataclasses.replace(gpu, gpu="cuda NVIDIA H200 numerics 1"),
        dataclasses.replace(gpu, gpu="cuda NVIDIA H200 numerics 2"), "cuda")
    # on CUDA the CPU kernels compute nothing that is kept
    assert mismatch("tcp://w:1", dataclasses.replace(gpu, cpu="cpu AVX2"), gpu, "cuda") is None


def test_a_worker_without_a_component_file_or_with_another_version_is_refused(tmp_path,
                                                                            monkeypatch):
    """The files of components/ that the study's variants name are part of a machine's kind, as
    its working directory holds them: a task imports them from there."""
    cfg = params.parse(tiny_params({
        "variants": {"sq": {"ffn": "components.sq:Sq"}, "unused": {"norm": "components.n:N"}},
        "study": {"variants": ["baseline", "sq"]}}))
    assert cluster.study_component_files(cfg) == ("components/sq.py",)
    driver, worker = tmp_path / "driver", tmp_path / "worker"
    for folder in (driver, worker):
        (folder / "components").mkdir(parents=True)
    (driver / "components" / "sq.py").write_text("# the driver's\n")
    monkeypatch.chdir(driver)
    ours = cluster.machine_kind(cluster.study_component_files(cfg))
    digest = hashlib.sha256(b"# the driver's\n").hexdigest()
    assert ours.components == (("components/sq.py", digest),)
    monkeypatch.chdir(worker)
    missing = cluster.machine_kind(["components/sq.py"])
    assert missing.components == (("components/sq.py", None),)
    assert mismatch("tcp://w:1", missing, ours, "cpu") == (
        "runtime.cluster: worker tcp://w:1 computes with components/sq.py none (missing), this "
        f"machine with sha256 {digest[:12]}; its results would differ, so it is refused (start "
        "every worker in a checkout with this machine's components/)")
    (worker / "components" / "sq.py").write_text("# another version\n")
    other = cluster.machine_kind(["components/sq.py"])
    other_digest = hashlib.sha256(b"# another version\n").hexdigest()
    assert (f"computes with components/sq.py sha256 {other_digest[:12]}, this machine with "
            f"sha256 {digest[:12]}") in mismatch("tcp://w:1", other, ours, "cpu")
    (worker / "components" / "sq.py").write_text("# the driver's\n")
    assert mismatch("tcp://w:1", cluster.machine_kind(["components/sq.py"]), ours, "cpu") is None
    # a built-in study asks for no file: a worker's components/ is none of its business
    builtin = MachineKind("2.13.0+cpu", "c0de", "cpu AVX2", None, "driver")
    assert mismatch("tcp://w:1", dataclasses.replace(builtin, components=(("components/x.py",
                                                                            "ab"),)),
                    builtin, "cpu") is None


def test_a_jobs_paths_move_to_a_scratch_folder_and_relative_ones_become_absolute(tmp_path):
    cfg = params.parse(tiny_params())
    job = train.SeedJob(cfg, "arithmetic", "baseline", cfg.model, 1e-3, 0, 4,
                        Path("data/tokens"), Path("runs/seed_0"))
    absolute = cluster._absolute([job], tmp_path)[0]
    assert absolute.tokens_dir == tmp_path / "data/tokens"
    moved = cluster._moved(absolute, tmp_path, Path("/scratch"))
    assert (moved.tokens_dir, moved.seed_dir) == (Path("/scratch/data/tokens"),
                                                 Path("/scratch/runs/seed_0"))
    assert moved.cfg == cfg and moved.model_cfg == cfg.model
    assert cluster._moved(Path("/elsewhere/x"), tmp_path, Path("/scratch")) == Path("/elsewhere/x")


def test_a_relative_sqlite_store_is_made_absolute_and_servers_are_kept(tmp_path):
    assert cluster._absolute_url("sqlite:///optuna.db", tmp_path) == f"sqlite:///{tmp_path}/optuna.db"
    assert cluster._absolute_url("sqlite:////abs/optuna.db", tmp_path) == "sqlite:////abs/optuna.db"
    url = "postgresql+psycopg2://u:p@db/optuna"
    assert cluster._absolute_url(url, tmp_path) == url
    assert cluster._local_store("sqlite:////abs/mlflow.db") and cluster._local_store("mlruns")
    assert not cluster._local_store(url) and not cluster._local_store("http://mlflow:5000")


def test_the_kind_of_device_is_the_cpu_kernels_torch_dispatches_to():
    from lmablate.train.device import device_kind
    assert device_kind(torch.device("cpu")) == f"cpu {torch.backends.cpu.get_cpu_capability()}"
    code = ("import torch; from lmablate.train.device import device_kind; "
            "print(device_kind(torch.device('cpu')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "ATEN_CPU_CAPABILITY": "default"}).stdout
    assert out.strip() == "cpu DEFAULT"


def run_numerics(env: dict[str, str]) -> str:
    """:func:`lmablate.train.numerics.numerics_kind` of the CPU in a new process with ``env``
    added."""
    code = ("import torch; from lmablate.train.numerics import numerics_kind; "
            "print(numerics_kind(torch.device('cpu')))")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, env={**os.environ, **env}).stdout.strip()


def test_the_numerics_fingerprint_is_stable_across_processes_and_thread_counts():
    from lmablate.train.numerics import numerics_kind
    here = numerics_kind(torch.device("cpu"))
    assert re.fullmatch(r"cpu \w+ numerics [0-9a-f]{12}", here)
    threads = torch.get_num_threads()
    assert {here, run_numerics({"OMP_NUM_THREADS": "1"}), run_numerics({"OMP_NUM_THREADS": "2"})
            } == {here}
    assert torch.get_num_threads() == threads


def test_the_numerics_fingerprint_changes_with_the_kernels():
    """ATEN_CPU_CAPABILITY=default: the same torch, other kernels, other bits."""
    if torch.backends.cpu.get_cpu_capability() == "DEFAULT":
        pytest.skip("this machine's own kernels are the default ones")
    here, other = run_numerics({}), run_numerics({"ATEN_CPU_CAPABILITY": "default"})
    assert other.startswith("cpu DEFAULT numerics ")
    assert other.split()[-1] != here.split()[-1]


def test_the_numerics_fingerprint_changes_with_numpy_s_kernels_though_torch_s_do_not():
    """numpy's SIMD target and OpenBLAS's kernel, pinned lower where this CPU has a higher one:
    the torch probe computes the same bits, the host's numpy does not, and the fingerprint
    says so."""
    from lmablate.train.numerics import host_numerics
    here = host_numerics()
    pins = {}
    if "X86_V4" in here.split(";")[0].split():
        pins["NPY_DISABLE_CPU_FEATURES"] = "X86_V4 AVX512_ICL AVX512_SPR"
    if "openblas" in here and not here.endswith("Haswell"):
        pins["OPENBLAS_CORETYPE"] = "Haswell"
    if not pins:
        pytest.skip("numpy and OpenBLAS run no kernel above AVX2 on this machine")
    code = "from lmablate.train.numerics import host_numerics; print(host_numerics())"
    lowered = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True, env={**os.environ, **pins}).stdout.strip()
    assert lowered != here
    assert "X86_V4" not in lowered.split(";")[0].split()
    assert run_numerics(pins).split()[-1] != run_numerics({}).split()[-1]


def test_the_probe_s_adamw_step_is_torch_s_fused_adamw_and_its_formula_elsewhere():
    """The fused kernel called directly equals torch.optim.AdamW(fused=True); the formula used
    on other devices equals it to rounding."""
    from lmablate.train.numerics import _adamw
    torch.manual_seed(0)
    ref = [torch.randn(5, 3), torch.randn(7)]
    grads = [torch.randn_like(p) for p in ref]
    results = []
    for way in ("optimizer", "cpu", "formula"):
        params = [p.clone().requires_grad_() for p in ref]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        if way == "optimizer":
            opt = torch.optim.AdamW(params, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1,
                                    fused=True)
            opt.step()
            opt.step()
        else:
            moments = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
            for step in (1, 2):
                _adamw(params, moments, step, torch.device(way if way == "cpu" else "meta"))
        results.append([p.detach() for p in params])
    assert all(torch.equal(a, b) for a, b in zip(results[0], results[1]))
    assert all(torch.allclose(a, b, rtol=1e-6, atol=1e-7) for a, b in zip(results[0], results[2]))
    assert not all(torch.equal(a, b) for a, b in zip(results[0], ref))


# ------------------------------------------------------------------------------------ cluster


def test_a_remote_worker_with_sqlite_stores_is_refused_before_any_task(loopback, monkeypatch,
                                                                       tmp_path):
    ours = cluster.machine_kind()
    # this process plays a driver on another host: every worker is then remote
    monkeypatch.setattr(cluster, "machine_kind",
                        lambda component_files=(): dataclasses.replace(ours, host="driver"))
    monkeypatch.setenv("LMABLATE_CLUSTER", loopback.address)
    monkeypatch.chdir(tmp_path)
    cfg = params.parse(tiny_params())
    with pytest.raises(ConfigError, match=r"params: tune\.storage \(LMABLATE_OPTUNA_STORAGE\)="
                                          r"'sqlite:///.*' is not allowed with workers on other "
                                          r"hosts \(tcp://127\.0\.0\.1:\d+\); use a server"):
        cluster.connect(cfg)


def test_without_a_shared_filesystem_a_seeds_files_travel_with_its_task(
        loopback, make_project, tmp_path, monkeypatch):
    """Workers that do not see the workspace get the tokens with the task and send the
    checkpoint and result back: the same bytes as training here."""
    results = {}
    for where in ("local", "cluster"):
        project = make_project(tmp_path / where, {"study": {"seeds": [0, 1]}})
        best = project.path / "best.json"
        best.write_text(json.dumps({"lr": 0.01, "d_model": 16, "sampler_seed": 0}))
        monkeypatch.chdir(project.path)
        if where == "cluster":
            monkeypatch.setenv("LMABLATE_CLUSTER", loopback.address)
            real = cluster.connect

            def unshared(cfg):
                found = real(cfg)
                found.shared = False
                return found

            monkeypatch.setattr(cluster, "connect", unshared)
        train.run(project.cfg, "arithmetic", "baseline", Path("tokens"), Path("best.json"),
                  Path("ckpt"), Path("history.csv"), Path("grad_stats.csv"))
        results[where] = project.path
    for seed in (0, 1):
        rel = Path("ckpt") / f"seed_{seed}"
        assert (results["local"] / rel / "checkpoint.pt").read_bytes() == (
            results["cluster"] / rel / "checkpoint.pt").read_bytes()
        assert without_timings(json.loads((results["local"] / rel / "result.json").read_text())) \
            == without_timings(json.loads((results["cluster"] / rel / "result.json").read_text()))
        assert not (results["cluster"] / rel / "resume.pt").exists()


@pytest.fixture(scope="module")
def embedded(tmp_path_factory) -> Path:
    """The tiny study, run without a cluster."""
    study = make_study(tmp_path_factory.mktemp("embedded") / "study")
    done = run([str(BIN / "dvc"), "repro"], study, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return study


@pytest.mark.slow
def test_a_study_on_a_loopback_cluster_gives_the_embedded_runs_bytes(loopback, embedded,
                                                                     tmp_path):
    on_cluster = make_study(tmp_path / "cluster")
    start = time.time()
    done = run([str(BIN / "dvc"), "repro"], on_cluster, loopback.address, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    compared = same_results(embedded, on_cluster)
    assert any(p.endswith("checkpoint.pt") for p in compared)
    assert any(p.endswith("best.json") for p in compared)
    assert any(p.endswith("metrics.json") for p in compared)
    # every kind of task ran, on both workers
    stream = loopback.client.get_task_stream(start=start)
    kinds = {r["key"].split("-")[0] for r in stream}
    assert {"tune", "train", "evaluate"} <= kinds
    assert {r["worker"] for r in stream} == {loopback.address_of("w1"), loopback.address_of("w2")}


@pytest.mark.slow
def test_a_study_on_the_cluster_with_postgresql_and_a_tracking_server_gives_the_same_bytes(
        loopback, embedded, postgres, mlflow_server, tmp_path):
    """The stores of a real cluster: the workers write trials to PostgreSQL and runs (with
    their checkpoints) through an MLflow server, none to the workspace's files."""
    from mlflow import MlflowClient
    study = make_study(tmp_path / "study")
    stores = {"LMABLATE_OPTUNA_STORAGE": postgres.create_database("cluster"),
              "MLFLOW_TRACKING_URI": mlflow_server}
    done = run([str(BIN / "dvc"), "repro"], study, loopback.address, stores, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    same_results(embedded, study)
    assert not (study / "optuna.db").exists() and not (study / "mlflow.db").exists()
    client = MlflowClient(tracking_uri=mlflow_server)
    experiment = client.get_experiment_by_name("lmablate")
    # each seed's training run, which the evaluate stage tags final
    runs = client.search_runs([experiment.experiment_id], "tags.stage = 'final'")
    assert len(runs) == 2 * len(SEEDS)  # baseline and rope (no stage re-tunes the baseline)
    for r in runs:
        assert [a.path for a in client.list_artifacts(r.info.run_id, "checkpoint")] == [
            "checkpoint/checkpoint.pt"]


@pytest.mark.slow
def test_a_worker_with_other_cpu_kernels_is_refused_with_one_line(loopback, tmp_path):
    ours = torch.backends.cpu.get_cpu_capability()
    if ours == "DEFAULT":
        pytest.skip("this machine's own kernels are the default ones")
    study = make_study(tmp_path / "study")
    assert run([str(BIN / "dvc"), "repro", "tokenize"], study).returncode == 0
    loopback.start_worker("other", {"ATEN_CPU_CAPABILITY": "default"})
    try:
        done = run([str(BIN / "lmablate"), "tune", "arithmetic", "baseline", "--tokens",
                    "data/tokens/arithmetic", "--best", "best.json", "--trials", "trials.csv"],
                   study, loopback.address, timeout=300)
    finally:
        loopback.kill("other")
    assert done.returncode == 2
    line = done.stderr.strip().splitlines()[-1]
    theirs = run_numerics({"ATEN_CPU_CAPABILITY": "default"})
    # the whole message, as lmablate prints it: one line of at most 300 characters
    assert line == error_line(RuntimeError(
        f"runtime.cluster: worker {line.split()[4]} computes with "
        f"CPU {theirs.removeprefix('cpu ')}, this machine with "
        f"{run_numerics({}).removeprefix('cpu ')}; its results would differ, so it "
        "is refused (start every worker with the same ATEN_CPU_CAPABILITY, or none, "
        "as this machine, from an install of requirements.lock)"))
    assert not (study / "best.json").exists() and not (study / "optuna.db").exists()


def test_workers_without_the_study_s_component_file_are_refused_before_any_task(loopback,
                                                                              tmp_path):
    """The loopback workers run in their own folder (Loopback._start), which holds no
    components/: a study whose variant names one is refused in one line, nothing written; with
    another version of the file there, likewise."""
    study = make_study(tmp_path / "study", {
        "study": {"seeds": SEEDS, "variants": ["baseline", "sq"]},
        "variants": {"sq": {"ffn": "components.squared_relu:SquaredReLU"}}})
    assert run([str(BIN / "dvc"), "repro", "tokenize"], study).returncode == 0
    tune = [str(BIN / "lmablate"), "tune", "arithmetic", "sq", "--tokens",
            "data/tokens/arithmetic", "--best", "best.json", "--trials", "trials.csv"]
    ours = hashlib.sha256((study / "components" / "squared_relu.py").read_bytes()).hexdigest()
    done = run(tune, study, loopback.address, timeout=300)
    assert done.returncode == 2
    line = done.stderr.strip().splitlines()[-1]
    assert re.fullmatch(
        r"lmablate: error: runtime\.cluster: worker tcp://127\.0\.0\.1:\d+ computes with "
        rf"components/squared_relu\.py none \(missing\), this machine with sha256 {ours[:12]}; "
        r"its results would differ, so it is refused \(start every worker in a checkout with "
        r"this machine's components/\)", line), line
    edited = (study / "components" / "squared_relu.py").read_bytes() + b"# edited\n"
    theirs = loopback.folder / "components" / "squared_relu.py"
    theirs.parent.mkdir()
    try:
        theirs.write_bytes(edited)
        done = run(tune, study, loopback.address, timeout=300)
    finally:
        shutil.rmtree(theirs.parent)
    assert done.returncode == 2
    other = hashlib.sha256(edited).hexdigest()
    assert (f"computes with components/squared_relu.py sha256 {other[:12]}, this machine with "
            f"sha256 {ours[:12]}; its results would differ") in done.stderr.strip().splitlines()[-1]
    assert not (study / "best.json").exists() and not (study / "optuna.db").exists()


@pytest.mark.slow
def test_a_worker_killed_mid_task_is_survived_with_the_same_bytes(loopback, tmp_path):
    """Seeds long enough to be caught running: one worker is killed (nanny and all) while it
    trains a seed; the seed trains again on the other worker and the stage ends as a local
    run does."""
    longer = {"train": {"budget_flops": budgets(2000), "eval_interval": 200}}
    best = json.dumps({"lr": 0.01, "d_model": 16, "sampler_seed": 0})
    stage = [str(BIN / "lmablate"), "train", "arithmetic", "baseline", "--tokens",
             "data/tokens/arithmetic", "--best", "best.json", "--checkpoints", "ckpt",
             "--history", "history.csv", "--grad-stats", "grad_stats.csv"]
    studies = {}
    for where in ("local", "cluster"):
        study = studies[where] = make_study(tmp_path / where, longer)
        assert run([str(BIN / "dvc"), "repro", "tokenize"], study).returncode == 0
        (study / "best.json").write_text(best)
    assert run(stage, studies["local"], timeout=600).returncode == 0
    victim = loopback.address_of("w1")
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(LMABLATE_CLUSTER=loopback.address, PATH=f"{BIN}{os.pathsep}{env['PATH']}")
    proc = subprocess.Popen(stage, cwd=studies["cluster"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):  # until w1 is training a seed that has saved a resume state
            running = loopback.client.processing(workers=[victim]).get(victim, [])
            if any(k.startswith("train-") for k in running) and any(
                    (studies["cluster"] / "ckpt").glob("seed_*/resume.pt")):
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        else:
            pytest.fail("no seed was caught running on w1")
        loopback.kill("w1")
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
        loopback.start_worker("w1")  # for the tests after this one
    assert proc.returncode == 0, err[-2000:]
    for seed in SEEDS:
        rel = Path("ckpt") / f"seed_{seed}"
        assert (studies["local"] / rel / "checkpoint.pt").read_bytes() == (
            studies["cluster"] / rel / "checkpoint.pt").read_bytes(), seed
        assert without_timings(json.loads((studies["local"] / rel / "result.json").read_text())) \
            == without_timings(json.loads((studies["cluster"] / rel / "result.json").read_text()))


# ------------------------------------------------------------------ scripts/cluster_busy.py


def _busy_script():
    return load_script(ROOT / "scripts" / "cluster_busy.py")


def test_the_busy_share_is_computing_seconds_over_threads_times_the_wall_clipped_to_it():
    busy = _busy_script().busy_share
    stream = [{"worker": "a", "startstops": [{"action": "compute", "start": 10, "stop": 14},
                                             {"action": "transfer", "start": 14, "stop": 15}]},
              {"worker": "b", "startstops": [{"action": "compute", "start": 8, "stop": 12}]},
              {"worker": "b", "startstops": [{"action": "compute", "start": 18, "stop": 30}]}]
    overall, per_worker = busy(stream, {"a": 1, "b": 1, "c": 2}, 10, 20)
    # a: 4 s of 10; b: 2 (from 10) + 2 (to 20) s of 10; c: idle, 2 threads
    assert per_worker == {"a": 0.4, "b": 0.4, "c": 0.0}
    assert overall == pytest.approx(8 / 40)
    with pytest.raises(ValueError, match="no window"):
        busy(stream, {"a": 1}, 10, 10)


def test_the_busy_script_measures_the_tasks_of_the_command_it_runs(loopback, tmp_path):
    sleeper = ("import distributed, os, time; c = distributed.Client(os.environ["
               "'LMABLATE_CLUSTER']); c.gather(c.map(time.sleep, [0.5] * 4, pure=False))")
    done = run([sys.executable, str(ROOT / "scripts" / "cluster_busy.py"), loopback.address,
                "--report", str(tmp_path / "report.html"), "--", sys.executable, "-c", sleeper],
               tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert re.fullmatch(r"wall \d+\.\d s; 4 tasks \(4 sleep\) on 2 workers, 2 threads", lines[0])
    share = float(re.search(r"busy share (\d+\.\d)%", lines[-1]).group(1))
    assert 10 < share <= 100  # 2 s of sleeping on 2 threads within a few seconds
