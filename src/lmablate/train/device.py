"""The device a stage computes on, and the numeric precision it uses there."""

from __future__ import annotations

import contextlib

import torch

from lmablate.core.validation import fail


def resolve_device(name: str) -> torch.device:
    """``runtime.device`` as a torch device: ``auto`` is CUDA if available, else Apple MPS,
    else the CPU; ``cpu``, ``cuda`` and ``mps`` are taken as given when this machine has them.

    Raises:
        ConfigError: ``cuda`` or ``mps`` was asked for and this machine (or this build of
            torch) has none; stages call this before any work.
    """
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        why = ("no CUDA device is visible" if torch.backends.cuda.is_built()
               else f"torch {torch.__version__} is built without CUDA")
        fail("runtime.device", name, f"{why} on this machine; use auto or cpu")
    if name == "mps" and not torch.backends.mps.is_available():
        fail("runtime.device", name, "Apple's MPS is not available on this machine; use auto or "
             "cpu")
    return torch.device(name)


def autocast(device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 autocast on CUDA (the matmuls in bf16, reductions in fp32); full fp32 elsewhere."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def device_kind(device: torch.device) -> str:
    """The kind of machine ``device`` computes on, as far as it changes a result's bytes: the
    device type with, on a CPU, the kernels PyTorch dispatches to
    (``torch.backends.cpu.get_cpu_capability()``, e.g. ``cpu AVX512``; the environment variable
    ``ATEN_CPU_CAPABILITY`` lowers it) and, on CUDA, the GPU's name (``cuda NVIDIA H200``).

    The same torch wheel and seed give other weights with AVX512, AVX2 or the default kernels
    (other reduction orders), so this enters every training fingerprint and tuning study name,
    and every worker of a cluster must match it (:mod:`lmablate.execution.cluster`)."""
    if device.type == "cpu":
        return f"cpu {torch.backends.cpu.get_cpu_capability()}"
    if device.type == "cuda":
        return f"cuda {torch.cuda.get_device_name(device)}"
    return device.type
