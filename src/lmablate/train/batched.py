"""The seeds of one model config trained as one batched model: S GPTs in a single forward.

:func:`train_seeds` does what :func:`~lmablate.train.training.train_model` does for each of S seeds,
but with the S models' parameters stacked along a leading seed axis and the forward run through
``torch.func.vmap(functional_call(...))``: one kernel launch per layer op for all seeds instead
of S, which is what keeps a GPU busy with models this small. Every seed keeps its own
initialisation, batch order, gradient clipping and divergence check, so each seed's trajectory
equals ``train_model`` for that seed alone up to fp32 rounding (batched matmuls may sum in another
order; ``tests/test_batched.py``), not bit for bit. :func:`batched_on` is the one rule that says
where the train stage uses this path.

Shapes: S seeds, B batch, T tokens; a stacked parameter is (S, *shape of the seed's parameter).
Losses are mean cross-entropy in nats per token, per seed.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch.func import functional_call, stack_module_state, vmap
from torch.nn.attention import SDPBackend, sdpa_kernel

from lmablate.config.study import ModelConfig, TrainConfig
from lmablate.core import interrupt
from lmablate.core.tracker import NullTracker, RunTracker
from lmablate.data.token_data import TokenData, batch_starts, get_batch
from lmablate.model.gpt import GLOBAL_RNG_LOCK, GPT
from lmablate.train.checkpoint import load_resume
from lmablate.train.device import autocast
from lmablate.train.loop import TrainResult, train_loop
from lmablate.train.training import (VAL_BATCH_SEED, decayed_parameter_names, make_optimizer,
                               make_scheduler)


def batched_on(device: torch.device) -> bool:
    """Whether the train stage trains a variant's seeds with :func:`train_seeds` on ``device``.

    A fixed function of the device type (part of every seed's fingerprint), never a runtime
    setting: the two paths agree only to fp32 rounding, and a result must not depend on how
    fast it was computed. On the CPU, seeds as threads win (``benchmarks/bench_batched_seeds.py``:
    vmap's batched kernels gain nothing on a few cores that threads do not already use); on an
    accelerator one small model leaves the device mostly idle, so the seeds go together.
    """
    return device.type in ("cuda", "mps")


_BACKEND_LOCK = threading.Lock()
_backend = {"users": 0, "context": None}  # the shared sdpa_kernel context and its active users


@contextlib.contextmanager
def _attention_backend(device: torch.device):
    """SDPA's math backend for the vmapped forward, on every device. It is made of matmuls and
    a softmax, which batch over the seed axis. The fused kernels do not: SDPA's CPU flash kernel
    has no vmap batching rule (vmap would run it once per seed in a Python loop), and on CUDA
    (torch 2.11, H100) the memory-efficient kernel's batching rule fails in backward ("LSE is
    not correctly aligned (strideH)") and rejects an attention bias ("attn_bias: wrong shape
    (batch dimension)", ALiBi); flash needs head sizes that are multiples of 8. At these sizes
    the (S, B, heads, T, T) scores the math backend materialises are a few MB per layer.

    ``sdpa_kernel``'s backend flags are process-wide, not per thread, and its exit restores
    what it found: of two threads that enter and leave it at different times, one would leave
    the other running under all backends (and vmap over the CPU flash kernel). So the first of
    the concurrent users enters it and the last leaves it. Other SDPA calls in the process
    meanwhile use the math backend as well: the pipeline never runs ``train_seeds`` beside
    other training in one process (a train stage trains one variant)."""
    with _BACKEND_LOCK:
        if _backend["users"] == 0:
            _backend["context"] = sdpa_kernel([SDPBackend.MATH])
            _backend["context"].__enter__()
        _backend["users"] += 1
    try:
        yield
    finally:
        with _BACKEND_LOCK:
            _backend["users"] -= 1
            if _backend["users"] == 0:
                _backend["context"].__exit__(None, None, None)


def make_stacked_optimizer(params: dict[str, torch.Tensor], cfg: TrainConfig, lr: float,
                           device: torch.device, decayed: set[str]) -> torch.optim.AdamW:
    """AdamW over stacked (S, ...) parameters, grouped as
    :func:`~lmablate.train.training.make_optimizer` groups one seed's: weight decay on the
    parameters named in ``decayed`` (the seed model's
    :func:`~lmablate.train.training.decayed_parameter_names`: Linear weight matrices) only, in the
    same two groups in the same order. AdamW is elementwise, so each seed's slice takes the step it
    would take alone. Parameters keep ``params``' order (that of ``model.parameters()``), so
    the state of parameter i is the state of the single-seed optimizer's parameter i."""
    groups = [{"params": [p for n, p in params.items() if n in decayed],
               "weight_decay": cfg.weight_decay},
              {"params": [p for n, p in params.items() if n not in decayed],
               "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(cfg.beta1, cfg.beta2),
                             fused=device.type in ("cuda", "cpu"))


@torch.no_grad()
def clip_grad_norm_per_seed_(grads: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Clip each seed's gradients in place as ``torch.nn.utils.clip_grad_norm_`` would clip that
    seed's alone: total 2-norm over all of the seed's gradients, scaled by
    min(1, max_norm / (norm + 1e-6)).

    Args:
        grads: stacked gradients, each (S, ...).
    Returns:
        the seeds' total norms before clipping, (S,).
    """
    norms = torch.stack([torch.linalg.vector_norm(g.flatten(1), 2, dim=1) for g in grads])  # (P,S)
    total = torch.linalg.vector_norm(norms, 2, dim=0)  # (S,)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef.view(-1, *([1] * (g.dim() - 1))))
    return total


def _seed_optimizer_state(stacked: dict, s: int) -> dict:
    """Seed ``s``'s slice of a stacked AdamW ``state_dict()``, in the single-seed format (cloned,
    so that saving it does not save every seed's storage)."""
    state = {i: {k: v if k == "step" else v[s].clone() for k, v in st.items()}
             for i, st in stacked["state"].items()}
    return {"state": state, "param_groups": stacked["param_groups"]}


def _stack_optimizer_states(states: list[dict]) -> dict:
    """Single-seed AdamW ``state_dict()``s (same step) stacked into one for the stacked
    optimizer."""
    first = states[0]
    state = {i: {k: v if k == "step" else torch.stack([s["state"][i][k] for s in states])
                 for k, v in st.items()}
             for i, st in first["state"].items()}
    return {"state": state, "param_groups": first["param_groups"]}


def train_seeds(model_cfg: ModelConfig, cfg: TrainConfig, data: TokenData, *, seeds: list[int],
                lr: float, steps: int, device: torch.device,
                trackers: list[RunTracker] | None = None, desc: str = "train",
                resume_paths: list[Path] | None = None, fingerprints: list[str] | None = None,
                resume_meta: list[dict] | None = None,
                cuda_graph: bool | None = None,
                probe: Callable[[GPT], dict[str, float]] | None = None) -> list[TrainResult]:
    """Train one GPT per seed in ``seeds`` for ``steps`` steps, all seeds in one batched model.

    Each seed gets what :func:`~lmablate.train.training.train_model` gives it: the same initial
    weights, training batches, learning-rate schedule, clipping, history rows, validation batches,
    gradient statistics and resume states; one :class:`~lmablate.train.loop.TrainResult` per seed,
    in ``seeds``' order. ``train_seconds`` of a seed is the wall time of the batched run it was
    part of, so its ``tokens_per_second`` counts its own tokens only.

    ``trackers[i]`` receives seed i's metrics (it must log to that seed's run, see
    :meth:`lmablate.core.tracker.Tracker.open_run`). With ``resume_paths``, seed i's state is
    saved to ``resume_paths[i]`` at every eval interval in ``train_model``'s format, tagged
    ``fingerprints[i]`` with ``resume_meta[i]``; a saved state with that fingerprint is resumed,
    by this function or by ``train_model``. Seeds whose states stand at the same step train
    together; seeds at different steps (or without a state) train as separate groups, one group
    after another.

    ``cuda_graph``: replay each step's forward + backward as a CUDA graph (default:
    :func:`uses_cuda_graph`, i.e. on CUDA); False runs the same kernels eagerly. ``probe``:
    as :func:`~lmablate.train.training.train_model`'s, on each seed's model.

    Raises:
        ValueError: ``model_cfg.dropout`` > 0 (masks would come from the process-wide RNG, not
            per seed; use ``train_model``), or the per-seed lists differ in length from ``seeds``.
        DivergenceError: a seed's training loss is NaN/inf (names the seed, step and lr; the
            first such step, and the first such seed in ``seeds``' order at it). Losses are read
            at each evaluation, so it is raised there, before that evaluation is recorded.
        Interrupted: the stage was asked to stop (:mod:`lmablate.core.interrupt`, checked
            before every step and validation chunk); the states saved at the last evaluation stay.
    """
    if model_cfg.dropout > 0:
        raise ValueError(f"train_seeds does not support dropout ({model_cfg.dropout}): its masks "
                         "come from the process-wide RNG; train each seed with train_model")
    n = len(seeds)
    trackers = trackers or [NullTracker() for _ in seeds]
    resume_paths = resume_paths or [None] * n
    fingerprints = fingerprints or [""] * n
    resume_meta = resume_meta or [{} for _ in seeds]
    for name, values in (("trackers", trackers), ("resume_paths", resume_paths),
                         ("fingerprints", fingerprints), ("resume_meta", resume_meta)):
        if len(values) != n:
            raise ValueError(f"{name} has {len(values)} entries for {n} seeds")

    states = [load_resume(p, fp) for p, fp in zip(resume_paths, fingerprints)]
    groups: dict[int, list[int]] = {}
    for i, state in enumerate(states):
        groups.setdefault(state["step"] if state else 0, []).append(i)
    results: list[TrainResult | None] = [None] * n
    for at in sorted(groups):
        idx = groups[at]
        for i, result in zip(idx, _train_group(
                model_cfg, cfg, data, seeds=[seeds[i] for i in idx], lr=lr, steps=steps,
                device=device, trackers=[trackers[i] for i in idx], desc=desc,
                resume_paths=[resume_paths[i] for i in idx],
                fingerprints=[fingerprints[i] for i in idx],
                resume_meta=[resume_meta[i] for i in idx], states=[states[i] for i in idx],
                cuda_graph=cuda_graph, probe=probe)):
            results[i] = result
    return results  # type: ignore[return-value]


# Validation batches per vmapped forward: VAL_CHUNK of them stacked into one (VAL_CHUNK * B, T)
# batch. Evaluation is forward only and its launches cost more than its arithmetic at these
# sizes, so 200 batches go in 25 forwards. Fixed here, never derived from free memory: a
# mean over a chunk rounds differently from a mean of batch means (same value to fp32 rounding).
VAL_CHUNK = 8


def uses_cuda_graph(device: torch.device) -> bool:
    """Whether :func:`train_seeds` replays its forward + backward + clipping as a CUDA graph on
    ``device`` (CUDA only). The graph replays the kernels that the eager step launches, so the
    results are the eager step's bit for bit (``tests/test_gpu.py``, run on a GPU); what it saves is
    the launch overhead of ~1,000 small kernels per step, which at these model sizes is most of a
    step's time."""
    return device.type == "cuda"


class GroupStepper:
    """The :class:`~lmablate.train.loop.Stepper` of S seeds trained as one batched model: their
    parameters stacked (S, ...), the forward ``vmap(functional_call(...))``, one stacked AdamW
    and schedule, per-seed clipping; with ``graphed``, forward + backward + clipping replayed
    as a CUDA graph (:func:`_graphed`), else run eagerly.

    It never waits for the device between evaluations: the window starts of every step of a
    segment are drawn ahead from each seed's generator (the draws
    :func:`~lmablate.data.token_data.get_batch` makes, in the same order) and sent in one copy, the
    windows are gathered on the device from the training split held there, and the step's
    losses go to a device buffer that :meth:`segment_losses` reads.

    ``states`` (all None, or all at one step, in ``train_model``'s layout) are applied.
    """

    names_seeds = True

    def __init__(self, model_cfg: ModelConfig, cfg: TrainConfig, data: TokenData, *,
                 seeds: list[int], lr: float, steps: int, device: torch.device,
                 states: list[dict | None], graphed: bool):
        S, T, B = len(seeds), model_cfg.context_length, cfg.batch_size
        self.seeds, self.cfg, self.data, self.device, self.lr_peak = seeds, cfg, data, device, lr
        self.S, self.T, self.B = S, T, B
        models = []
        for seed, state in zip(seeds, states):
            with GLOBAL_RNG_LOCK:  # train_model's initialisation, seed by seed
                torch.manual_seed(seed)
                model = GPT(model_cfg).to(device)
            if state is not None:
                model.load_state_dict(state["model"])
            models.append(model)
        # Stacked leaves (S, ...); tied weights appear once, functional_call re-ties them. The
        # non-persistent buffers (position tables, ALiBi slopes) are the same for every seed
        # and are read from ``base``.
        params, _ = stack_module_state(models)
        base = models[0]
        self.seed_models, self.params, self.base = models, params, base

        def seed_loss(p: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return functional_call(base, p, (x, y))[1]

        train_loss = vmap(seed_loss, in_dims=(0, 0, 0))  # (S,B,T) batches -> (S,)
        self.val_loss = vmap(seed_loss, in_dims=(0, None, None))  # shared (b,T) batch -> (S,)
        opt = make_stacked_optimizer(params, cfg, lr, device, decayed_parameter_names(base))
        self.opt, self.sched = opt, make_scheduler(opt, cfg, steps)
        self.g_train = [torch.Generator().manual_seed(seed) for seed in seeds]
        g_val = torch.Generator().manual_seed(VAL_BATCH_SEED)
        self.val_x, self.val_y = (torch.stack(t) for t in zip(*(
            get_batch(data.val, B, T, g_val, device, data.stride)
            for _ in range(cfg.eval_iters))))  # (n,B,T)
        # the training split on the device, as int32 (half of int64's memory); windows are
        # gathered from it by start offset
        train_tokens = torch.from_numpy(np.asarray(data.train, dtype=np.int32)).to(device)
        window = torch.arange(T + 1, device=device)
        if states[0] is not None:
            opt.load_state_dict(_stack_optimizer_states([s["optimizer"] for s in states]))
            self.sched.load_state_dict(states[0]["scheduler"])  # the same lr at the same step
            for i, state in enumerate(states):
                self.g_train[i].set_state(state["rng_train"])
            # No dropout here, so the process-wide RNG (train_model restores it for dropout) is
            # never drawn from and is left alone.

        def forward_backward(batch_starts_: torch.Tensor) -> torch.Tensor:
            """One step's losses (S,) from window starts (S, B), gradients in ``params``' .grad,
            clipped per seed."""
            windows = train_tokens[batch_starts_.unsqueeze(-1) + window].long()  # (S, B, T+1)
            with autocast(device), _attention_backend(device):
                losses = train_loss(params, windows[..., :-1], windows[..., 1:])  # (S,)
            # Seeds share no parameter, so d(sum)/d(seed s's slice) is seed s's own gradient.
            losses.sum().backward()
            if cfg.grad_clip:
                clip_grad_norm_per_seed_([p.grad for p in params.values()], cfg.grad_clip)
            return losses

        if graphed:
            step_fn = _graphed(forward_backward,
                               torch.zeros(S, B, dtype=torch.long, device=device), opt, device)
        else:
            def step_fn(batch_starts_: torch.Tensor) -> torch.Tensor:
                opt.zero_grad(set_to_none=True)
                return forward_backward(batch_starts_)
        self.step_fn = step_fn

    def begin_segment(self, first: int, last: int) -> None:
        """Draw the window starts of steps ``first`` to ``last`` for every seed, (n, S, B),
        send them to the device in one copy, and make the segment's loss buffer (n, S)."""
        drawn = torch.stack([torch.stack([batch_starts(len(self.data.train), self.B, self.T, g,
                                                       self.data.stride)
                                          for g in self.g_train])
                             for _ in range(first, last + 1)])  # (n, S, B)
        if self.device.type == "cuda":
            drawn = drawn.pin_memory()
        self.seg_first = first
        self.seg_starts = drawn.to(self.device, non_blocking=True)
        self.seg_losses = torch.empty(len(drawn), self.S, device=self.device)

    def step(self, step: int) -> None:
        """One batched step; its losses (S,) go to the segment's buffer, unread (None)."""
        losses = self.step_fn(self.seg_starts[step - self.seg_first])
        self.seg_losses[step - self.seg_first].copy_(losses.detach())
        self.opt.step()
        self.sched.step()

    def segment_losses(self) -> list[list[float]]:
        """The segment's loss buffer, (n, S): the segment's only wait for the device."""
        return self.seg_losses.tolist()

    @torch.no_grad()
    def evaluate(self) -> list[float]:
        """Each seed's mean validation loss over the ``eval_iters`` fixed batches, in vmapped
        forwards of :data:`VAL_CHUNK` batches."""
        S, device, val_x, val_y = self.S, self.device, self.val_x, self.val_y
        self.base.eval()
        total = torch.zeros(S, dtype=torch.float64, device=device)
        with autocast(device), _attention_backend(device):
            for i in range(0, len(val_x), VAL_CHUNK):
                interrupt.check()
                x, y = val_x[i:i + VAL_CHUNK], val_y[i:i + VAL_CHUNK]  # (k, B, T)
                total += self.val_loss(self.params, x.flatten(0, 1),
                                       y.flatten(0, 1)).double() * len(x)
        self.base.train()
        return (total / len(val_x)).tolist()

    def lr(self) -> float:
        """The scheduler's last learning rate (one schedule for all seeds)."""
        return self.sched.get_last_lr()[0]

    def _sync_models(self) -> None:
        """Copy the stacked weights into the per-seed GPTs (for their state dicts)."""
        with torch.no_grad():
            for s, model in enumerate(self.seed_models):
                for name, p in model.named_parameters():
                    p.copy_(self.params[name][s])

    def snapshot(self) -> Callable[[int], dict]:
        """The per-seed GPTs synced with the stacked weights; seed s's state takes its slice of
        the stacked optimizer state (cloned when asked for)."""
        self._sync_models()
        opt_state, sched_state = self.opt.state_dict(), self.sched.state_dict()
        return lambda s: {"model": self.seed_models[s].state_dict(),
                          "optimizer": _seed_optimizer_state(opt_state, s),
                          "scheduler": sched_state, "rng_train": self.g_train[s].get_state()}

    def models(self) -> list[GPT]:
        """The per-seed GPTs synced with the stacked weights."""
        self._sync_models()
        return list(self.seed_models)

    def finish(self) -> list[tuple[GPT, torch.optim.Optimizer]]:
        """Per seed: its GPT with the stacked weights and its slice of the last step's
        gradients, and a single-seed AdamW holding its slice of the optimizer state."""
        self._sync_models()
        opt_state = self.opt.state_dict()
        out = []
        for s, model in enumerate(self.seed_models):
            for name, p in model.named_parameters():  # the last step's gradients, as train_model
                grad = self.params[name].grad
                p.grad = None if grad is None else grad[s].clone()
            seed_opt = make_optimizer(model, self.cfg, self.lr_peak, self.device)
            seed_opt.load_state_dict(_seed_optimizer_state(opt_state, s))
            out.append((model, seed_opt))
        return out


def _train_group(model_cfg: ModelConfig, cfg: TrainConfig, data: TokenData, *, seeds: list[int],
                 lr: float, steps: int, device: torch.device, trackers: list, desc: str,
                 resume_paths: list, fingerprints: list[str], resume_meta: list[dict],
                 states: list[dict | None], cuda_graph: bool | None = None,
                 probe: Callable[[GPT], dict[str, float]] | None = None) -> list[TrainResult]:
    """:func:`train_seeds` for seeds whose ``states`` (all None, or all at one step) agree:
    :func:`lmablate.train.loop.train_loop` driving a :class:`GroupStepper`."""
    graphed = uses_cuda_graph(device) if cuda_graph is None else cuda_graph
    stepper = GroupStepper(model_cfg, cfg, data, seeds=seeds, lr=lr, steps=steps, device=device,
                           states=states, graphed=graphed)
    return train_loop(stepper, steps=steps, eval_interval=cfg.eval_interval,
                      tokens_per_step=cfg.batch_size * model_cfg.context_length, lr=lr,
                      states=states, trackers=trackers, desc=desc, resume_paths=resume_paths,
                      fingerprints=fingerprints, resume_meta=resume_meta, probe=probe)


def _graphed(forward_backward, static_input: torch.Tensor, opt: torch.optim.Optimizer,
             device: torch.device):
    """``forward_backward`` captured once as a CUDA graph (PyTorch's "partial-network capture":
    forward, backward and clipping in the graph, the optimizer step outside it). Returns a
    function of the step's input that copies it into ``static_input``, replays the graph and
    returns its static losses (overwritten by the next replay). The gradients live in the
    graph's memory from then on: nothing may set them to None.

    Three warm-up passes on a side stream come first, as torch.cuda.graph requires (cuBLAS and
    autograd set themselves up there, outside the capture); they take no optimizer step, so
    they change no weight or state."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            forward_backward(static_input)
    torch.cuda.current_stream(device).wait_stream(side)
    opt.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_losses = forward_backward(static_input)

    def step(batch_starts_: torch.Tensor) -> torch.Tensor:
        static_input.copy_(batch_starts_)
        graph.replay()
        return static_losses

    step.graph = graph  # type: ignore[attr-defined]  # kept alive with the function
    return step
