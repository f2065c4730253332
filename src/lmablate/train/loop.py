"""The training loop around the step, for one seed or a stacked group of seeds.

:func:`train_loop` owns everything but the optimizer step: the schedule of evaluations (every
``eval_interval`` steps and at the last step), the divergence checks, the history rows, the
tracker's metrics, the progress bar, resuming from and saving resume states, and the results
with their gradient statistics. The step is a :class:`Stepper`'s:
:class:`lmablate.train.training.SeedStepper` (one GPT, one AdamW, one loss read per step) or
:class:`lmablate.train.batched.GroupStepper` (S seeds' parameters stacked, the forward vmapped, on
CUDA forward + backward replayed as a CUDA graph). Losses are mean cross-entropy in nats per token.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

import numpy as np
import torch

from lmablate.core import interrupt
from lmablate.core.progress import progress
from lmablate.core.tracker import RunTracker
from lmablate.model.gpt import GPT
from lmablate.train.checkpoint import save_resume


class DivergenceError(RuntimeError):
    """The training loss became NaN or infinite."""


@dataclass
class TrainResult:
    """What one training run produced. Losses in nats/char, times in seconds."""

    model: GPT
    optimizer: torch.optim.Optimizer
    history: list[dict] = field(default_factory=list)
    val_loss: float = math.nan
    # the tuning objective at the last evaluation: the probe's answer loss on an arithmetic
    # run (lmablate.evaluate.answer_probe), the validation loss otherwise
    objective: float = math.nan
    train_seconds: float = 0.0
    tokens_per_second: float = 0.0
    grad_stats: list[dict] = field(default_factory=list)


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


def objective(row: dict) -> float:
    """The tuning objective of a history row: its ``val_answer_loss`` where the run was
    probed (an arithmetic run: the answer alone, nats per answer character), else its
    ``val_loss`` (nats/char)."""
    answer = row.get("val_answer_loss")
    return float(answer) if answer is not None else float(row["val_loss"])


class Stepper(Protocol):
    """The optimizer steps of S seeds (S = 1 for one seed), as :func:`train_loop` drives them.

    A stepper is built with its seeds' resume states applied (weights, optimizer, scheduler,
    batch generators), so its next step is the step after the states'.
    """

    seeds: list[int]
    names_seeds: bool  # whether divergence errors name the seed (a group's do)

    def begin_segment(self, first: int, last: int) -> None:
        """Steps ``first`` to ``last`` (1-based, inclusive) come next, the last of them an
        evaluation step: a stepper may draw their batches ahead."""

    def step(self, step: int) -> list[float] | None:
        """One optimizer step (and scheduler step) of every seed; returns the seeds' training
        losses (S floats) if it read them, None if they wait for :meth:`segment_losses`."""

    def segment_losses(self) -> list[list[float]]:
        """The training losses of the segment's steps, (steps in the segment, S) nested lists;
        called once, after the segment's last step."""

    def evaluate(self) -> list[float]:
        """Each seed's mean validation loss (S floats) over its fixed validation batches.

        Raises:
            Interrupted: the stage was asked to stop.
        """

    def lr(self) -> float:
        """The learning rate after the last scheduler step (the same for every seed)."""

    def snapshot(self) -> Callable[[int], dict]:
        """The seeds' training state now: a function of seed index s (0 to S - 1) giving seed
        s's ``model``, ``optimizer``, ``scheduler`` and ``rng_train`` entries of a resume state,
        in the single-seed layout."""

    def models(self) -> list[GPT]:
        """Each seed's GPT with its weights now (for a probe at an evaluation)."""

    def finish(self) -> list[tuple[GPT, torch.optim.Optimizer]]:
        """Each seed's GPT (holding the last step's gradients) and its single-seed optimizer."""


def train_loop(stepper: Stepper, *, steps: int, eval_interval: int, tokens_per_step: int,
               lr: float, states: list[dict | None], trackers: list[RunTracker], desc: str,
               resume_paths: list[Path | None], fingerprints: list[str],
               resume_meta: list[dict | None],
               on_eval: Callable[[int, list[float]], None] | None = None,
               probe: Callable[[GPT], dict[str, float]] | None = None) -> list[TrainResult]:
    """Run ``stepper`` to step ``steps`` and return one :class:`TrainResult` per seed, in
    ``stepper.seeds``' order. Every per-seed list has one entry per seed.

    ``states[s]`` is seed s's loaded resume state or None (all None, or all at one step: the
    stepper has applied them); the run continues after their step with their history rows and
    training times. At every ``eval_interval``-th step and at the last one: the segment's
    losses are checked, each seed's validation loss estimated, a history row appended
    (``tokens`` = step * ``tokens_per_step``; ``elapsed_seconds`` wall time since the run's
    start, counting the resumed run's), ``train_loss``, ``val_loss`` and ``lr`` logged to
    ``trackers[s]``, the resume state saved to ``resume_paths[s]`` (if not None, tagged
    ``fingerprints[s]`` with ``resume_meta[s]``), then ``on_eval(step, objectives)`` called
    (it may raise to stop, as Optuna's pruning does). ``probe`` (an arithmetic run's
    :class:`lmablate.evaluate.answer_probe.AnswerProbe`) scores each seed's model at every
    evaluation; its metrics join the history row and the tracker's, and its answer loss is the
    seed's objective (:func:`objective`), else the validation loss is. ``train_seconds`` counts the
    time from the end of one evaluation to the end of the next segment's last step.

    Raises:
        DivergenceError: a seed's training loss is NaN/inf (names the step and ``lr``, and the
            seed if ``stepper.names_seeds``, whose ``seed`` attribute it sets then); raised as
            soon as the stepper reads the loss, at the latest at the next evaluation, before
            that evaluation is recorded.
        Interrupted: the stage was asked to stop (:mod:`lmablate.core.interrupt`, checked
            before every step and by the evaluation); the states saved at the last evaluation stay.
    """
    seeds = stepper.seeds
    histories = [list(s["history"]) if s else [] for s in states]
    train_time = [s["train_time"] if s else 0.0 for s in states]
    first = states[0]["step"] + 1 if states[0] is not None else 1
    now = time.perf_counter()
    starts = [now - (h[-1]["elapsed_seconds"] if h else 0.0) for h in histories]

    def check(values: list[float], step: int) -> None:
        for s, value in enumerate(values):
            if not math.isfinite(value):
                who = f"{desc}, seed {seeds[s]}" if stepper.names_seeds else desc
                err = DivergenceError(f"{who}: training loss is {value} at step {step} "
                                      f"(lr={lr:g}); lower the learning rate")
                if stepper.names_seeds:
                    err.seed = seeds[s]  # type: ignore[attr-defined]
                raise err

    ei = eval_interval
    bar = progress(range(first, steps + 1), desc=desc, initial=first - 1, total=steps)
    segment_start = time.perf_counter()
    for step in bar:
        interrupt.check()  # a flag read on the host: no wait for the device
        if step == first or (step - 1) % ei == 0:  # a segment: up to the next evaluation
            seg_first, seg_last = step, min(steps, -(-step // ei) * ei)
            stepper.begin_segment(seg_first, seg_last)
        read = stepper.step(step)
        if read is not None:
            check(read, step)
        if step != seg_last:
            continue
        values = stepper.segment_losses()
        elapsed = time.perf_counter() - segment_start
        train_time = [t + elapsed for t in train_time]
        for i, row in enumerate(values):
            check(row, seg_first + i)
        val_losses = stepper.evaluate()
        probed = ([probe(m) for m in stepper.models()] if probe is not None
                  else [{} for _ in seeds])
        lr_now = stepper.lr()
        snapshot = stepper.snapshot() if any(p is not None for p in resume_paths) else None
        for s, seed in enumerate(seeds):
            row = {"seed": seed, "step": step, "tokens": step * tokens_per_step,
                   "train_loss": float(np.mean([v[s] for v in values])),
                   "val_loss": val_losses[s], **probed[s],
                   "lr": lr_now, "elapsed_seconds": time.perf_counter() - starts[s]}
            histories[s].append(row)
            trackers[s].log_metrics({k: row[k] for k in ("train_loss", "val_loss", *probed[s],
                                                         "lr")}, step=step)
            if resume_paths[s] is not None:
                save_resume(resume_paths[s], {
                    "fingerprint": fingerprints[s], "step": step, **snapshot(s),
                    "rng_global": torch.get_rng_state(), "history": histories[s],
                    "train_time": train_time[s], "meta": resume_meta[s] or {}})
        bar.set_postfix(val_loss=f"{min(val_losses):.3f}", refresh=False)
        if on_eval is not None:
            on_eval(step, [objective(h[-1]) for h in histories])
        segment_start = time.perf_counter()
    bar.close()

    results = []
    for s, (model, optimizer) in enumerate(stepper.finish()):
        results.append(TrainResult(
            model=model, optimizer=optimizer, history=histories[s],
            val_loss=histories[s][-1]["val_loss"], objective=objective(histories[s][-1]),
            train_seconds=train_time[s],
            tokens_per_second=steps * tokens_per_step / max(train_time[s], 1e-9),
            grad_stats=gradient_stats(model)))
    return results
