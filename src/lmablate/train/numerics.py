"""A measured fingerprint of the numerics a device computes with.

The same code, data and seed give other bytes where PyTorch dispatches to other kernels: another
CPU capability (``ATEN_CPU_CAPABILITY``), another BLAS or oneDNN build, another torch release,
another GPU. :func:`lmablate.train.device.device_kind` names the capability, but two machines that
share a name ("cpu AVX512") can still round differently. So this computes a small, fixed piece
of what training computes (forward, cross-entropy, backward and fused AdamW steps of two tiny
GPTs, the baseline's blocks and llama's, at the study's batch and context) on the device and
hashes the resulting bytes: machines with equal fingerprints computed these the same, bit for
bit; different fingerprints say that results will differ.

It runs on one thread, so it does not depend on the process's thread count (results of the
study do not either: see :mod:`lmablate.execution.parallel`), and in ~0.1 s on a CPU, once per
process and device.

The host's numpy counts too (:func:`host_numerics`): the tuner's sampler (Optuna's TPE) runs in
numpy on the host whatever the device, and numpy picks SIMD kernels and an OpenBLAS kernel by
CPU. Two machines whose torch probe agreed (``cpu AVX2``, one pinned by
``ATEN_CPU_CAPABILITY=avx2`` on an AVX-512 CPU) proposed other trials from the same results, so
the fingerprint names numpy's kernels as well.
"""

from __future__ import annotations

import functools
import hashlib

import torch

from lmablate.config.study import ModelConfig
from lmablate.model.gpt import GPT

PROBES = (  # the default study's widths, context and batch; the baseline's and llama's blocks
    ModelConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=4, context_length=64),
    ModelConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=4, context_length=64,
                ffn="swiglu", norm="rmsnorm", position="rope"),
)
STEPS = 3
BATCH = 16


@functools.lru_cache(maxsize=None)
def numerics_fingerprint(device: torch.device) -> str:
    """12 hex digits of the sha256 of the torch version, :func:`host_numerics` and the losses and
    final weights of :data:`PROBES`, each trained :data:`STEPS` AdamW steps (the fused kernel the study's
    optimizer uses on a CPU and CUDA, :func:`_adamw`) on fixed random tokens on ``device``
    with one thread; the global RNG and thread count are restored. Equal on every run on one
    machine and install; it changes with the kernels (e.g. ``ATEN_CPU_CAPABILITY=avx2`` on an
    AVX512 CPU)."""
    threads = torch.get_num_threads()
    digest = hashlib.sha256(torch.__version__.encode())  # another release: other numerics
    digest.update(host_numerics().encode())
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.set_num_threads(1)
        try:
            for cfg in PROBES:
                torch.manual_seed(0)
                model = GPT(cfg).to(device)
                params = list(model.parameters())
                moments = [torch.zeros_like(p) for p in params], [torch.zeros_like(p)
                                                                   for p in params]
                gen = torch.Generator().manual_seed(1)
                for step in range(1, STEPS + 1):
                    idx = torch.randint(0, cfg.vocab_size, (BATCH, cfg.context_length + 1),
                                        generator=gen).to(device)
                    _, loss = model(idx[:, :-1], idx[:, 1:])
                    model.zero_grad(set_to_none=True)
                    loss.backward()
                    _adamw(params, moments, step, device)
                    digest.update(loss.detach().float().cpu().numpy().tobytes())
                for p in params:
                    digest.update(p.detach().float().cpu().numpy().tobytes())
        finally:
            torch.set_num_threads(threads)
    return digest.hexdigest()[:12]


@functools.lru_cache(maxsize=None)
def host_numerics() -> str:
    """What numpy computes with on this host, e.g. ``numpy 2.4.6 baseline(X86_V2) X86_V3 X86_V4;
    openblas 0.3.31.188.0 SkylakeX``: its version, the SIMD targets its functions dispatch to
    (``numpy.lib.introspect.opt_func_info``; ``NPY_DISABLE_CPU_FEATURES`` removes some) and
    each BLAS that numpy and scipy load, with the kernel it chose for this CPU (threadpoolctl;
    ``OPENBLAS_CORETYPE`` pins OpenBLAS's). scipy's is loaded here, so that the list does not
    depend on what the process imported before."""
    import numpy as np
    import scipy.linalg  # noqa: F401 - loads scipy's BLAS, which Optuna's sampler may use
    from numpy.lib.introspect import opt_func_info
    from threadpoolctl import threadpool_info

    targets = sorted({t["current"] for sigs in opt_func_info().values() for t in sigs.values()})
    blas = sorted(f"{i['internal_api']} {i.get('version')} {i.get('architecture')}"
                  for i in threadpool_info() if i.get("user_api") == "blas")
    return "; ".join([f"numpy {np.__version__} {' '.join(targets)}", *blas])


def numerics_kind(device: torch.device) -> str:
    """What a result's bytes depend on besides code, settings and data: the device kind
    (:func:`lmablate.train.device.device_kind`) and :func:`numerics_fingerprint`, e.g. ``cpu AVX512
    numerics 6f1286420fc4``. It enters every training fingerprint and Optuna study name, and a
    cluster's workers must share it (:mod:`lmablate.execution.cluster`)."""
    from lmablate.train.device import device_kind
    return f"{device_kind(device)} numerics {numerics_fingerprint(device)}"


@torch.no_grad()
def _adamw(params: list, moments: tuple[list, list], step: int, device: torch.device) -> None:
    """One AdamW step (Loshchilov & Hutter 2019; lr 1e-2, betas (0.9, 0.99), weight decay 0.1)
    of ``params`` with their ``moments``, by the kernel ``torch.optim.AdamW(fused=True)`` calls
    on a CPU or CUDA, and by PyTorch's formula elsewhere. Called directly, as the optimizer
    class would import ``torch._dynamo`` (about 1 s) before its first step."""
    lr, beta1, beta2, decay, eps = 1e-2, 0.9, 0.99, 0.1, 1e-8
    grads = [p.grad for p in params]
    if device.type in ("cpu", "cuda"):
        steps = [torch.tensor(float(step), device=device) for _ in params]
        torch._fused_adamw_(params, grads, moments[0], moments[1], [], steps, lr=lr,
                            beta1=beta1, beta2=beta2, weight_decay=decay, eps=eps,
                            amsgrad=False, maximize=False)
        return
    for p, g, m, v in zip(params, grads, *moments):
        p.mul_(1 - lr * decay)
        m.lerp_(g, 1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        denom = (v / (1 - beta2 ** step)).sqrt_().add_(eps)
        p.addcdiv_(m, denom, value=-lr / (1 - beta1 ** step))
