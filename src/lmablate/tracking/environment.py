"""What a result was computed with, recorded beside it.

Two records: :func:`result_environment`, what a result's bytes depend on besides code, settings
and data (the numerics, torch, Python, the lock), written into ``best.json``, ``metrics.json``
and the report, so that equal records on two machines promise equal bytes; and
:func:`environment`, that plus what describes the machine (CPU model, OS, BLAS, package
versions, the git commit), as tags of every MLflow run. The machine's description stays out of
the result files: two machines of equal numerics compute the same bytes, and a commit inside a
result file would make it differ at every commit, so a committed ``dvc.lock`` (itself a later
commit) could never match a fresh clone's.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import platform
import re
import subprocess
from pathlib import Path

from lmablate.core.installed import LOCK
# packages whose versions change results, named in the MLflow tags
PACKAGES = ("torch", "numpy", "scipy", "pandas", "statsmodels", "optuna", "mlflow", "dvc")
# lmablate repro's chains run in copies of the checkout without git: it passes the commit on
COMMIT_ENV = "LMABLATE_GIT_COMMIT"


@functools.lru_cache(maxsize=None)
def lock_hash() -> str | None:
    """First 12 hex digits of the sha256 of ``requirements.lock``; None without one."""
    try:
        return hashlib.sha256(LOCK.read_bytes()).hexdigest()[:12]
    except OSError:
        return None


# What must be equal for two results to be compared (or a best.json to be trained from).
COMPARED = ("numerics", "torch")


def describe(env: dict | None) -> str:
    """A recorded environment as messages show it: ``numerics '...', torch 2.13.0+cpu``."""
    env = env or {}
    return f"numerics {env.get('numerics')!r}, torch {env.get('torch')}"


def same_environment(a: dict | None, b: dict | None) -> bool:
    """Whether two recorded environments agree in :data:`COMPARED` (a record without an
    environment, from before one was kept, agrees with any)."""
    if not a or not b:
        return True
    return all(a.get(k) == b.get(k) for k in COMPARED)


def result_environment(numerics: str) -> dict[str, str | None]:
    """What a result computed with ``numerics`` (:func:`lmablate.train.numerics.numerics_kind` of
    the device, or a cluster's workers') depends on besides code, settings and data:
    ``{"numerics", "torch": version, "python": "3.11", "lock": lock_hash}``."""
    import torch

    return {"numerics": numerics, "torch": torch.__version__,
            "python": ".".join(platform.python_version_tuple()[:2]), "lock": lock_hash()}


@functools.lru_cache(maxsize=None)
def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, ``sysctl`` on macOS), else
    ``platform.processor()``."""
    try:
        text = Path("/proc/cpuinfo").read_text()
        match = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
        if match:
            return match[1].strip()
    except OSError:
        pass
    try:
        return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                              text=True, timeout=5, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return platform.processor() or "unknown"


def blas() -> str:
    """The BLAS torch was built with (``BLAS_INFO`` of ``torch.__config__.show()``)."""
    import torch

    match = re.search(r"BLAS_INFO=([^,\s]+)", torch.__config__.show())
    return match[1] if match else "unknown"


# What DVC sets for the stages of `dvc exp run` (dvc.env): the commit the experiment started from
# and the experiment's name.
DVC_EXP_BASELINE = "DVC_EXP_BASELINE_REV"
DVC_EXP_NAME = "DVC_EXP_NAME"


def git_commit() -> str | None:
    """The checkout's commit (``git rev-parse HEAD`` in the working folder, with ``-modified``
    when tracked files differ from it), or :data:`COMMIT_ENV`'s value where ``lmablate repro``
    set it; None outside git."""
    if os.environ.get(COMMIT_ENV):
        return os.environ[COMMIT_ENV]
    if os.environ.get(DVC_EXP_BASELINE):  # a DVC experiment: its copy's HEAD is DVC's stash
        return os.environ[DVC_EXP_BASELINE]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        # dvc.lock left out: dvc repro rewrites it as it goes, and that is no change of the code
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                                ".", ":(exclude)dvc.lock"],
                               capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("-modified" if dirty.strip() else "")


@functools.lru_cache(maxsize=None)
def environment(numerics: str) -> dict[str, str | None]:
    """:func:`result_environment` and the machine's description: ``cpu`` model, ``os``
    (``platform.platform()``), ``blas``, ``git_commit``, and each of :data:`PACKAGES`'s
    version as ``version.<name>``."""
    out = {**result_environment(numerics), "cpu": cpu_model(), "os": platform.platform(),
           "blas": blas(), "git_commit": git_commit()}
    for name in PACKAGES:
        try:
            out[f"version.{name}"] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[f"version.{name}"] = None
    return out


_numerics: list[str] = []  # the numerics this process computes with, once a stage resolved them


def use_numerics(numerics: str) -> None:
    """Record ``numerics`` (:func:`lmablate.train.numerics.numerics_kind` of the device the stage's
    jobs compute on, or of a cluster's workers) for :func:`run_tags`."""
    _numerics[:] = [numerics]


def run_tags() -> dict[str, str]:
    """:func:`environment` as MLflow tags: ``lmablate.<key>`` each, and the commit also as
    MLflow's own ``mlflow.source.git.commit`` (without ``-modified``). The numerics are those of
    :func:`use_numerics`, else the CPU's."""
    if not _numerics:
        import torch

        from lmablate.train.numerics import numerics_kind
        use_numerics(numerics_kind(torch.device("cpu")))
    env = environment(_numerics[0])
    tags = {f"lmablate.{k}": str(v) for k, v in env.items() if v is not None}
    if env["git_commit"]:
        tags["mlflow.source.git.commit"] = env["git_commit"].removesuffix("-modified")
    if os.environ.get(DVC_EXP_NAME):  # `dvc exp run`: the experiment's name, as dvc exp show has it
        tags["lmablate.dvc_experiment"] = os.environ[DVC_EXP_NAME]
    return tags
