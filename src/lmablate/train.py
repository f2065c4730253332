"""Stage ``train``: AdamW training of one dataset x variant on every seed of the study.

The same seed index gives every variant the same data order and the same initialisation seed, so
comparisons across variants are paired. Losses are mean cross-entropy in nats per token.
"""

from __future__ import annotations

import csv
import hashlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from tqdm.auto import tqdm

from . import fileio
from .config import ModelConfig, StudyConfig, TrainConfig
from .model import (GLOBAL_RNG_LOCK, GPT, check_causality, count_params, flops_per_token,
                    match_ffn_hidden)
from .tokenizer import load_split, load_tokenizer
from .tracking import NullTracker

HISTORY_COLUMNS = ("seed", "step", "tokens", "train_loss", "val_loss", "lr", "elapsed_seconds")
# Data for val-loss estimates is drawn from its own generator so that every variant and every
# eval point sees the same validation batches (less noise in comparisons and in pruning).
VAL_BATCH_SEED = 2**31 - 1


class DivergenceError(RuntimeError):
    """The training loss became NaN or infinite."""


@dataclass
class TokenData:
    """Token id arrays (1-D, uint8/uint16, memory-mapped) of one dataset's splits."""

    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    vocab_size: int

    tokens_dir: Path | None = None

    @classmethod
    def load(cls, tokens_dir: Path) -> "TokenData":
        tok = load_tokenizer(tokens_dir)
        return cls(*(load_split(tokens_dir, s) for s in ("train", "val", "test")),
                   vocab_size=tok.vocab_size, tokens_dir=Path(tokens_dir))

    def fingerprint(self) -> str:
        """Hash of the training and validation tokens (ties resume states to their data)."""
        h = hashlib.sha256()
        for split in (self.train, self.val):
            h.update(np.ascontiguousarray(split).tobytes())
        return h.hexdigest()[:16]

    def check_fits(self, context_length: int, what: str) -> None:
        """Raise ValueError unless every split holds at least one window of context_length+1."""
        for split in ("train", "val", "test"):
            n = len(getattr(self, split))
            if n < context_length + 1:
                raise ValueError(
                    f"{what}: the {split} split has {n} tokens, fewer than context_length + 1 = "
                    f"{context_length + 1}; enlarge the dataset or its split fraction, or shrink "
                    "model.context_length")


def get_batch(data: np.ndarray, batch_size: int, context_length: int,
              generator: torch.Generator, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample ``batch_size`` random windows: inputs (B, T) and next-token targets (B, T), int64."""
    starts = torch.randint(len(data) - context_length, (batch_size,), generator=generator).numpy()
    windows = data[starts[:, None] + np.arange(context_length + 1)]  # (B, T+1), one gather
    windows = torch.from_numpy(windows.astype(np.int64))
    x, y = windows[:, :-1], windows[:, 1:]
    if device.type == "cuda":
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)


def resolve_device(name: str) -> torch.device:
    """``auto`` -> CUDA if available, else Apple MPS, else CPU."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    return torch.device(name)


def autocast(device: torch.device):
    """bf16 autocast on CUDA; full fp32 elsewhere."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def make_optimizer(model: GPT, cfg: TrainConfig, lr: float, device: torch.device) -> torch.optim.AdamW:
    """AdamW (Loshchilov & Hutter 2019); weight decay on matrices only, not on gains/biases.
    PyTorch's fused kernel on CUDA and CPU (one kernel for all parameters: ~0.5 ms instead of
    ~1.3 ms per step at the default size on one core), the for-each one elsewhere."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(cfg.beta1, cfg.beta2),
                             fused=device.type in ("cuda", "cpu"))


def make_scheduler(opt: torch.optim.Optimizer, cfg: TrainConfig, steps: int):
    """Linear warmup over ``warmup_steps``, then constant or cosine decay to 10% of the peak."""
    after = (torch.optim.lr_scheduler.CosineAnnealingLR(
        opt, T_max=max(1, steps - cfg.warmup_steps), eta_min=0.1 * opt.param_groups[0]["lr"])
        if cfg.lr_schedule == "cosine" else torch.optim.lr_scheduler.ConstantLR(opt, factor=1.0))
    if cfg.warmup_steps == 0:
        return after
    warmup = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1e-3, total_iters=cfg.warmup_steps)
    return torch.optim.lr_scheduler.SequentialLR(opt, [warmup, after], milestones=[cfg.warmup_steps])


@torch.no_grad()
def estimate_loss(model: GPT, batches: list[tuple[torch.Tensor, torch.Tensor]],
                  device: torch.device) -> float:
    """Mean cross-entropy (nats/token) over fixed ``batches``."""
    model.eval()
    with autocast(device):
        losses = [model(x, y)[1] for x, y in batches]
    model.train()
    return torch.stack(losses).float().mean().item()


@dataclass
class TrainResult:
    """What one training run produced. Losses in nats/token, times in seconds."""

    model: GPT
    optimizer: torch.optim.Optimizer
    history: list[dict] = field(default_factory=list)
    val_loss: float = math.nan
    train_seconds: float = 0.0
    tokens_per_second: float = 0.0
    grad_stats: list[dict] = field(default_factory=list)


def code_version() -> str:
    """Hash of the sources that define a training run (model and training loop): a resume state
    written by other code is not resumed."""
    h = hashlib.sha256()
    for name in ("model.py", "train.py"):
        h.update((Path(__file__).with_name(name)).read_bytes())
    return h.hexdigest()[:16]


def load_resume(path: Path | None, fingerprint: str) -> dict | None:
    """The resume state at ``path`` if it exists and was written for ``fingerprint``."""
    if path is None or not path.exists():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception:  # noqa: BLE001 - an unreadable state is ignored, training starts over
        return None
    return state if state.get("fingerprint") == fingerprint else None


def train_model(model_cfg: ModelConfig, cfg: TrainConfig, data: TokenData, *, seed: int,
                lr: float, steps: int, device: torch.device,
                on_eval: Callable[[int, float], None] | None = None,
                tracker: NullTracker | None = None, desc: str = "train",
                resume_path: Path | None = None, fingerprint: str = "",
                resume_meta: dict | None = None) -> TrainResult:
    """Train a GPT for ``steps`` optimizer steps and return it with its loss history.

    ``seed`` fixes initialisation and the training batch order (paired across variants).
    ``on_eval(step, val_loss)`` is called at every eval interval and may raise to stop (Optuna
    pruning). Metrics are logged to ``tracker`` at every eval interval, indexed by step.

    With ``resume_path``, the full training state (model, optimizer, scheduler, RNG states,
    step, history, ``resume_meta``) is saved there atomically at every eval interval, and a
    state saved with the same ``fingerprint`` is resumed: the run then ends with the same
    weights and metrics as an uninterrupted one.

    Raises:
        DivergenceError: the training loss is NaN/inf (names the step).
    """
    with GLOBAL_RNG_LOCK:
        torch.manual_seed(seed)
        model = GPT(model_cfg).to(device)
    opt = make_optimizer(model, cfg, lr, device)
    sched = make_scheduler(opt, cfg, steps)
    g_train = torch.Generator().manual_seed(seed)
    g_val = torch.Generator().manual_seed(VAL_BATCH_SEED)
    T, B = model_cfg.context_length, cfg.batch_size
    val_batches = [get_batch(data.val, B, T, g_val, device) for _ in range(cfg.eval_iters)]
    result = TrainResult(model=model, optimizer=opt)
    tracker = tracker or NullTracker()

    first, train_time, running = 1, 0.0, []
    state = load_resume(resume_path, fingerprint)
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        g_train.set_state(state["rng_train"])
        with GLOBAL_RNG_LOCK:  # dropout's RNG (dropout runs in processes, see lmablate.parallel)
            torch.set_rng_state(state["rng_global"])
        result.history, train_time, first = state["history"], state["train_time"], state["step"] + 1
    start = time.perf_counter() - (result.history[-1]["elapsed_seconds"] if result.history else 0)

    bar = tqdm(range(first, steps + 1), desc=desc, mininterval=2.0, leave=False,
               initial=first - 1, total=steps)
    for step in bar:
        t0 = time.perf_counter()
        x, y = get_batch(data.train, B, T, g_train, device)
        with autocast(device):
            _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        sched.step()
        loss_value = loss.item()  # one sync per step; needed for the divergence check anyway
        train_time += time.perf_counter() - t0
        if not math.isfinite(loss_value):
            raise DivergenceError(f"{desc}: training loss is {loss_value} at step {step} "
                                  f"(lr={lr:g}); lower the learning rate")
        running.append(loss_value)
        if step % cfg.eval_interval == 0 or step == steps:
            val_loss = estimate_loss(model, val_batches, device)
            row = {"seed": seed, "step": step, "tokens": step * B * T,
                   "train_loss": float(np.mean(running)), "val_loss": val_loss,
                   "lr": sched.get_last_lr()[0], "elapsed_seconds": time.perf_counter() - start}
            running = []
            result.history.append(row)
            tracker.log_metrics({k: row[k] for k in ("train_loss", "val_loss", "lr")}, step=step)
            bar.set_postfix(val_loss=f"{val_loss:.3f}")
            if resume_path is not None:
                state = {"fingerprint": fingerprint, "step": step, "model": model.state_dict(),
                         "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                         "rng_train": g_train.get_state(), "rng_global": torch.get_rng_state(),
                         "history": result.history, "train_time": train_time,
                         "meta": resume_meta or {}}
                with fileio.atomic_path(resume_path) as tmp:
                    torch.save(state, tmp)
            if on_eval is not None:
                on_eval(step, val_loss)
    bar.close()
    result.grad_stats = gradient_stats(model)
    result.val_loss = result.history[-1]["val_loss"]
    result.train_seconds = train_time
    result.tokens_per_second = steps * B * T / max(train_time, 1e-9)
    return result


def gradient_stats(model: GPT, eps: float = 1e-8) -> list[dict]:
    """Per parameter group (module prefix such as ``blocks.0.attn``): the fraction of gradient
    entries with |g| < eps and the gradient L2 norm, from the last backward pass (seed 002's
    gradient-flow check)."""
    groups: dict[str, list[torch.Tensor]] = {}
    for name, p in model.named_parameters():
        if p.grad is not None:
            groups.setdefault(name.rsplit(".", 1)[0], []).append(p.grad.detach().flatten().float())
    out = []
    for group, grads in groups.items():
        g = torch.cat(grads)
        out.append({"group": group, "frac_near_zero": (g.abs() < eps).float().mean().item(),
                    "grad_norm": g.norm().item()})
    return out


def resolve_model_config(cfg: StudyConfig, variant: str, vocab_size: int, d_model: int) -> ModelConfig:
    """The variant's model at width ``d_model``; with ``study.match_params`` its FFN hidden size
    is adjusted so its non-embedding parameter count is within 2% of the baseline's."""
    model_cfg = cfg.model_config(variant, vocab_size, d_model=d_model)
    if cfg.match_params:
        reference = cfg.model.replace(vocab_size=vocab_size, d_model=d_model)
        model_cfg = match_ffn_hidden(model_cfg, reference)
    return model_cfg


def preflight(model_cfg: ModelConfig, what: str) -> None:
    """Refuse to train a model that can see future tokens (the seeds' leaked-mask bug)."""
    try:
        check_causality(model_cfg)
    except ValueError as exc:
        raise ValueError(f"{what}: pre-flight causality check failed: {exc}") from None


def save_checkpoint(path: Path, result: TrainResult, model_cfg: ModelConfig, *, step: int,
                    meta: dict) -> None:
    """Save model config, weights, optimizer state and ``meta`` (atomically)."""
    state = {"model_config": model_cfg.to_dict(), "model": result.model.state_dict(),
             "optimizer": result.optimizer.state_dict(), "step": step, "meta": meta}
    with fileio.atomic_path(path) as tmp:
        torch.save(state, tmp)


def load_checkpoint(path: Path, device: torch.device | str = "cpu") -> tuple[GPT, dict]:
    """Rebuild the GPT saved by :func:`save_checkpoint`; returns (model in eval mode, checkpoint)."""
    ckpt = torch.load(path, map_location=device, weights_only=True)
    model = GPT(ModelConfig(**ckpt["model_config"])).to(device)
    model.load_state_dict(ckpt["model"])
    model.eval()
    return model, ckpt


def write_csv(path: Path, rows: list[dict], columns: tuple[str, ...]) -> None:
    with fileio.atomic_path(path) as tmp, tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


@dataclass(frozen=True)
class SeedJob:
    """One seed's training run, picklable for a worker process."""

    cfg: StudyConfig
    dataset: str
    variant: str
    model_cfg: ModelConfig
    lr: float
    seed: int
    tokens_dir: Path
    seed_dir: Path


def train_seed(job: SeedJob) -> dict:
    """Train one seed (in this or a worker process) and record it as one MLflow run tagged
    dataset/variant/seed/stage=train.

    Writes ``seed_dir/checkpoint.pt`` and ``seed_dir/result.json`` (``fingerprint``,
    ``summary``, ``history``, ``grad_stats``). A seed whose ``result.json`` has the current
    fingerprint is not trained again; an interrupted one resumes from ``seed_dir/resume.pt``.
    Returns the ``result.json`` content.
    """
    from .tracking import make_tracker

    cfg, seed = job.cfg, job.seed
    data = TokenData.load(job.tokens_dir)
    fingerprint = cfg.fingerprint(job.model_cfg, cfg.train, job.lr, seed, code_version(),
                                  data.fingerprint())
    result_path, resume_path = job.seed_dir / "result.json", job.seed_dir / "resume.pt"
    if result_path.exists() and (job.seed_dir / "checkpoint.pt").exists():
        done = fileio.read_json(result_path)
        if done.get("fingerprint") == fingerprint:
            return done
    tracker = make_tracker(cfg.tracking)
    device = resolve_device(cfg.train.device)
    n_params, n_non_emb = count_params(job.model_cfg)
    fpt = flops_per_token(job.model_cfg)
    tags = {"dataset": job.dataset, "variant": job.variant, "seed": seed, "stage": "train"}
    what = f"dataset {job.dataset}, variant {job.variant}, seed {seed}"
    resumed = load_resume(resume_path, fingerprint)
    run_id = resumed["meta"].get("mlflow_run_id") if resumed else None
    with tracker.run(f"{job.dataset}-{job.variant}-seed{seed}", tags, run_id=run_id) as run_id:
        if resumed is None:
            tracker.log_params({**job.model_cfg.to_dict(), "lr": job.lr,
                                "steps": cfg.train.steps, "batch_size": cfg.train.batch_size,
                                "seed": seed, "n_params": n_params,
                                "n_params_non_embedding": n_non_emb, "flops_per_token": fpt,
                                "device": device.type})
        try:
            result = train_model(job.model_cfg, cfg.train, data, seed=seed, lr=job.lr,
                                 steps=cfg.train.steps, device=device, tracker=tracker,
                                 desc=f"{job.dataset}/{job.variant}/seed {seed}",
                                 resume_path=resume_path, fingerprint=fingerprint,
                                 resume_meta={"mlflow_run_id": run_id})
        except DivergenceError as exc:
            raise DivergenceError(f"{what}: {exc}") from None
        summary = {"seed": seed, "lr": job.lr, "d_model": job.model_cfg.d_model,
                   "n_params": n_params, "n_params_non_embedding": n_non_emb,
                   "flops_per_token": fpt, "val_loss": result.val_loss,
                   "train_seconds": result.train_seconds,
                   "tokens_per_second": result.tokens_per_second,
                   "device": device.type, "mlflow_run_id": run_id}
        tracker.log_metrics({k: summary[k] for k in ("val_loss", "train_seconds",
                                                     "tokens_per_second")})
        save_checkpoint(job.seed_dir / "checkpoint.pt", result, job.model_cfg,
                        step=cfg.train.steps,
                        meta={"dataset": job.dataset, "variant": job.variant, "seed": seed})
        done = {"fingerprint": fingerprint, "summary": summary, "history": result.history,
                "grad_stats": [{"seed": seed, **g} for g in result.grad_stats]}
        fileio.write_json(result_path, done)
        resume_path.unlink(missing_ok=True)
        tracker.log_artifact(job.seed_dir / "checkpoint.pt", "checkpoint")
    return done


def run(cfg: StudyConfig, dataset: str, variant: str, tokens_dir: Path, best_path: Path,
        checkpoints_dir: Path, history_path: Path, grad_stats_path: Path) -> dict:
    """Train ``variant`` on ``dataset`` for every seed with the tuned lr and d_model.

    Seeds run concurrently on a CPU (threads or processes, see :mod:`lmablate.parallel`). Writes
    ``checkpoints_dir/seed_<s>/checkpoint.pt`` and ``result.json`` per seed (see
    :func:`train_seed`; interrupted seeds resume, finished ones are kept),
    ``history_path`` (CSV, columns :data:`HISTORY_COLUMNS`, a DVC plot) and ``grad_stats_path``
    (CSV: seed, group, frac_near_zero, grad_norm). Each seed is one MLflow run.

    Raises:
        ConfigError / ValueError: unknown dataset or variant, data too small for the context,
            the model fails the causality pre-flight. All raised before the first step.
        DivergenceError: a run's loss became NaN/inf (names dataset, variant, seed and step).
    """
    from .parallel import map_jobs, threads_per_worker, use_processes, worker_count

    cfg.dataset(dataset)
    best = fileio.read_json(best_path)
    data = TokenData.load(tokens_dir)
    model_cfg = resolve_model_config(cfg, variant, data.vocab_size, best["d_model"])
    data.check_fits(model_cfg.context_length, f"{dataset}")
    preflight(model_cfg, f"variant {variant!r}")
    jobs = [SeedJob(cfg, dataset, variant, model_cfg, best["lr"], seed, tokens_dir,
                    checkpoints_dir / f"seed_{seed}") for seed in cfg.seeds]
    workers = worker_count(cfg.train, len(jobs), resolve_device(cfg.train.device),
                           all_at_once=True)
    results = map_jobs(train_seed, jobs, workers, threads_per_worker(cfg.train, workers),
                       processes=use_processes(cfg.train, [model_cfg]))
    write_csv(history_path, [row for r in results for row in r["history"]], HISTORY_COLUMNS)
    write_csv(grad_stats_path, [row for r in results for row in r["grad_stats"]],
              ("seed", "group", "frac_near_zero", "grad_norm"))
    return {f"seed_{r['summary']['seed']}": r["summary"] for r in results}
