"""Training one seed: AdamW with warm-up and cosine decay, one optimizer step at a time.

:func:`train_model` trains one GPT on one seed and is shared by the ``tune`` objective and the
``train`` stage: :func:`lmablate.train.loop.train_loop` (evaluations, divergence checks, logging,
resume states) driving a :class:`SeedStepper`, whose step is :func:`train_step`, public so that
the benchmarks time the real code. The same seed gives every variant the same initialisation
seed and the same batch order, so comparisons across variants are paired. Losses are mean
cross-entropy in nats per token.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Callable

import torch
from torch.optim import optimizer as torch_optimizer

from lmablate.config.study import ModelConfig, TrainConfig
from lmablate.core import interrupt
from lmablate.core.tracker import NullTracker, RunTracker
from lmablate.data.token_data import TokenData, get_batch
from lmablate.model.gpt import GLOBAL_RNG_LOCK, GPT
from lmablate.train.checkpoint import load_resume
from lmablate.train.device import autocast
from lmablate.train.loop import DivergenceError, TrainResult, gradient_stats, train_loop

# DivergenceError, TrainResult and gradient_stats live in lmablate.train.loop (the loop raises and
# returns them) and are importable from here as well.
__all__ = ["DivergenceError", "GRAD_STATS_COLUMNS", "HISTORY_COLUMNS", "SeedStepper",
           "TrainResult", "VAL_BATCH_SEED", "decayed_parameter_names", "estimate_loss",
           "gradient_stats", "make_optimizer", "make_scheduler", "train_model", "train_step",
           "without_dynamo"]

# val_answer_loss and val_exact_match: the answer probe of an arithmetic run (empty otherwise)
HISTORY_COLUMNS = ("seed", "step", "tokens", "train_loss", "val_loss", "val_answer_loss",
                   "val_exact_match", "lr", "elapsed_seconds")
GRAD_STATS_COLUMNS = ("seed", "group", "frac_near_zero", "grad_norm")
# Data for val-loss estimates is drawn from its own generator so that every variant and every
# eval point sees the same validation batches (less noise in comparisons and in pruning).
VAL_BATCH_SEED = 2**31 - 1


def decayed_parameter_names(model: torch.nn.Module) -> set[str]:
    """Names (as in ``model.named_parameters()``) of the parameters AdamW decays: the weight
    matrices of ``nn.Linear`` layers, and nothing else.

    As minGPT's ``configure_optimizers`` (and nanoGPT's first version of it) does: biases, norm
    gains, token embeddings and a learned position table are not decayed. Decaying embeddings
    would tax the learned-position baseline alone, since RoPE, ALiBi and NoPE have no position
    parameters. A Linear weight tied to an embedding (``tie_weights``) is an embedding and is not
    decayed either (minGPT removes ``lm_head.weight`` from the decay set in that case).
    """
    linear = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    embedding = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    return {name for name, p in model.named_parameters()
            if id(p) in linear and id(p) not in embedding}


def make_optimizer(model: GPT, cfg: TrainConfig, lr: float, device: torch.device) -> torch.optim.AdamW:
    """AdamW (Loshchilov & Hutter 2019); weight decay ``cfg.weight_decay`` on the weight matrices
    of Linear layers only (:func:`decayed_parameter_names`), none on embeddings, biases and
    gains. PyTorch's fused kernel on CUDA and CPU (one kernel for all parameters: ~0.5 ms
    instead of ~1.3 ms per step at the default size on one core), the for-each one elsewhere."""
    names = decayed_parameter_names(model)
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [{"params": [p for n, p in params if n in names], "weight_decay": cfg.weight_decay},
              {"params": [p for n, p in params if n not in names], "weight_decay": 0.0}]
    return without_dynamo(torch.optim.AdamW, groups, lr=lr, betas=(cfg.beta1, cfg.beta2),
                          fused=device.type in ("cuda", "cpu"))


# torch.optim imports torch._dynamo (1.2 s, a quarter of a tune or train stage's start-up)
# although nothing here compiles: Optimizer.add_param_group, zero_grad, state_dict,
# load_state_dict and the functional adam() are wrapped in torch._disable_dynamo, which imports
# torch._dynamo on the first call, and Optimizer.step in _use_grad_for_differentiable, which
# imports it to call graph_break(). Outside torch.compile both wrappers do nothing (disable()
# switches off a frame evaluator that is not installed; graph_break() is a no-op), and nothing
# can be compiling while torch._dynamo has not been imported. So until something imports it, the
# wrapped functions are called directly: same kernels, same arguments, bitwise the same results
# (tests/test_imports.py). Once torch._dynamo is imported, torch's own wrappers run again. A
# torch whose wrappers look different is left alone (then it only costs the import).
_DISABLE_DYNAMO_CODE = torch._disable_dynamo(lambda: None).__code__
_USE_GRAD_CODE = torch_optimizer._use_grad_for_differentiable(lambda: None).__code__


def _closure(fn: types.FunctionType) -> dict:
    """The free variables of a closure, by name."""
    return dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__ or ())))


class _EagerUnlessDynamo:
    """Stands in for ``torch._dynamo.disable(fn)`` in the cache that torch._disable_dynamo's
    wrapper reads (``fn.__dynamo_disable``): calls ``fn`` directly while torch._dynamo is not
    imported, and from then on the real ``disable(fn)``."""

    def __init__(self, fn: Callable, recursive: bool):
        self.fn, self.recursive = fn, recursive

    def __call__(self, *args, **kwargs):
        if "torch._dynamo" not in sys.modules:
            return self.fn(*args, **kwargs)
        import torch._dynamo

        real = torch._dynamo.disable(self.fn, self.recursive, wrapping=False)
        setattr(self.fn, "__dynamo_disable", real)
        return real(*args, **kwargs)


def without_dynamo(cls: type[torch.optim.Optimizer], *args, **kwargs) -> torch.optim.Optimizer:
    """``cls(*args, **kwargs)``, made not to import torch._dynamo until something else does
    (see above)."""
    if "torch._dynamo" in sys.modules:
        return cls(*args, **kwargs)
    owners = [c for c in cls.__mro__ if c is not object]
    for owner in owners + [sys.modules[c.__module__] for c in owners]:
        for value in list(vars(owner).values()):
            if not isinstance(value, types.FunctionType):
                continue
            for f in [value, *_closure(value).values()]:  # adam() holds its wrapper in a closure
                if isinstance(f, types.FunctionType) and f.__code__ is _DISABLE_DYNAMO_CODE:
                    wrapped = _closure(f)
                    if "__dynamo_disable" not in vars(wrapped["fn"]):
                        setattr(wrapped["fn"], "__dynamo_disable",
                                _EagerUnlessDynamo(wrapped["fn"], wrapped["recursive"]))
    opt = cls(*args, **kwargs)
    hooked = type(opt).step  # profile_hook_step(_use_grad_for_differentiable(step))
    use_grad = getattr(hooked, "__wrapped__", None)
    raw = getattr(use_grad, "__wrapped__", None)
    if getattr(use_grad, "__code__", None) is not _USE_GRAD_CODE or raw is None:
        return opt

    def step(self, closure=None):
        # profile_hook_step and _use_grad without graph_break(); with hooks, or once
        # torch._dynamo is imported, torch's own step.
        if ("torch._dynamo" in sys.modules or self._optimizer_step_pre_hooks
                or self._optimizer_step_post_hooks or torch_optimizer._global_optimizer_pre_hooks
                or torch_optimizer._global_optimizer_post_hooks):
            return hooked(self, closure)
        with torch.autograd.profiler.record_function(
                f"Optimizer.step#{type(self).__name__}.step"):
            with torch.set_grad_enabled(self.defaults["differentiable"]):
                out = raw(self, closure)
            self._optimizer_step_code()
        return out

    opt.step = types.MethodType(step, opt)
    return opt


def make_scheduler(opt: torch.optim.Optimizer, cfg: TrainConfig, steps: int):
    """Linear warm-up over ``cfg.warmup_steps(steps)`` steps (``warmup_fraction`` of the run),
    then constant or cosine decay to 10% of the peak over the remaining steps (Loshchilov &
    Hutter 2017, SGDR eq. 5 without restarts). As the warm-up is a share of the run, a short
    tuning trial and a full run follow the same schedule, stretched."""
    warmup = cfg.warmup_steps(steps)
    after = (torch.optim.lr_scheduler.CosineAnnealingLR(
        opt, T_max=max(1, steps - warmup), eta_min=0.1 * opt.param_groups[0]["lr"])
        if cfg.lr_schedule == "cosine" else torch.optim.lr_scheduler.ConstantLR(opt, factor=1.0))
    if warmup == 0:
        return after
    ramp = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1e-3, total_iters=warmup)
    return torch.optim.lr_scheduler.SequentialLR(opt, [ramp, after], milestones=[warmup])


def train_step(model: GPT, optimizer: torch.optim.Optimizer, scheduler, x: torch.Tensor,
               y: torch.Tensor, *, grad_clip: float, device: torch.device) -> float:
    """One optimizer step on inputs ``x`` (B, T) and targets ``y`` (B, T); returns the batch's
    mean cross-entropy in nats/char as a float (one device sync per step, which the
    divergence check needs anyway). ``grad_clip`` 0 disables clipping; ``scheduler`` may be
    None."""
    with autocast(device):
        _, loss = model(x, y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return loss.item()


@torch.no_grad()
def estimate_loss(model: GPT, batches: list[tuple[torch.Tensor, torch.Tensor]],
                  device: torch.device) -> float:
    """Mean cross-entropy (nats/char) over fixed ``batches``.

    Raises:
        Interrupted: the stage was asked to stop (checked before every batch).
    """
    model.eval()
    losses = []
    with autocast(device):
        for x, y in batches:
            interrupt.check()
            losses.append(model(x, y)[1])
    model.train()
    return torch.stack(losses).float().mean().item()


class SeedStepper:
    """The :class:`~lmablate.train.loop.Stepper` of one seed: one GPT, AdamW and schedule, one
    :func:`train_step` at a time, its loss read at every step (S = 1).

    ``seed`` fixes initialisation (under :data:`~lmablate.model.gpt.GLOBAL_RNG_LOCK`) and the
    training batch order; ``state`` (a resume state of ``train_model``'s layout, or None) is
    applied: weights, optimizer, scheduler, batch generator and the process-wide RNG
    (dropout's).
    """

    names_seeds = False

    def __init__(self, model_cfg: ModelConfig, cfg: TrainConfig, data: TokenData, *, seed: int,
                 lr: float, steps: int, device: torch.device, state: dict | None):
        with GLOBAL_RNG_LOCK:
            torch.manual_seed(seed)
            self.model = GPT(model_cfg).to(device)
        self.seeds, self.cfg, self.data, self.device = [seed], cfg, data, device
        self.opt = make_optimizer(self.model, cfg, lr, device)
        self.sched = make_scheduler(self.opt, cfg, steps)
        self.g_train = torch.Generator().manual_seed(seed)
        g_val = torch.Generator().manual_seed(VAL_BATCH_SEED)
        self.T, self.B = model_cfg.context_length, cfg.batch_size
        self.val_batches = [get_batch(data.val, self.B, self.T, g_val, device, data.stride)
                            for _ in range(cfg.eval_iters)]
        self.running: list[float] = []
        if state is not None:
            self.model.load_state_dict(state["model"])
            self.opt.load_state_dict(state["optimizer"])
            self.sched.load_state_dict(state["scheduler"])
            self.g_train.set_state(state["rng_train"])
            # dropout's RNG (dropout runs in processes, lmablate.execution.parallel)
            with GLOBAL_RNG_LOCK:
                torch.set_rng_state(state["rng_global"])

    def begin_segment(self, first: int, last: int) -> None:
        """Nothing to draw ahead: each step draws its batch."""

    def step(self, step: int) -> list[float]:
        """One :func:`train_step` on the next training batch; returns [its loss]."""
        x, y = get_batch(self.data.train, self.B, self.T, self.g_train, self.device,
                         self.data.stride)
        loss = train_step(self.model, self.opt, self.sched, x, y, grad_clip=self.cfg.grad_clip,
                          device=self.device)
        self.running.append(loss)
        return [loss]

    def segment_losses(self) -> list[list[float]]:
        """The segment's losses, one [loss] per step; starts the next segment's list."""
        values, self.running = [[v] for v in self.running], []
        return values

    def evaluate(self) -> list[float]:
        """[:func:`estimate_loss` over the fixed validation batches]."""
        return [estimate_loss(self.model, self.val_batches, self.device)]

    def lr(self) -> float:
        """The scheduler's last learning rate."""
        return self.sched.get_last_lr()[0]

    def snapshot(self) -> Callable[[int], dict]:
        """The model's, optimizer's, scheduler's and batch generator's states (seed index 0)."""
        return lambda s: {"model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
                          "scheduler": self.sched.state_dict(),
                          "rng_train": self.g_train.get_state()}

    def models(self) -> list[GPT]:
        """[the model]."""
        return [self.model]

    def finish(self) -> list[tuple[GPT, torch.optim.Optimizer]]:
        """[(the model, its optimizer)]."""
        return [(self.model, self.opt)]


def train_model(model_cfg: ModelConfig, cfg: TrainConfig, data: TokenData, *, seed: int,
                lr: float, steps: int, device: torch.device,
                on_eval: Callable[[int, float], None] | None = None,
                tracker: RunTracker | None = None, desc: str = "train",
                resume_path: Path | None = None, fingerprint: str = "",
                resume_meta: dict | None = None,
                probe: Callable[[GPT], dict[str, float]] | None = None) -> TrainResult:
    """Train a GPT for ``steps`` optimizer steps and return it with its loss history.

    ``seed`` fixes initialisation and the training batch order (paired across variants).
    ``on_eval(step, objective)`` is called at every eval interval and may raise to stop (Optuna
    pruning); the objective is the validation loss, or with ``probe`` (an arithmetic run's
    :class:`lmablate.evaluate.answer_probe.AnswerProbe`) its answer loss, and the probe's metrics
    join the history. Metrics are logged to ``tracker`` at every eval interval, indexed by step.

    With ``resume_path``, the full training state (model, optimizer, scheduler, RNG states,
    step, history, ``resume_meta``) is saved there atomically at every eval interval, and a
    state saved with the same ``fingerprint`` is resumed: the run then ends with the same
    weights and metrics as an uninterrupted one. The loop is :func:`lmablate.train.loop.train_loop`
    over a :class:`SeedStepper`.

    Raises:
        DivergenceError: the training loss is NaN/inf (names the step).
        Interrupted: the stage was asked to stop (:mod:`lmablate.core.interrupt`, checked
            before every step and evaluation batch); the last state saved at an eval interval stays.
    """
    state = load_resume(resume_path, fingerprint)
    stepper = SeedStepper(model_cfg, cfg, data, seed=seed, lr=lr, steps=steps, device=device,
                          state=state)
    (result,) = train_loop(
        stepper, steps=steps, eval_interval=cfg.eval_interval,
        tokens_per_step=cfg.batch_size * model_cfg.context_length, lr=lr, states=[state],
        trackers=[tracker or NullTracker()], desc=desc, resume_paths=[resume_path],
        fingerprints=[fingerprint], resume_meta=[resume_meta],
        on_eval=None if on_eval is None else lambda step, losses: on_eval(step, losses[0]),
        probe=probe)
    return result

