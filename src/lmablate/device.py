"""The device a stage computes on, and the numeric precision it uses there."""

from __future__ import annotations

import contextlib

import torch


def resolve_device(name: str) -> torch.device:
    """``runtime.device`` as a torch device: ``auto`` is CUDA if available, else Apple MPS,
    else the CPU; ``cpu``, ``cuda`` and ``mps`` are taken as given."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    return torch.device(name)


def autocast(device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 autocast on CUDA (the matmuls in bf16, reductions in fp32); full fp32 elsewhere."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)
