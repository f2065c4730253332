"""Shared helpers of the benchmarks: machine description, timing, matmul peak, benchmark data.

Every benchmark prints :func:`machine_header` first, times with ``time.perf_counter`` after
warm-up iterations, and reports ratios against a reference measured in the same process, so the
numbers are comparable only within one run on one machine. Nothing here asserts on timings.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

# The stages' tqdm bars would interleave with the report; tqdm reads this when it is imported.
os.environ.setdefault("TQDM_DISABLE", "1")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]  # the repository root (/work/main)
if str(ROOT / "src") not in sys.path:  # works without `pip install -e .` too
    sys.path.insert(0, str(ROOT / "src"))

from lmablate.config import study as lconfig  # noqa: E402
from lmablate.config import params as lparams  # noqa: E402
from lmablate.train.device import resolve_device  # noqa: E402


# ------------------------------------------------------------------------------------ machine


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else platform's best guess."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def device_name(device: torch.device) -> str:
    """``device``'s type, with the GPU's model name on CUDA."""
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return device.type


def machine_header(title: str, device: torch.device) -> str:
    """A few lines naming the benchmark, the machine, the software and the device."""
    lines = [
        f"== {title} ==",
        f"machine : {cpu_model()}, {os.cpu_count()} logical cores, {platform.system()} "
        f"{platform.release()}",
        f"software: Python {platform.python_version()}, torch {torch.__version__} "
        f"({torch.get_num_threads()} intra-op threads)",
        f"device  : {device_name(device)}  (lmablate.train.device.resolve_device('auto'))",
    ]
    if hasattr(os, "getloadavg"):
        lines.append(f"load    : {os.getloadavg()[0]:.2f} (1-min load average at the start; "
                     "other processes on the machine add noise, so best-of times are shown too)")
    return "\n".join(lines)


def auto_device() -> torch.device:
    """The device the pipeline picks by default (CUDA, then MPS, then CPU)."""
    return resolve_device("auto")


# ------------------------------------------------------------------------------------- timing


def sync(device: torch.device) -> None:
    """Wait for queued device work, so that wall-clock timings include it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def time_call(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds one call of ``fn`` takes, device work included."""
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def repeat(fn: Callable[[], object], device: torch.device, repeats: int,
           warmup: int = 1) -> list[float]:
    """``warmup`` untimed calls, then the seconds of each of ``repeats`` timed calls."""
    for _ in range(warmup):
        fn()
    return [time_call(fn, device) for _ in range(repeats)]


def interleaved(fns: dict[str, Callable[[], object]], device: torch.device, repeats: int,
                warmup: int = 1) -> dict[str, list[float]]:
    """Like :func:`repeat` for several functions, run A B A B ... so that slow drift of the
    machine (other load, clock changes) affects every contender alike."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(time_call(fn, device))
    return times


def median(xs: list[float]) -> float:
    """The median of ``xs`` (e.g. seconds)."""
    return statistics.median(xs)


def fmt_seconds(xs: list[float]) -> str:
    """median [min..max] of timings, in s or ms."""
    med, lo, hi = statistics.median(xs), min(xs), max(xs)
    if med < 1.0:
        return f"{med * 1e3:.1f} ms [{lo * 1e3:.1f}..{hi * 1e3:.1f}]"
    return f"{med:.2f} s [{lo:.2f}..{hi:.2f}]"


def matmul_peak_flops(device: torch.device, dtype: torch.dtype = torch.float32,
                      sizes: tuple[int, ...] = (1024, 2048), repeats: int = 8) -> tuple[float, int]:
    """Best measured FLOP/s of an n x n @ n x n matmul (2 n^3 FLOPs) over ``sizes`` and
    ``repeats``: the machine's practical peak for ``dtype``. Returns (FLOP/s, best n)."""
    best, best_n = 0.0, sizes[0]
    for n in sizes:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        times = repeat(lambda a=a, b=b: a @ b, device, repeats, warmup=2)
        rate = 2 * n**3 / min(times)
        if rate > best:
            best, best_n = rate, n
    return best, best_n


# --------------------------------------------------------------------------------- study data


def profile_config(name: str) -> lconfig.StudyConfig:
    """Profile ``name`` of conf/profile/ as ``dvc exp run -S profile=<name>`` composes it."""
    import yaml
    from lmablate.config.profiles import compose

    return lparams.parse(yaml.safe_load(compose(ROOT, name)))


def load_default_config(**tracking_changes) -> lconfig.StudyConfig:
    """params.yaml (the default profile) with MLflow tracking disabled."""
    cfg = lparams.load(ROOT / "params.yaml")
    return dataclasses.replace(cfg, tracking=dataclasses.replace(cfg.tracking, enabled=False,
                                                                 **tracking_changes))


def merge(base: dict, changes: dict) -> dict:
    """``base`` with ``changes`` merged in, nested mappings key by key (neither is modified)."""
    out = dict(base)
    for key, value in changes.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(
            out.get(key), dict) else value
    return out


# A study small enough for a smoke run of a benchmark (``--smoke``): 2 seeds, a one-layer
# d_model 16 model with context 16, 8 training steps at that width, tuning of 2 + 1 trials of
# 4 and 8 steps, evaluation of 8 arithmetic problems. Only the sizes change; the code is the
# pipeline's. ``TINY_TRAIN_STEPS`` training steps at d_model 16 buy the budget below.
# a context of 24 holds one 21-character problem of the default format (fields of 5)
TINY_MODEL = {"context_length": 24, "n_layers": 1, "n_heads": 2, "d_model": 16}
TINY_BATCH = 4
TINY_TRAIN_STEPS = 8
TINY = {
    "study": {"seeds": [0, 1], "variants": ["baseline"], "datasets": ["arithmetic"]},
    # the tiny model's window and batch, not the default arithmetic's own 16 x 64
    "datasets": {"arithmetic": {"n_train": 2000, "n_test": 16, "context_length": None,
                                "batch_size": None, "length_digits": [3, 4]}},
    "model": TINY_MODEL,
    "train": {"eval_interval": 4, "eval_iters": 1, "warmup_fraction": 0.0,
              "batch_size": TINY_BATCH},
    "tune": {"rungs": [[2, 0.5], [1, 1.0]], "trials_per_batch": 2, "reports": 2,
             "min_steps": 2, "d_model_choices": [16]},
    "evaluate": {"max_batches": 1, "batch_size": 8, "max_problems": 8, "n_samples": 1,
                 "sample_tokens": 8},
}


def tiny_params(raw: dict) -> dict:
    """The raw params mapping ``raw`` (params.yaml as YAML reads it) cut down to :data:`TINY`,
    with a training budget of :data:`TINY_TRAIN_STEPS` steps at the tiny width."""
    from lmablate.model.gpt import flops_per_token

    flops = TINY_TRAIN_STEPS * TINY_BATCH * TINY_MODEL["context_length"] * flops_per_token(
        lconfig.ModelConfig(**TINY_MODEL))
    return merge(merge(raw, TINY), {"train": {"budget_flops": {"arithmetic": float(flops)}}})


def load_tiny_config() -> lconfig.StudyConfig:
    """params.yaml cut down by :func:`tiny_params` (arithmetic only), tracking disabled: the
    study of the benchmarks' ``--smoke`` runs."""
    import yaml

    raw = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    cfg = lparams.parse(tiny_params(raw))
    return dataclasses.replace(cfg, tracking=dataclasses.replace(cfg.tracking, enabled=False))


def arithmetic_data(cfg: lconfig.StudyConfig, workdir: Path, n_test: int | None = None) -> Path:
    """Raw and token files of the study's arithmetic dataset, generated afresh in ``workdir``
    (seeded, ~0.1 s at the default size); ``n_test`` overrides the number of test problems.

    Returns the dataset directory holding ``raw/`` (corpus.txt, test.txt) and ``tokens/``.
    """
    from lmablate.stages import generate, tokenize

    ds = cfg.datasets.get("arithmetic") or lconfig.DatasetConfig(name="arithmetic",
                                                                  kind="arithmetic")
    if n_test is not None:
        ds = dataclasses.replace(ds, n_test=n_test)
    out = Path(workdir) / "arithmetic"
    generate.run(ds, out / "raw")
    tokenize.run(ds, out / "raw", out / "tokens")
    return out


def pipeline_tokens(dataset: str, workdir: Path) -> Path | None:
    """A private copy of the pipeline's ``data/tokens/<dataset>`` (read-only use of the
    original), or None when the pipeline has not produced it."""
    src = ROOT / "data" / "tokens" / dataset
    if not (src / "meta.json").is_file():
        return None
    dst = Path(workdir) / f"{dataset}-tokens"
    shutil.copytree(src, dst)
    return dst


# ------------------------------------------------------------------------------- GPU busy share


class GpuBusy:
    """The share of wall time a CUDA GPU was busy, sampled from NVML while a ``with`` block runs.

    NVML's utilisation rate (``nvmlDeviceGetUtilizationRates(...).gpu``, what ``nvidia-smi``
    prints as GPU-Util) is the percentage of its last sample period (1/6 s to 1 s, by the
    driver) during which at least one kernel was running; the samples taken every
    ``interval`` seconds are averaged. It says nothing of how much of the GPU a kernel used:
    a launch-bound loop of tiny kernels reads as busy only while a kernel is in flight.
    ``share`` is None where NVML (the ``nvidia-ml-py`` package) or a CUDA device is missing."""

    def __init__(self, device: torch.device, interval: float = 0.05):
        self.device, self.interval = device, interval
        self.samples: list[int] = []
        self.share: float | None = None

    def __enter__(self) -> "GpuBusy":
        import threading

        self._stop = threading.Event()
        self._thread = None
        if self.device.type != "cuda":
            return self
        try:
            import pynvml

            pynvml.nvmlInit()
            index = self.device.index if self.device.index is not None else torch.cuda.current_device()
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception:  # noqa: BLE001 - no NVML: no share, the benchmark goes on
            return self

        def sample() -> None:
            while not self._stop.wait(self.interval):
                self.samples.append(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            if self.samples:
                self.share = statistics.mean(self.samples) / 100.0

    def __str__(self) -> str:
        return "n/a" if self.share is None else f"{100 * self.share:.0f}%"
